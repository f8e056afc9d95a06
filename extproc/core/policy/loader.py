"""Policy text -> validated :class:`GatewayPolicy` (the file is read by
:mod:`extproc.service.policy_file`).

The file is YAML whose schema is ``protos/extproc/policy/v1/policy.proto``; keys map
onto the proto with protobuf's JSON mapping, so unknown keys and wrong types are
caught by protobuf itself. A named preset supplies every field the entry leaves
unset. Then the semantic checks below run, and any failure is a
:class:`PolicyError` naming the file, the field and the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from extproc.core.answer_layout import BODY_SLOTS, ITEM_SLOTS, AnswerLayout
from extproc.core.api_errors import ErrorClass
from extproc.core.dialects import (
    EMBEDDINGS_DIALECTS,
    OPENAI_PATHS,
    OPENAI_READERS,
    RERANK_DIALECTS,
)
from extproc.core.error_dialect import ErrorDialect, ErrorShape
from extproc.core.error_templates import REASONS, SLOTS
from extproc.core.json_templates import template_problem
from extproc.core.policy.errors import PolicyError
from extproc.core.policy.model import (
    DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S,
    DEFAULT_ADMISSION_WAIT_MS,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_INPUTS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TOKENIZE_MS,
    DEFAULT_RETRY_AFTER_S,
    PROFILE_BUNDLES,
    CutSide,
    EncodingProfile,
    GatewayPolicy,
    InstructionUse,
    Leniency,
    Limits,
    Matryoshka,
    ModelPolicy,
    OlderSpelling,
    Preprocess,
    PromptTemplates,
    RerankPolicy,
    ScoreScale,
    Served,
    SpecialTokens,
    TokenizerSource,
    Truncation,
    UnicodeForm,
    UpstreamPolicy,
)
from extproc.core.policy.overlay import overlay
from extproc.core.policy.presets import presets
from extproc.core.policy.v1 import policy_pb2 as pb
from extproc.core.prompts import DOCUMENT_TYPES, QUERY_TYPES
from extproc.core.quantize import Scaling, ScalingRule
from extproc.core.registry import UnknownNameError
from extproc.core.request_headers import route_of
from extproc.core.upstreams import ADAPTERS, Capabilities, adapter_for

# Largest allowed request: 2048 inputs is OpenAI's cap; 64 MiB bounds Envoy's buffer.
MAX_INPUTS_CEILING = 2048
MAX_REQUEST_BYTES_CEILING = 64 * 1024 * 1024
# One input's first slice must fit: ~8 bytes a token of a 1,024-token model.
MIN_TOKENIZE_BYTES = 8 * 1024
# Tokenizing must end well before Envoy's ext_proc message_timeout (15 s in envoy/*.yaml):
# past it Envoy answers 504 while the tokenizer still runs.
MAX_TOKENIZE_MS_CEILING = 10_000
# Admission: a budget under 1 MiB would refuse ordinary traffic; 4 GiB - 1 is the
# field's range. The wait stays under the same message_timeout as tokenizing.
MIN_INFLIGHT_BYTES = 1024 * 1024
MAX_INFLIGHT_BYTES_CEILING = 2**32 - 1
MAX_ADMISSION_WAIT_MS = 10_000
MAX_RETRY_AFTER_S = 3600
# Under 1 MiB/s an 8 MiB body's reservation would outlive a stalled upload by
# seconds; 4 GiB/s - 1 (the field's range) all but turns reservations off.
MIN_UPLOAD_BYTES_PER_S = 1024 * 1024
MAX_UPLOAD_BYTES_PER_S = 2**32 - 1
_FIELD_RE = re.compile(r"\{(\w*)\}")


def load_policy_text(
    text: str,
    *,
    source: str = "<text>",
    tokenizer_overrides: Mapping[str, Path] | None = None,
) -> GatewayPolicy:
    """The policy ``text`` says (``source`` names it in errors). ``tokenizer_overrides``
    maps a model name or a tokenizer hf_id to the directory its tokenizer.json is read
    from instead (the caller's: extproc.service.tokenizer_overrides)."""
    overrides = dict(tokenizer_overrides or {})
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(source, "<yaml>", str(exc).replace("\n", " ")) from exc
    if not isinstance(doc, dict):
        raise PolicyError(source, "<root>", "expected a mapping with a `models` list")
    raw_models = doc.get("models", [] if "rerankers" in doc else None)
    if not isinstance(raw_models, list) or not (raw_models or doc.get("rerankers")):
        raise PolicyError(source, "models", "expected a non-empty list of model entries")

    limits = _limits(source, doc.get("limits", {}))
    errors = _errors(source, doc.get("errors", {}))
    models: dict[str, ModelPolicy] = {}
    older: list[OlderSpelling] = []
    for index, raw in enumerate(raw_models):
        where = f"models[{index}]"
        policy = _model(source, where, raw, overrides, older)
        if policy.name in models:
            raise PolicyError(source, f"{where}.name", f"duplicate model name {policy.name!r}")
        models[policy.name] = policy
    _check_names(source, list(models.values()))
    rerankers = _rerankers(source, doc.get("rerankers", []), overrides)
    _check_serves(source, list(models.values()), frozenset(r.path for r in rerankers))
    unknown_root = set(doc) - {"models", "limits", "errors", "rerankers"}
    if unknown_root:
        raise PolicyError(source, sorted(unknown_root)[0], "unknown top-level key")
    return GatewayPolicy(
        models=models,
        limits=limits,
        source=source,
        errors=errors,
        rerankers=rerankers,
        older_spellings=tuple(older),
    )


def _rerankers(source: str, raw: Any, overrides: Mapping[str, Path]) -> tuple[RerankPolicy, ...]:
    if not isinstance(raw, list):
        raise PolicyError(source, "rerankers", "expected a list of reranker entries")
    out: list[RerankPolicy] = []
    for index, item in enumerate(raw):
        where = f"rerankers[{index}]"

        def fail(field: str, reason: str, where: str = where) -> PolicyError:
            return PolicyError(source, f"{where}.{field}", reason)

        if not isinstance(item, dict):
            raise PolicyError(source, where, "expected a mapping")
        if "cut_long_pairs" in item:
            raise fail(
                "cut_long_pairs",
                "is now `truncation: {refuse: true}` (refuse a long pair; the default cuts it)",
            )
        entry = pb.RerankPolicy()
        _parse(source, where, item, entry)
        if not entry.name:
            raise fail("name", "required")
        dialect_name = pb.RerankPolicy.Dialect.Name(entry.dialect).lower()
        dialect = RERANK_DIALECTS.get(dialect_name)
        if dialect is None:
            known = ", ".join(sorted(d.upper() for d in RERANK_DIALECTS))
            raise fail("dialect", f"required: one of {known}")
        path = entry.path if entry.HasField("path") else dialect.paths[0]
        if not path.startswith("/") or path.rstrip("/") in ("", "/v1/embeddings", "/embeddings"):
            raise fail("path", f"{path!r} is not a rerank path")
        kind = entry.upstream.kind or "vllm"
        if kind not in ADAPTERS:
            known = ", ".join(sorted(ADAPTERS))
            raise fail("upstream.kind", f"unknown rerank upstream {kind!r} (known: {known})")
        truncation = _truncation(entry.truncation)
        if truncation.side is not CutSide.RIGHT or not truncation.keep_special_tokens:
            raise fail(
                "truncation",
                "a long pair is cut from the right with its special tokens kept (the "
                "upstreams' own pair truncation), or refused: only `refuse` may be set",
            )
        tokenizer = None
        name_override = overrides.get(entry.name)
        tok = entry.tokenizer
        if name_override is not None:
            tokenizer = TokenizerSource(path=name_override)
        elif tok.HasField("path"):
            tokenizer = TokenizerSource(path=Path(tok.path))
        elif tok.HasField("hf_id"):
            path_override = overrides.get(tok.hf_id)
            tokenizer = (
                TokenizerSource(path=path_override)
                if path_override
                else TokenizerSource(hf_id=tok.hf_id, revision=tok.revision or None)
            )
        max_tokens = entry.max_tokens if entry.HasField("max_tokens") else None
        if max_tokens is not None and tokenizer is None:
            raise fail("tokenizer", "required with max_tokens (pairs are counted with it)")
        errors = _errors(source, item["errors"]) if "errors" in item else None
        out.append(
            RerankPolicy(
                name=entry.name,
                upstream_model=entry.upstream_model
                if entry.HasField("upstream_model")
                else entry.name,
                dialect=dialect.name,
                path=path,
                scores=ScoreScale.RAW
                if entry.scores == pb.RerankPolicy.RAW
                else ScoreScale.SIGMOID,
                top_n=entry.top_n if entry.HasField("top_n") and entry.top_n else None,
                return_documents=entry.return_documents
                if entry.HasField("return_documents")
                else dialect.returns_documents,
                max_tokens=max_tokens,
                truncation=truncation,
                tokenizer=tokenizer,
                special_tokens=SpecialTokens(from_tokenizer=True),
                upstream_kind=kind,
                errors=errors,
                any_name=entry.any_name,
            )
        )
    seen: dict[str, str] = {}
    names: set[tuple[str, str]] = set()
    anyone: set[str] = set()
    for index, r in enumerate(out):
        if r.any_name:
            if r.path in anyone:
                raise PolicyError(
                    source, f"rerankers[{index}].any_name", f"only one entry of {r.path} may"
                )
            anyone.add(r.path)
        if seen.setdefault(r.path, r.dialect) != r.dialect:
            raise PolicyError(
                source,
                f"rerankers[{index}].dialect",
                f"{r.path} already speaks {seen[r.path].upper()}",
            )
        if (r.path, r.name) in names:
            raise PolicyError(source, f"rerankers[{index}].name", f"{r.name!r} twice on {r.path}")
        names.add((r.path, r.name))
    return tuple(out)


def _parse(source: str, where: str, raw: Any, message: Message) -> None:
    try:
        json_format.ParseDict(raw, message)
    except json_format.ParseError as exc:
        raise PolicyError(source, where, str(exc)) from exc


def _limits(source: str, raw: Any) -> Limits:
    msg = pb.Limits()
    _parse(source, "limits", raw or {}, msg)

    def value(field: str, low: int, high: int) -> int | None:
        if not msg.HasField(field):
            return None
        got = int(getattr(msg, field))
        if not low <= got <= high:
            raise PolicyError(
                source, f"limits.{field}", f"must be between {low} and {high}, got {got}"
            )
        return got

    max_bytes = value("max_request_bytes", 1024, MAX_REQUEST_BYTES_CEILING)
    max_inputs = value("max_inputs", 1, MAX_INPUTS_CEILING)
    total_chars = value("max_total_chars", 1, MAX_REQUEST_BYTES_CEILING)
    input_chars = value("max_input_chars", 1, MAX_REQUEST_BYTES_CEILING)
    tokenize_bytes = value("max_tokenize_bytes", MIN_TOKENIZE_BYTES, MAX_REQUEST_BYTES_CEILING)
    tokenize_ms = value("max_tokenize_ms", 1, MAX_TOKENIZE_MS_CEILING)
    inflight = value("max_inflight_bytes", MIN_INFLIGHT_BYTES, MAX_INFLIGHT_BYTES_CEILING)
    wait_ms = value("admission_wait_ms", 0, MAX_ADMISSION_WAIT_MS)
    retry_after = value("retry_after_s", 1, MAX_RETRY_AFTER_S)
    upload_rate = value(
        "admission_upload_bytes_per_s", MIN_UPLOAD_BYTES_PER_S, MAX_UPLOAD_BYTES_PER_S
    )
    request_bytes = max_bytes or DEFAULT_MAX_REQUEST_BYTES
    # The character caps follow the body size unless set: see Limits.
    total = total_chars or request_bytes
    if input_chars is not None and input_chars > total:
        raise PolicyError(
            source,
            "limits.max_input_chars",
            f"{input_chars} can never apply: it is over limits.max_total_chars ({total})",
        )
    return Limits(
        max_request_bytes=request_bytes,
        max_inputs=max_inputs or DEFAULT_MAX_INPUTS,
        max_input_chars=input_chars or total,
        max_total_chars=total,
        max_tokenize_bytes=tokenize_bytes or request_bytes,
        max_tokenize_ms=tokenize_ms or DEFAULT_MAX_TOKENIZE_MS,
        max_inflight_bytes=inflight or DEFAULT_MAX_INFLIGHT_BYTES,
        admission_wait_ms=DEFAULT_ADMISSION_WAIT_MS if wait_ms is None else wait_ms,
        retry_after_s=retry_after or DEFAULT_RETRY_AFTER_S,
        admission_upload_bytes_per_s=upload_rate or DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S,
    )


_SHAPES = {
    pb.Errors.SHAPE_UNSPECIFIED: ErrorShape.OPENAI,
    pb.Errors.OPENAI: ErrorShape.OPENAI,
    pb.Errors.FASTAPI: ErrorShape.FASTAPI,
    pb.Errors.FLAT: ErrorShape.FLAT,
    pb.Errors.TEI: ErrorShape.TEI,
}


def _errors(source: str, raw: Any) -> ErrorDialect:
    msg = pb.Errors()
    _parse(source, "errors", raw or {}, msg)
    statuses: dict[ErrorClass, int] = {}
    for kind in ErrorClass:
        if msg.status.HasField(kind.value):
            status = int(getattr(msg.status, kind.value))
            if not 400 <= status <= 499:
                raise PolicyError(
                    source,
                    f"errors.status.{kind.value}",
                    f"must be a client-error status (400..499), got {status}",
                )
            statuses[kind] = status
    # The templates as the file wrote them (protobuf's Struct keeps no key order, and
    # the order of a body's keys is part of what a client sees); the message checked
    # that they are JSON values.
    raw = raw or {}
    body = _template(source, "errors.body", raw.get("body")) if msg.HasField("body") else None
    written = raw.get("bodies") or {}
    kinds = {each.value for each in ErrorClass}
    bodies: dict[str, Any] = {}
    for key, template in written.items():
        named, _, reason = str(key).partition(".")
        if named not in kinds or (reason and reason not in REASONS):
            raise PolicyError(
                source,
                f"errors.bodies.{key}",
                f"not a kind of mistake (one of {', '.join(sorted(kinds))}), "
                f"optionally .{' / .'.join(REASONS)}",
            )
        bodies[str(key)] = _template(source, f"errors.bodies.{key}", template)
    by_reason: dict[str, int] = {}
    for key, status in msg.status_by_reason.items():
        named, _, reason = key.partition(".")
        where = f"errors.status_by_reason.{key}"
        if named not in kinds or reason not in REASONS:
            raise PolicyError(source, where, "not a kind of mistake and a reason")
        if not 400 <= status <= 499:
            raise PolicyError(source, where, f"must be 400..499, got {status}")
        by_reason[key] = int(status)
    return ErrorDialect(
        _SHAPES[msg.shape],
        MappingProxyType(statuses),
        body,
        MappingProxyType(bodies),
        MappingProxyType(by_reason),
    )


def _either(written: dict[str, Any], field: str) -> Any:
    """A field of a parsed mapping, spelled as in the proto or in lowerCamelCase."""
    if field in written:
        return written[field]
    head, *rest = field.split("_")
    return written.get(head + "".join(part.title() for part in rest))


def _template(source: str, where: str, template: Any) -> Any:
    problem = template_problem(template, SLOTS)
    if problem is not None:
        raise PolicyError(source, where, f"not a body template: {problem}")
    return template


def _check_names(source: str, models: list[ModelPolicy]) -> None:
    """Each `model` a client may send names one entry, and one entry at most takes
    any name."""
    owner: dict[str, str] = {m.name: m.name for m in models}
    for index, model in enumerate(models):
        for name in sorted(model.other_names):
            if owner.setdefault(name, model.name) != model.name:
                raise PolicyError(
                    source,
                    f"models[{index}].other_names",
                    f"{name!r} already names model {owner[name]!r}",
                )
    for flag, what in (("any_name", "any name"), ("unnamed", "the requests naming none")):
        taking = [i for i, m in enumerate(models) if getattr(m, flag)]
        if len(taking) > 1:
            raise PolicyError(
                source, f"models[{taking[1]}].{flag}", f"only one model may take {what}"
            )


# The fields that say a model's encoding: a profile, or the parts of its bundle.
_ENCODING_FIELDS = ("encoding_profile", "base64", "leniency")


def _says_encoding(m: pb.ModelPolicy) -> bool:
    return bool(m.encoding_profile or m.base64 or m.HasField("leniency"))


def _model(
    source: str,
    where: str,
    raw: Any,
    overrides: Mapping[str, Path],
    older: list[OlderSpelling],
) -> ModelPolicy:
    if not isinstance(raw, dict):
        raise PolicyError(source, where, "expected a mapping")
    entry = pb.ModelPolicy()
    _parse(source, where, raw, entry)
    if not entry.name:
        raise PolicyError(source, f"{where}.name", "required")
    merged = pb.ModelPolicy()
    replaced: EncodingProfile | None = None
    if entry.preset:
        shipped = presets()
        preset = shipped.get(entry.preset)
        if preset is None:
            known = ", ".join(sorted(shipped))
            raise PolicyError(
                source, f"{where}.preset", f"unknown preset {entry.preset!r} (known: {known})"
            )
        merged.CopyFrom(preset)
        _upstream_kind_from_flavour(source, f"{where}.preset", merged)
        if _says_encoding(entry):
            # The entry's encoding replaces the preset's as a whole: a profile and the
            # fields that deviate from it are never mixed across the two.
            replaced = _PROFILES.get(merged.encoding_profile)
            for name in _ENCODING_FIELDS:
                merged.ClearField(name)
    older.extend(_upstream_kind_from_flavour(source, where, entry))
    overlay(merged, entry)
    model = _validate_model(source, where, merged, overrides, replaced)
    return replace(
        model,
        answer=_answer(source, where, merged, raw),
        serves=_serves(source, where, merged, raw),
        quantization=_quantization(source, where, merged, model.native_dimensions),
    )


def _serves(source: str, where: str, m: pb.ModelPolicy, raw: Any) -> tuple[Served, ...]:
    written = raw.get("serves") if isinstance(raw, dict) else None
    out: list[Served] = []
    for index, entry in enumerate(m.serves):
        at = f"{where}.serves[{index}]"
        name = pb.Served.Dialect.Name(entry.dialect).lower()
        dialect = EMBEDDINGS_DIALECTS.get(name)
        if dialect is None:
            known = ", ".join(sorted(d.upper() for d in EMBEDDINGS_DIALECTS))
            raise PolicyError(source, f"{at}.dialect", f"required: one of {known}")
        path = entry.path if entry.HasField("path") else dialect.paths[0]
        if not path.startswith("/") or route_of(path) != path:
            raise PolicyError(source, f"{at}.path", f"{path!r} is not a path as routes compare it")
        errors = None
        if entry.HasField("errors"):
            errors = _errors(source, written[index].get("errors") if written else {})
        normalized = entry.normalized if entry.HasField("normalized") else True
        out.append(Served(dialect.name, path, normalized, errors))
    return tuple(out)


def _check_serves(source: str, models: list[ModelPolicy], rerank_paths: frozenset[str]) -> None:
    """Across models: a path is one dialect's, with one error dialect; a dialect
    whose requests name no model serves one model a path; no path is a rerank
    path; OpenAI's own paths take only a dialect that reads OpenAI's requests; vectors
    as the model pools them only from an upstream that gives them."""
    taken: dict[str, tuple[str, Served]] = {}
    for index, model in enumerate(models):
        for number, served in enumerate(model.serves):
            at = f"models[{index}].serves[{number}]"
            path = served.path
            kind = model.upstream.kind
            if not served.normalized and not adapter_for(kind).raw_vectors:
                raise PolicyError(
                    source,
                    f"{at}.normalized",
                    f"{kind} gives no vectors as the model pools them: serve {path!r} "
                    "from vllm, or leave it on the legacy server",
                )
            if path in rerank_paths:
                raise PolicyError(source, f"{at}.path", f"{path!r} is a reranker's path")
            if path in OPENAI_PATHS and served.dialect not in OPENAI_READERS:
                raise PolicyError(
                    source, f"{at}.path", f"{path!r} is OpenAI's; {served.dialect} cannot serve it"
                )
            first = taken.setdefault(path, (model.name, served))
            if first[1] is served:
                continue
            owner, other = first
            if other.dialect != served.dialect:
                raise PolicyError(
                    source,
                    f"{at}.dialect",
                    f"{path!r} is {other.dialect}'s already (model {owner!r})",
                )
            if not EMBEDDINGS_DIALECTS[served.dialect].names_model:
                raise PolicyError(
                    source,
                    f"{at}.path",
                    f"{served.dialect} requests name no model: {path!r} serves {owner!r} already",
                )
            if served.errors is not None and other.errors not in (None, served.errors):
                raise PolicyError(
                    source, f"{at}.errors", f"{path!r} has other errors at model {owner!r}"
                )


def _quantization(source: str, where: str, m: pb.ModelPolicy, native: int) -> Scaling | None:
    if not m.HasField("quantization"):
        return None
    q = m.quantization
    at = f"{where}.quantization"
    if q.scaling == pb.Quantization.SYMMETRIC:
        if q.minimum or q.maximum:
            raise PolicyError(source, at, "SYMMETRIC takes no minimum or maximum")
        return Scaling(ScalingRule.SYMMETRIC)
    if q.scaling != pb.Quantization.CALIBRATED:
        raise PolicyError(source, f"{at}.scaling", "required: SYMMETRIC or CALIBRATED")
    if len(q.minimum) != native or len(q.maximum) != native:
        raise PolicyError(
            source, at, f"CALIBRATED needs a minimum and a maximum for each of {native} components"
        )
    if any(lo > hi for lo, hi in zip(q.minimum, q.maximum, strict=True)):
        raise PolicyError(source, at, "a minimum over its maximum")
    return Scaling(ScalingRule.CALIBRATED, tuple(q.minimum), tuple(q.maximum))


def _answer(source: str, where: str, m: pb.ModelPolicy, raw: Any) -> AnswerLayout | None:
    """The entry's answer layout, its templates as the file wrote them (key order)."""
    if not m.HasField("answer"):
        return None
    written = raw.get("answer") if isinstance(raw, dict) else None
    complete = m.answer.HasField("body") and m.answer.HasField("item")
    if not (isinstance(written, dict) and complete):
        raise PolicyError(source, f"{where}.answer", "needs both `body` and `item`")
    layout = AnswerLayout(written["body"], written["item"])
    for part, template, slots in (
        ("body", layout.body, BODY_SLOTS),
        ("item", layout.item, ITEM_SLOTS),
    ):
        problem = template_problem(template, slots)
        if problem is not None:
            raise PolicyError(source, f"{where}.answer.{part}", f"not a template: {problem}")
    if "{data}" not in json.dumps(layout.body):
        raise PolicyError(source, f"{where}.answer.body", "has no {data} for the vectors")
    return layout


_FLAVOUR_KINDS = {pb.DYNAMO: "dynamo", pb.VLLM: "vllm"}


def _upstream_kind_from_flavour(
    source: str, where: str, m: pb.ModelPolicy
) -> tuple[OlderSpelling, ...]:
    """Moves the older ``upstream_flavour`` spelling onto ``upstream.kind``, before the
    entry is laid over its preset: the entry's upstream wins whichever spelling each
    uses. Returns the spelling read, with how to write it now."""
    if m.upstream_flavour == pb.UPSTREAM_FLAVOUR_UNSPECIFIED:
        return ()
    field = f"{where}.upstream_flavour"
    kind = _FLAVOUR_KINDS.get(m.upstream_flavour)
    if kind is None:
        raise PolicyError(source, field, "must be DYNAMO or VLLM")
    if m.upstream.kind and m.upstream.kind != kind:
        raise PolicyError(
            source,
            field,
            f"says {kind!r} but upstream.kind says {m.upstream.kind!r}; keep upstream.kind only",
        )
    replacement = (
        f"drop it: upstream.kind says {kind!r} already"
        if m.upstream.kind
        else f"write `upstream: {{kind: {kind}}}` instead"
    )
    m.upstream.kind = kind
    m.ClearField("upstream_flavour")
    return (OlderSpelling(field, f"the older spelling of upstream.kind; {replacement}"),)


def _upstream(source: str, where: str, m: pb.ModelPolicy) -> UpstreamPolicy:
    """The upstream kind's adapter defaults, overridden by what the policy declares."""
    field = f"{where}.upstream"
    if not m.upstream.kind:
        known = ", ".join(sorted(ADAPTERS))
        raise PolicyError(source, f"{field}.kind", f"required: one of {known}")
    try:
        adapter = adapter_for(m.upstream.kind)
    except UnknownNameError as exc:
        raise PolicyError(source, f"{field}.kind", str(exc)) from None
    declared = m.upstream.native
    defaults = adapter.defaults
    native = Capabilities(
        dimensions=declared.dimensions if declared.HasField("dimensions") else defaults.dimensions,
        truncate_prompt_tokens=declared.truncate_prompt_tokens
        if declared.HasField("truncate_prompt_tokens")
        else defaults.truncate_prompt_tokens,
    )
    if native.dimensions and not m.HasField("matryoshka"):
        raise PolicyError(
            source,
            f"{field}.native.dimensions",
            "the model has no `matryoshka` section, so only its native size is accepted "
            "and no `dimensions` is ever left to the upstream",
        )
    return UpstreamPolicy(kind=adapter.name, native=native)


def _validate_model(
    source: str,
    where: str,
    m: pb.ModelPolicy,
    overrides: Mapping[str, Path],
    replaced: EncodingProfile | None,
) -> ModelPolicy:
    def fail(field: str, reason: str) -> PolicyError:
        return PolicyError(source, f"{where}.{field}", reason)

    tok = m.tokenizer
    hf_id = tok.hf_id if tok.HasField("hf_id") else None
    tok_path = Path(tok.path) if tok.HasField("path") else None
    override = overrides.get(m.name) or (overrides.get(hf_id) if hf_id else None)
    if override is not None:
        tok_path, hf_id = override, None
    if hf_id is None and tok_path is None:
        raise fail("tokenizer", "needs hf_id or path (or a preset that names one)")

    special = tok.special_tokens
    from_tok = special.from_tokenizer if special.HasField("from_tokenizer") else False
    if from_tok and (special.prepend_ids or special.append_ids):
        raise fail(
            "tokenizer.special_tokens", "from_tokenizer excludes explicit prepend_ids/append_ids"
        )

    if not m.HasField("native_dimensions") or m.native_dimensions == 0:
        raise fail("native_dimensions", "required (the size of the upstream's vectors)")
    native = m.native_dimensions
    if not m.HasField("max_tokens") or m.max_tokens < 2:
        raise fail("max_tokens", "required, at least 2 (the upstream's --max-model-len)")
    specials_len = len(special.prepend_ids) + len(special.append_ids)
    if specials_len >= m.max_tokens:
        raise fail("max_tokens", "leaves no room for text after the special tokens")

    templates = _prompts(m.prompts, fail)

    matryoshka: Matryoshka | None = None
    if m.HasField("matryoshka"):
        mm = m.matryoshka
        allowed = tuple(sorted(set(mm.allowed)))
        min_dims = (
            mm.min_dimensions if mm.HasField("min_dimensions") else (allowed[0] if allowed else 1)
        )
        if min_dims < 1 or min_dims > native:
            raise fail(
                "matryoshka.min_dimensions", f"must be between 1 and native_dimensions ({native})"
            )
        if any(a < 1 or a > native for a in allowed):
            raise fail("matryoshka.allowed", f"every size must be between 1 and {native}")
        max_dims = mm.max_dimensions if mm.HasField("max_dimensions") else None
        if max_dims is not None and not min_dims <= max_dims <= native:
            raise fail(
                "matryoshka.max_dimensions",
                f"must be between min_dimensions ({min_dims}) and native_dimensions ({native})",
            )
        matryoshka = Matryoshka(
            min_dimensions=min_dims,
            allowed=allowed,
            max_dimensions=None if max_dims == native else max_dims,
            accepts_native=mm.accepts_native if mm.HasField("accepts_native") else True,
            renormalise=mm.renormalise if mm.HasField("renormalise") else True,
        )

    honours_base64, leniency = _encoding(m, fail, replaced)
    upstream = _upstream(source, where, m)
    if matryoshka is not None and not matryoshka.renormalise and upstream.native.dimensions:
        raise fail(
            "upstream.native.dimensions",
            "an upstream that cuts `dimensions` re-normalises the cut; with "
            "matryoshka.renormalise: false the gateway must cut (native.dimensions: false)",
        )

    return ModelPolicy(
        name=m.name,
        upstream_model=m.upstream_model if m.HasField("upstream_model") else m.name,
        tokenizer=TokenizerSource(
            hf_id=hf_id,
            path=tok_path,
            revision=tok.revision if tok.HasField("revision") else None,
        ),
        special_tokens=SpecialTokens(
            from_tokenizer=from_tok,
            prepend_ids=tuple(special.prepend_ids),
            append_ids=tuple(special.append_ids),
        ),
        max_tokens=m.max_tokens,
        prompts=templates,
        native_dimensions=native,
        matryoshka=matryoshka,
        honours_base64=honours_base64,
        leniency=leniency,
        upstream=upstream,
        check_responses=m.check_responses,
        truncation=_truncation(m.truncation),
        other_names=frozenset(n for n in m.other_names if n != m.name),
        any_name=m.any_name,
        preprocess=_preprocess(m.preprocess),
        unnamed=m.unnamed,
    )


# The proto's enum values carry the same names as the model's.
_FORMS = {pb.Preprocess.UnicodeForm.Value(form.name): form for form in UnicodeForm}


def _preprocess(p: pb.Preprocess) -> Preprocess:
    return Preprocess(
        fold_newlines=p.fold_newlines,
        collapse_whitespace=p.collapse_whitespace,
        strip=p.strip,
        unicode_form=_FORMS.get(p.unicode_form),
    )


_PROFILES = {pb.LEGACY: EncodingProfile.LEGACY, pb.OPENAI: EncodingProfile.OPENAI}


_BASE64 = {pb.ModelPolicy.HONOURED: True, pb.ModelPolicy.IGNORED: False}
# The parts of an encoding, as (field, how a value of it is written).
_PARTS: tuple[tuple[str, Callable[[bool], str]], ...] = (
    ("base64", lambda honoured: "HONOURED" if honoured else "IGNORED"),
    ("leniency.integers", lambda on: str(on).lower()),
    ("leniency.bom", lambda on: str(on).lower()),
    ("leniency.integral_floats", lambda on: str(on).lower()),
)
_REQUIRED_PARTS = ("base64", "leniency.integers", "leniency.bom")


def _encoding(
    m: pb.ModelPolicy,
    fail: Callable[[str, str], PolicyError],
    replaced: EncodingProfile | None,
) -> tuple[bool, Leniency]:
    """(base64 honoured, leniency), said one way: a profile, whose bundle a field
    beside it may repeat but never contradict; or, without one, base64,
    leniency.integers and leniency.bom, all three (leniency.integral_floats optional).
    ``replaced``: the preset's profile, when the entry's own encoding replaced it."""
    lax = m.leniency
    declared: dict[str, bool | None] = {
        "base64": _BASE64.get(m.base64),
        "leniency.integers": lax.integers if lax.HasField("integers") else None,
        "leniency.bom": lax.bom if lax.HasField("bom") else None,
        "leniency.integral_floats": (
            lax.integral_floats if lax.HasField("integral_floats") else None
        ),
    }
    profile = _PROFILES.get(m.encoding_profile)
    if profile is not None:
        honours, lenient = PROFILE_BUNDLES[profile]
        bundle = {
            "base64": honours,
            "leniency.integers": lenient.integers,
            "leniency.bom": lenient.bom,
            "leniency.integral_floats": lenient.integral_floats,
        }
        for field, spell in _PARTS:
            value = declared[field]
            if value is not None and value != bundle[field]:
                raise fail(
                    field,
                    f"says {spell(value)} but encoding_profile {profile.name} says "
                    f"{spell(bundle[field])}; keep encoding_profile only, or drop it and "
                    "set base64, leniency.integers and leniency.bom",
                )
        return honours, lenient
    if any(declared[field] is None for field in _REQUIRED_PARTS):
        why = (
            "required: LEGACY or OPENAI (or base64, leniency.integers and leniency.bom, all three)"
        )
        if replaced is not None:
            why += (
                "; the entry's own base64 or leniency replaces its preset's "
                f"encoding_profile {replaced.name}"
            )
        raise fail("encoding_profile", why)
    return bool(declared["base64"]), Leniency(
        integers=bool(declared["leniency.integers"]),
        bom=bool(declared["leniency.bom"]),
        integral_floats=bool(declared["leniency.integral_floats"]),
    )


def _truncation(t: pb.Truncation) -> Truncation:
    return Truncation(
        side=CutSide.LEFT if t.side == pb.Truncation.LEFT else CutSide.RIGHT,
        keep_special_tokens=t.keep_special_tokens if t.HasField("keep_special_tokens") else True,
        refuse=t.refuse,
    )


_INSTRUCTION_USES = {pb.Prompts.Instruction.Value(use.name): use for use in InstructionUse} | {
    pb.Prompts.INSTRUCTION_UNSPECIFIED: InstructionUse.TASK
}


# The request fields the gateway reads for something else than the role.
_RESERVED = frozenset(
    {
        "model",
        "input",
        "encoding_format",
        "dimensions",
        "user",
        "instruction",
        "truncate_prompt_tokens",
    }
)
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _prompts(prompts: pb.Prompts, fail: Callable[[str, str], PolicyError]) -> PromptTemplates:
    templates = PromptTemplates(
        query=prompts.query if prompts.HasField("query") else "{text}",
        document=prompts.document if prompts.HasField("document") else "{text}",
        default_instruction=prompts.default_instruction,
        extra=dict(prompts.extra),
        instruction=_INSTRUCTION_USES[prompts.instruction],
        aliases=dict(prompts.aliases),
        default_input_type=prompts.default_input_type
        if prompts.HasField("default_input_type")
        else None,
        input_types=frozenset(prompts.input_types),
        role_field=prompts.role_field if prompts.HasField("role_field") else "input_type",
        document_instruction=InstructionUse.REFUSED
        if prompts.document_instruction == pb.Prompts.INSTRUCTION_UNSPECIFIED
        else _INSTRUCTION_USES[prompts.document_instruction],
    )
    if not _FIELD_NAME.fullmatch(templates.role_field) or templates.role_field in _RESERVED:
        raise fail(
            "prompts.role_field",
            f"{templates.role_field!r} cannot carry the role: a field name other than "
            + ", ".join(sorted(_RESERVED)),
        )
    # Each template, and whether it may hold {instruction} (a query's may).
    named = {
        "prompts.query": (templates.query, True),
        "prompts.document": (templates.document, False),
    }
    named.update({f"prompts.extra.{k}": (v, False) for k, v in templates.extra.items()})
    for alias, template in templates.aliases.items():
        if alias not in QUERY_TYPES | DOCUMENT_TYPES:
            known = ", ".join(sorted(QUERY_TYPES | DOCUMENT_TYPES))
            raise fail(f"prompts.aliases.{alias}", f"not an input_type alias (known: {known})")
        named[f"prompts.aliases.{alias}"] = (template, alias in QUERY_TYPES)
    for field, (template, takes_instruction) in named.items():
        fields = _FIELD_RE.findall(template)
        if fields.count("text") != 1:
            raise fail(field, "must contain {text} exactly once")
        bad = set(fields) - {"text", "instruction"}
        if bad or ("instruction" in fields and not takes_instruction):
            raise fail(field, f"unknown placeholder {{{sorted(bad or {'instruction'})[0]}}}")
        if not template.endswith("{text}"):
            # Truncation keeps the prompt's head; a suffix after {text} would be cut.
            raise fail(field, "must end with {text} so truncation never cuts the prompt")
    query_templates = [
        templates.query,
        *(t for a, t in templates.aliases.items() if a in QUERY_TYPES),
    ]
    if any("{instruction}" in t for t in query_templates) and not templates.default_instruction:
        raise fail(
            "prompts.default_instruction", "required when a query template uses {instruction}"
        )
    types = QUERY_TYPES | DOCUMENT_TYPES | set(templates.extra)
    for name in sorted(templates.input_types - types):
        raise fail("prompts.input_types", f"{name!r} is not an input_type this model has")
    default_type = templates.default_input_type
    if default_type is not None and default_type not in (templates.input_types or types):
        raise fail(
            "prompts.default_input_type", f"{default_type!r} is not an input_type this model takes"
        )
    return templates
