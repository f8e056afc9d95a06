"""JSON templates: a body as a legacy server wrote it, its keys in its order and its
constants kept, with slots the gateway fills (pure).

A template is a JSON value. A string that is exactly a slot (``{name}``) becomes that
slot's value, of its own JSON type; a string holding a slot among other text gets the
slot's text in place; every other value is kept as it is. Error bodies
(:mod:`extproc.core.error_templates`) and success bodies
(:mod:`extproc.core.answer_layout`) are written so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

Template = Any  # a JSON value: dict, list, str, int, float, bool or None
# Deeper than any real body; bounds what a policy's template may make us build.
MAX_TEMPLATE_DEPTH: Final = 16


def fill(template: Template, values: Mapping[str, Any]) -> Any:
    """``template`` with each slot ``{name}`` of ``values`` filled: a string that is
    exactly a slot becomes its value, of its own JSON type; a slot among other text
    gets its text in place; anything else is kept."""
    slot = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            whole = slot.fullmatch(node)
            if whole is not None:
                return values[whole.group(1)]
            return slot.sub(lambda m: _text(values[m.group(1)]), node)
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(template)


def template_problem(template: Template, slots: tuple[str, ...]) -> str | None:
    """Why ``template`` is not one with these ``slots`` (a depth, an unknown slot, a
    non-JSON value)."""

    def check(node: Any, depth: int) -> str | None:
        if depth > MAX_TEMPLATE_DEPTH:
            return f"it nests deeper than {MAX_TEMPLATE_DEPTH} levels"
        if isinstance(node, str):
            for name in re.findall(r"\{([a-z_]+)\}", node):
                if name not in slots:
                    return f"{{{name}}} is not a slot (slots: {', '.join(slots)})"
            return None
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        elif node is None or isinstance(node, bool | int | float):
            return None
        else:
            return f"{type(node).__name__} is not a JSON value"
        return next((p for child in children if (p := check(child, depth + 1))), None)

    return check(template, 0)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ".".join(map(str, value))
    return str(value)
