"""Which rerank dialects the baseline speaks, and at which paths.

Each known path (``/rerank``, ``/v1/rerank``, ``/v2/rerank``) is asked in each
dialect's request shape until one answer is read as a rerank answer; the path then
speaks that dialect. A path's version names Cohere's (v2 at ``/v2/...``); an answer
without Cohere's ``meta`` at a path that takes Cohere's request is Jina's. Every path
found becomes an entry of its own, so none of its clients stays on the legacy server
by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.core.dialects import RERANK_DIALECTS
from extproc.core.tasks.rerank import RerankDialect
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.learn.session import Exchange, Session

QUERY = "how do I reset a forgotten password"
DOCUMENTS = (
    "To reset a forgotten password, open the sign-in page and choose 'Forgot password'.",
    "Our offices are closed on public holidays.",
    "Passwords must have at least twelve characters.",
    "The mobile app can scan receipts.",
)
# The paths asked, and at each the request shapes tried in turn, each with the
# dialects whose answers it may get (Cohere's v1 request is Jina's too).
PROBES: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    ("/rerank", (("tei", ("tei",)), ("cohere_v1", ("cohere_v1", "jina")))),
    ("/v1/rerank", (("cohere_v1", ("cohere_v1", "jina")), ("tei", ("tei",)))),
    ("/v2/rerank", (("cohere_v2", ("cohere_v2",)),)),
)


@dataclass(frozen=True)
class FoundPath:
    """One path the baseline serves, in one dialect, and its plain answer."""

    path: str
    dialect: RerankDialect
    answer: Exchange


def learn_paths(session: Session, model: str) -> tuple[list[FoundPath], list[Finding]]:
    session.note("learn: the rerank paths and dialects the baseline serves")
    served: list[FoundPath] = []
    tried: list[Exchange] = []
    for path, shapes in PROBES:
        for name, answers in shapes:
            body = RERANK_DIALECTS[name].write_request(model, QUERY, DOCUMENTS)
            readers = [RERANK_DIALECTS[a] for a in answers]
            exchange = session.post("baseline", path, f"{name} request", body, readers)
            tried.append(exchange)
            if exchange.ranking is not None:
                served.append(FoundPath(path, RERANK_DIALECTS[exchange.read_as], exchange))
                break
    if not served:
        problem = "the baseline answers none of the rerank dialects (TEI, Cohere v1/v2, Jina)"
        return [], [unknown("dialect", problem, tried)]
    return served, [
        finding(
            f"{s.path} dialect",
            s.dialect.name.upper(),
            "measured",
            f"{s.dialect.name.upper()} at {s.path}",
            shown=[s.answer],
        )
        for s in served
    ]
