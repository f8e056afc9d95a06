"""The candidate's own facts: the model name it serves, its token limit, its kind
(Dynamo's flat error bodies or vLLM's ``{"error": {...}}``) and whether it applies
``truncate_prompt_tokens``.

The limit is read from ``/v1/models`` (vLLM's ``max_model_len``, Dynamo's
``context_window``) and, when it is not there, found by bisection on the status of
token-id inputs of growing length.
"""

from __future__ import annotations

from typing import Any

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Confidence, Finding, finding, unknown
from extproc.tools.learn.local import TEXT, LocalModel
from extproc.tools.learn.session import Exchange, Session, first_true
from extproc.tools.toolkit.long_text import plain_words

KIND_OF_ENVELOPE = {"flat": "dynamo", "openai": "vllm"}
KIND_OF_OWNER = {"nvidia": "dynamo", "vllm": "vllm"}
MAX_SEARCHED = 131072
TRUNCATE_TO = 4


def survey(session: Session, model: str) -> tuple[str, int | None, str, list[Finding]]:
    """(the name to send upstream, its listed token limit, its owner, findings)."""
    listing, doc = session.get_json("candidate", "/models")
    models = doc.get("data") if isinstance(doc, dict) else None
    entries = [m for m in models or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    ids = [m["id"] for m in entries]
    if model in ids or len(ids) != 1:
        name = model
        how = "the baseline's name" + ("" if model in ids else f" (the candidate lists {ids})")
    else:
        name = ids[0]
        how = f"the one model the candidate lists ({model!r} is not listed)"
    entry: dict[str, Any] = next((m for m in entries if m["id"] == name), {})
    limit = entry.get("max_model_len") or entry.get("context_window")
    owner = str(entry.get("owned_by", ""))
    confidence: Confidence = "measured" if ids else "default"
    found = [finding("upstream_model", name, confidence, f"{name!r}: {how}", shown=[listing])]
    return name, limit if isinstance(limit, int) else None, owner, found


def learn_max_tokens(
    session: Session, local: LocalModel, basics: Basics, listed: int | None
) -> tuple[int | None, Finding]:
    field = "candidate max tokens"
    if listed is not None:
        return listed, finding(field, listed, "measured", f"{listed} (from /v1/models)")
    session.note("learn: the candidate's token limit (bisection)")
    content = local.ids(plain_words(MAX_SEARCHED))
    shown: list[Exchange] = []
    body = {"model": basics.upstream_model}

    def refused(tokens: int) -> bool:
        ids = basics.framed(content[: tokens - basics.layout.count])
        shown.append(session.send("candidate", f"{tokens:,} token ids", {**body, "input": ids}))
        return not shown[-1].ok

    low = first_true(refused, basics.layout.count, MAX_SEARCHED + 1) - 1
    if low >= MAX_SEARCHED:
        return None, unknown(
            field, f"the candidate embeds {MAX_SEARCHED:,} tokens; no limit found", shown
        )
    return low, finding(
        field, low, "measured", f"{low} (the longest token-id input it embeds)", shown=shown
    )


def learn_kind(
    session: Session, basics: Basics, owner: str, errors: list[Exchange]
) -> tuple[str | None, bool, list[Finding]]:
    """(upstream kind, applies truncate_prompt_tokens, findings)."""
    shapes = {e.envelope for e in errors if e.envelope in KIND_OF_ENVELOPE}
    kinds = {KIND_OF_ENVELOPE[s] for s in shapes}
    notes = [f"{e.label}: {e.status}, {e.envelope} body" for e in errors if e.envelope]
    notes.append(f"/v1/models owned_by {owner!r}")
    if len(kinds) != 1:
        found = [
            unknown(
                "upstream.kind",
                f"the candidate's error bodies do not tell its kind ({sorted(shapes)})",
                errors,
            )
        ]
        kind = None
    else:
        (kind,) = kinds
        agrees = KIND_OF_OWNER.get(owner) == kind
        shape = "flat {message, type, code}" if kind == "dynamo" else '{"error": {...}}'
        summary = f"{kind}: errors as {shape}" + (f", owned_by {owner!r}" if agrees else "")
        errs = [e for e in errors if e.envelope]
        found = [
            finding(
                "upstream.kind",
                kind,
                "verified" if agrees else "measured",
                summary,
                shown=errs,
                notes=notes,
            )
        ]
    body = {"model": basics.upstream_model, "input": [TEXT], "truncate_prompt_tokens": TRUNCATE_TO}
    answer = session.send("candidate", f"truncate_prompt_tokens {TRUNCATE_TO}", body)
    applies = answer.ok and answer.prompt_tokens == TRUNCATE_TO
    summary = ("yes" if applies else "no") + f": {answer.brief()}"
    found.append(
        finding(
            "upstream.native.truncate_prompt_tokens", applies, "measured", summary, shown=[answer]
        )
    )
    return kind, applies, found
