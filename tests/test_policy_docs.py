"""docs/policy.md documents every field of the policy's schema and every value of its
enums, read from the generated descriptor of protos/extproc/core/policy/v1/policy.proto.

The doc's convention: a field appears in backticks as its path from the file's root, a
list's entries as ``[]`` (``models[].leniency.integral_floats``, ``rerankers[].top_n``,
``errors.status.too_long``); an enum field's values appear, in backticks, on a line
that names the field. A message used in several places is described at its
shallowest (the file's ``errors``, the models' ``tokenizer``); the others name the
field itself (``rerankers[].errors``). A map is one field (``models[].prompts.extra``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor

from extproc.core.policy.v1 import policy_pb2 as pb
from testing_support.qwen import REPO

DOC = REPO / "docs" / "policy.md"
IN_BACKTICKS = re.compile(r"`([^`]+)`")
# What a path of the schema looks like in the doc, to find the ones that name no field.
SCHEMA_PATH = re.compile(r"(models\[\]|rerankers\[\]|limits|errors)(\.\w+)+")


def _shallowest(root: Descriptor) -> dict[str, str]:
    """Each message's shallowest path from the root (breadth first; the first at a
    depth): where the doc describes it."""
    where: dict[str, str] = {root.full_name: ""}
    level = [(root, "")]
    while level:
        below = []
        for message, prefix in level:
            for field in message.fields:
                kind = field.message_type
                if kind is None or kind.GetOptions().map_entry or kind.full_name in where:
                    continue
                path = prefix + field.name + ("[]" if field.is_repeated else "")
                where[kind.full_name] = path
                below.append((kind, path + "."))
        level = below
    return where


def schema_fields(
    message: Descriptor = pb.GatewayPolicy.DESCRIPTOR, prefix: str = ""
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(path, the names of its enum's values but the unset one) of every field the doc
    must name, in the schema's order."""
    shallowest = _shallowest(pb.GatewayPolicy.DESCRIPTOR)
    for field in message.fields:
        path = prefix + field.name
        kind = field.message_type
        # A JSON value (google.protobuf.Value: a template) is one field, not a message.
        well_known = kind is not None and kind.full_name.startswith("google.protobuf.")
        if kind is not None and not kind.GetOptions().map_entry:
            path += "[]" if field.is_repeated else ""
            if well_known or shallowest[kind.full_name] != path:
                yield path, ()
            else:
                yield from schema_fields(kind, path + ".")
            continue
        enum = field.enum_type
        yield path, tuple(v.name for v in enum.values if v.number) if enum else ()


FIELDS = dict(schema_fields())
DOC_LINES = DOC.read_text(encoding="utf-8").splitlines()
NAMED = {name for line in DOC_LINES for name in IN_BACKTICKS.findall(line)}


def test_the_schema_is_read_whole() -> None:
    """What the checks below walk: every level, lists, maps, enums, a message met twice."""
    assert {
        "models[].leniency.integral_floats",
        "models[].tokenizer.special_tokens.append_ids",
        "models[].prompts.extra",
        "errors.status.too_long",
        "limits.max_tokenize_ms",
        "rerankers[].top_n",
        "rerankers[].errors",
    } <= set(FIELDS)
    assert "rerankers[].errors.shape" not in FIELDS
    assert FIELDS["errors.shape"] == ("OPENAI", "FASTAPI", "FLAT", "TEI")
    assert FIELDS["models[].prompts.instruction"] == ("TASK", "PROMPT", "IGNORED", "REFUSED")


def test_every_field_is_documented() -> None:
    missing = [path for path in FIELDS if path not in NAMED]
    assert not missing, f"{DOC.name} does not name these policy fields: {', '.join(missing)}"


@pytest.mark.parametrize("path", [p for p, values in FIELDS.items() if values])
def test_every_enum_value_is_documented_with_its_field(path: str) -> None:
    lines = [line for line in DOC_LINES if f"`{path}`" in line]
    named = {name for line in lines for name in IN_BACKTICKS.findall(line)}
    missing = [value for value in FIELDS[path] if value not in named]
    assert not missing, f"{DOC.name}: no line naming `{path}` names {', '.join(missing)}"


def test_every_field_the_doc_names_is_in_the_schema() -> None:
    """A field gone from policy.proto leaves no row behind."""
    stale = sorted(name for name in NAMED if SCHEMA_PATH.fullmatch(name) and name not in FIELDS)
    assert not stale, f"{DOC.name} names fields the schema does not have: {', '.join(stale)}"
