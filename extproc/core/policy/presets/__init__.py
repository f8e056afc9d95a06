"""Model-family presets: one YAML file per family in this folder.

A family file holds `presets`, a mapping from preset name to a model entry in the
policy file's own schema (`ModelPolicy` without `name` or `preset`), and optionally
`common`, the fields all of the family's presets share (each preset is laid over
it). Every file is checked against the schema when the presets are first read. A
policy entry names a preset and overrides what differs (typically `max_tokens`, to
match the upstream's `--max-model-len`). Adding a model family is adding a file; the
package has no module but this one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from types import MappingProxyType
from typing import Any

import yaml
from google.protobuf import json_format

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.overlay import overlay
from extproc.core.policy.v1 import policy_pb2 as pb

FAMILY_SUFFIX = ".yaml"
_ENTRY_ONLY_FIELDS = ("name", "preset")  # what names a model, never a family's


@functools.cache
def presets() -> Mapping[str, pb.ModelPolicy]:
    """Every shipped preset by name (read once; PolicyError for a bad file)."""
    return load_presets(resources.files(__name__))


def load_presets(folder: Traversable) -> Mapping[str, pb.ModelPolicy]:
    """The presets of every family file in ``folder``; a name defined twice is an error."""
    found: dict[str, pb.ModelPolicy] = {}
    origin: dict[str, str] = {}
    families = sorted(
        (f for f in folder.iterdir() if f.name.endswith(FAMILY_SUFFIX)), key=lambda f: f.name
    )
    for family in families:
        for name, preset in _family(family.name, family.read_text(encoding="utf-8")).items():
            if name in found:
                raise PolicyError(
                    family.name, f"presets.{name}", f"already defined in {origin[name]}"
                )
            found[name], origin[name] = preset, family.name
    return MappingProxyType(found)


def _family(source: str, text: str) -> dict[str, pb.ModelPolicy]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(source, "<yaml>", str(exc).replace("\n", " ")) from exc
    if not isinstance(doc, dict) or set(doc) - {"common", "presets"}:
        raise PolicyError(source, "<root>", "expected a mapping of `presets` (and `common`)")
    entries = doc.get("presets")
    if not isinstance(entries, dict) or not entries:
        raise PolicyError(source, "presets", "expected a non-empty mapping of name to fields")
    common = _entry(source, "common", doc.get("common") or {})
    family: dict[str, pb.ModelPolicy] = {}
    for name, fields in entries.items():
        preset = pb.ModelPolicy()
        preset.CopyFrom(common)
        overlay(preset, _entry(source, f"presets.{name}", fields))
        family[str(name)] = preset
    return family


def _entry(source: str, where: str, raw: Any) -> pb.ModelPolicy:
    if not isinstance(raw, dict):
        raise PolicyError(source, where, "expected a mapping of policy fields")
    for field in _ENTRY_ONLY_FIELDS:
        if field in raw:
            raise PolicyError(
                source, f"{where}.{field}", "belongs to the policy entry, not a preset"
            )
    message = pb.ModelPolicy()
    try:
        json_format.ParseDict(raw, message)
    except json_format.ParseError as exc:
        raise PolicyError(source, where, str(exc)) from exc
    return message
