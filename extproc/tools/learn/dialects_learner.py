"""Which embeddings dialects the baseline serves besides the one learn speaks to it.

Each path of each dialect with a shape of its own (TEI's ``/embed`` and ``/``,
Cohere's ``/v1/embed`` and ``/v2/embed``, Ollama's ``/api/embed`` and
``/api/embeddings``) is asked the plain text, said as that dialect's clients say it;
a path whose answer those clients read serves the dialect. Its vector is held against
the plain answer's: another direction is another contract (named), another norm is a
path that answers the vectors as the model pools them (``normalized: false``:
Ollama's older route). The dialect learn speaks is asked at its other paths (TEI's
``/`` beside ``/embed``), which take the errors learned for it. Jina's shares
OpenAI's path and requests and is not told apart here. Every dialect found becomes
one of the model's ``serves``, so none of its clients stays on the legacy server by
accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extproc.core.dialects import EMBEDDINGS_DIALECTS
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.runtime.blocking_http import split_url
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.session import Exchange, Session

NORM_TOLERANCE = 1e-3  # a unit vector's norm, within what the servers' floats allow
SAME_DIRECTION = 0.9999  # one model's vector for one text, said two ways


@dataclass(frozen=True)
class FoundDialect:
    """A dialect the baseline serves, where, and how its vectors compare."""

    dialect: EmbeddingsDialect
    paths: tuple[str, ...]
    normalized: bool
    answer: Exchange

    def serves(self, errors: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The model's ``serves`` items: one a path (the dialect's first goes unsaid),
        with ``errors`` where learn learned the dialect's own."""
        items: list[dict[str, Any]] = []
        for path in self.paths:
            item: dict[str, Any] = {"dialect": self.dialect.name.upper()}
            if path != self.dialect.paths[0]:
                item["path"] = path
            if not self.normalized:
                item["normalized"] = False
            if errors:
                item["errors"] = errors
            items.append(item)
        return items


def learn_dialects(
    session: Session, model: str, text: str, plain: Exchange
) -> tuple[list[FoundDialect], list[Finding]]:
    """The dialects served, from ``text`` asked at every path (``plain``: its answer
    as learn's own dialect read it)."""
    session.note("learn: the embeddings dialects the baseline serves")
    spoken = session.dialects["baseline"]
    learned_at = split_url(session.endpoints["baseline"])[1]
    asked: list[Exchange] = []
    found: list[FoundDialect] = []
    findings: list[Finding] = []
    for dialect in EMBEDDINGS_DIALECTS.values():
        if not dialect.own_shape:
            continue
        paths: list[str] = []
        answer: Exchange | None = None
        for path in dialect.paths:
            if dialect is spoken and path == learned_at:
                continue  # learned there already
            body = {"model": model, "input": [text]}
            exchange = session.ask("baseline", path, f"{dialect.name} at {path}", body, dialect)
            asked.append(exchange)
            if exchange.vectors is not None:
                paths.append(path)
                answer = answer or exchange
        if answer is None:
            continue
        cosine = answer.cosine_to(plain)
        normalized = answer.norm is not None and abs(answer.norm - 1.0) <= NORM_TOLERANCE
        problem = ""
        if cosine is None or cosine < SAME_DIRECTION:
            problem = f"its vector is not the plain answer's (cosine {cosine})"
        found.append(FoundDialect(dialect, tuple(paths), normalized, answer))
        summary = f"{', '.join(paths)}: {answer.brief()}, norm {answer.norm:.4f}"
        findings.append(
            finding(
                f"serves {dialect.name}",
                found[-1].serves(),
                "measured",
                summary,
                shown=[answer],
                problem=problem,
            )
        )
    if not found:
        summary = f"none of {len(asked)} paths answers in another dialect"
        findings.append(finding("serves", [], "measured", summary, shown=asked[:1]))
    return found, findings
