"""What a served rerank path answers by default: the score scale, and the results
and documents when the client does not say.

The candidate (the raw rerank upstream: vLLM's ``/rerank``) is asked the same pairs
for raw logits (``use_activation: false``); the baseline's scores equal to them is
``RAW``, equal to their sigmoid ``SIGMOID`` (within the comparison's tolerance);
anything else is another model, and named. The plain answer's count and documents
say ``top_n`` and ``return_documents``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extproc.core.dialects import RERANK_DIALECTS
from extproc.core.tasks.rerank import sigmoid
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.learn.rerank_paths_learner import DOCUMENTS, QUERY, FoundPath
from extproc.tools.learn.session import Exchange, Session
from extproc.tools.parity.rerank_comparison import SCORE_TOLERANCE

# vLLM's /rerank answers in Jina's shape (results with relevance_score, no meta).
UPSTREAM_READER = RERANK_DIALECTS["jina"]
UPSTREAM_PATH = "/rerank"


@dataclass(frozen=True)
class Defaults:
    scores: str | None  # SIGMOID, RAW, or None: not learned
    top_n: int | None
    return_documents: bool


def upstream_rerank(session: Session, upstream_model: str, label: str, **options: Any) -> Exchange:
    """The candidate's own answer for the learning pairs (or others, by ``options``)."""
    body: dict[str, Any] = {"model": upstream_model, "query": QUERY, "documents": list(DOCUMENTS)}
    body |= {"use_activation": False, **options}
    return session.post("candidate", UPSTREAM_PATH, label, body, [UPSTREAM_READER])


def learn_defaults(
    session: Session, served: FoundPath, raw: Exchange
) -> tuple[Defaults, list[Finding]]:
    base = served.answer.ranking
    assert base is not None
    field = f"{served.path} scores"
    found: list[Finding] = []
    scale: str | None = None
    if raw.ranking is None:
        found.append(unknown(field, f"the candidate does not rerank: {raw.brief()}", [raw]))
    else:
        scale, note = _scale(base.scores, raw.ranking.scores)
        if scale is None:
            problem = (
                "the baseline's scores are neither the candidate's logits nor their sigmoid "
                f"({note}): another model?"
            )
            found.append(unknown(field, problem, [served.answer, raw]))
        else:
            found.append(finding(field, scale, "verified", note, shown=[served.answer, raw]))
    top_n = base.count if base.count < len(DOCUMENTS) else None
    returned = "returned" if base.documents else "not returned"
    summary = f"{base.count} of {len(DOCUMENTS)} results; documents {returned}"
    found.append(finding(f"{served.path} top_n", top_n, "measured", summary, shown=[served.answer]))
    return Defaults(scale, top_n, base.documents), found


def max_model_len(session: Session) -> int | None:
    """The candidate's token limit, from its ``/v1/models``."""
    _, doc = session.get_json("candidate", "/models")
    for entry in doc.get("data", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and type(entry.get("max_model_len")) is int:
            return int(entry["max_model_len"])
    return None


def _scale(base: Mapping[int, float], raw: Mapping[int, float]) -> tuple[str | None, str]:
    if set(base) - set(raw):
        return None, "different documents"
    worst_raw = max(abs(base[i] - raw[i]) for i in base)
    worst_sigmoid = max(abs(base[i] - sigmoid(raw[i])) for i in base)
    note = f"max difference {worst_raw:.2e} to the logits, {worst_sigmoid:.2e} to their sigmoid"
    if worst_raw <= SCORE_TOLERANCE:
        return "RAW", note
    if worst_sigmoid <= SCORE_TOLERANCE:
        return "SIGMOID", note
    return None, note
