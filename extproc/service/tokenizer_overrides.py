"""Tokenizer overrides: the models (or tokenizer ``hf_id``s) whose ``tokenizer.json`` is
read from a local directory instead of where the policy says, as ``NAME=DIR`` items:
``--tokenizer NAME=DIR`` flags and ``$EXTPROC_TOKENIZER_OVERRIDES=NAME=DIR,...``.

A command that loads a policy reads them here, once, and hands the mapping to the
loader (:func:`~extproc.core.policy.loader.load_policy_text`), which reads no
environment. A flag wins over the environment for the same NAME.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from extproc.core.policy.errors import PolicyError

TOKENIZER_OVERRIDES_ENV = "EXTPROC_TOKENIZER_OVERRIDES"
ENV_FIELD = "<env>"


def parse_tokenizer_overrides(spec: str) -> dict[str, Path]:
    """``"NAME=DIR,NAME2=DIR2"`` -> mapping; NAME is a model name or a tokenizer hf_id.
    Raises ValueError naming an item that is not ``NAME=DIR``."""
    out: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"tokenizer override {item!r} is not NAME=DIRECTORY")
        out[name.strip()] = Path(path.strip())
    return out


def tokenizer_overrides(
    flags: Iterable[str] = (), environ: Mapping[str, str] = os.environ
) -> dict[str, Path]:
    """The overrides of ``--tokenizer`` ``flags`` over those of the environment. Raises
    ValueError for a malformed flag, and PolicyError (source the variable's name, field
    ``<env>``) for a malformed environment."""
    from_flags = parse_tokenizer_overrides(",".join(flags))
    try:
        from_env = parse_tokenizer_overrides(environ.get(TOKENIZER_OVERRIDES_ENV, ""))
    except ValueError as exc:
        raise PolicyError(TOKENIZER_OVERRIDES_ENV, ENV_FIELD, str(exc)) from exc
    return {**from_env, **from_flags}
