"""What a client of a rerank dialect sends, built only from the dialect's own writer
(``write_request``) and what it says its clients may ask (``client_options``,
``cut_option``, ``names_model``): the contract requests the probe's rerank run and
learn's verification send to both servers, each compared by
:func:`extproc.tools.parity.rerank_comparison.compare_replies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from extproc.core.tasks.rerank import RerankDialect
from extproc.tools.toolkit.contract_table import UNKNOWN_MODEL
from extproc.tools.toolkit.long_text import plain_words

MALFORMED = b'{"query": '


def rerank_requests(
    dialect: RerankDialect,
    model: str,
    query: str,
    documents: Sequence[str],
    max_tokens: int | None = None,
) -> dict[str, dict[str, Any] | bytes]:
    """What a client of ``dialect`` can send, by label: a plain request, the dialect's
    options, the client mistakes and, given the limit, a pair over it."""
    docs = list(documents)
    bodies: dict[str, dict[str, Any] | bytes] = {
        "plain": dialect.write_request(model, query, docs),
        "malformed JSON": MALFORMED,
        "no documents": dialect.write_request(model, query, ()),
    }
    for label, options in dialect.client_options.items():
        bodies[label] = dialect.write_request(model, query, docs, **options)
    if dialect.names_model:
        bodies["unknown model"] = dialect.write_request(UNKNOWN_MODEL, query, docs[:2])
    if max_tokens is not None:
        long = (docs[0], plain_words(max_tokens + 64))
        bodies["a pair over the limit"] = dialect.write_request(model, query, long)
        if dialect.cut_option is not None:
            bodies["a pair over the limit, truncate"] = dialect.write_request(
                model, query, long, **dialect.cut_option
            )
    return bodies
