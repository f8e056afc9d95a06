"""The baseline's success body: its keys, their order and its constants, against
the candidate's. The same shape (keys, order, value types at every level): the
gateway keeps the upstream's body. Another: the policy's ``answer``, the baseline's
body as a template (its items, model, usage, id and created as slots; everything
else kept), and the gateway writes every answer in it."""

from __future__ import annotations

from typing import Any

import orjson

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.parity.json_shape import shape_difference

# The slots of the body, by the key the baseline writes them under.
_BODY_SLOTS = {"data": "{data}", "model": "{model}", "id": "{id}", "created": "{created}"}
_USAGE_SLOTS = {"prompt_tokens": "{prompt_tokens}", "total_tokens": "{total_tokens}"}
_ITEM_SLOTS = {"index": "{index}", "embedding": "{embedding}"}


def learn_answer(basics: Basics) -> tuple[dict[str, Any] | None, list[Finding]]:
    """(the policy's ``answer``, or None to keep the upstream's; findings)."""
    field = "answer"
    shown = [basics.plain, basics.plain_candidate]
    try:
        baseline = orjson.loads(basics.plain.body)
        candidate = orjson.loads(basics.plain_candidate.body)
    except orjson.JSONDecodeError:
        return None, [unknown(field, "an answer is not JSON", shown)]
    differ = shape_difference(baseline, candidate)
    if differ is None:
        summary = "the upstream's body has the baseline's keys, order and types"
        return None, [finding(field, None, "verified", summary, shown=shown)]
    layout = _layout(baseline)
    if layout is None:
        problem = f"the baseline's success body has no `data` array of items ({differ})"
        return None, [unknown(field, problem, shown)]
    summary = f"written in the baseline's layout (the upstream's differs at {differ})"
    return layout, [finding(field, layout, "measured", summary, shown=shown)]


def _layout(doc: Any) -> dict[str, Any] | None:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return None
    body: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _BODY_SLOTS:
            body[key] = _BODY_SLOTS[key]
        elif key == "usage" and isinstance(value, dict):
            body[key] = {k: _USAGE_SLOTS.get(k, v) for k, v in value.items()}
        else:
            body[key] = value
    item = {k: _ITEM_SLOTS.get(k, v) for k, v in data[0].items()}
    return {"body": body, "item": item}
