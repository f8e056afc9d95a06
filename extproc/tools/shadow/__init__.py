"""Shadow mode: prove on live traffic that the candidate answers like the baseline.

Envoy mirrors embeddings requests (and, with a rerank candidate, the policy's rerank
paths) to a second listener; observability-mode ext_proc taps on both send copies of
each exchange (``tap``) to one comparator (`extproc shadow-compare`), which pairs the
two halves by `x-request-id`, compares them input by input (with
:mod:`extproc.tools.parity`) and serves a summary, Prometheus metrics and a verdict
(`extproc shadow-report`). `extproc shadow` runs it all on one machine
(``shadow_launcher``, with the Envoy config ``envoy_render`` writes; the command lines:
:mod:`extproc.commands.shadow`).

The core is sans-I/O: ``half`` (bodies -> :class:`Half`, the path looked up in the
policy's routes), ``pair_comparison`` (halves -> :class:`PairResult`), ``store`` (the
halves waiting for their pair), ``tally`` (running totals), ``summary`` (the JSON and
the verdict); ``comparator`` runs them with its ``comparator_metrics``, and
``comparator_server`` serves it. ``shadow_report`` renders a running comparator's
summary, with the toolkit's Markdown tables (:mod:`extproc.tools.toolkit.report_format`).
"""

from extproc.tools.shadow.half import Half, InputKind, RawHalf, Role, extract_half
from extproc.tools.shadow.pair_comparison import (
    InputResult,
    PairResult,
    ShadowTolerances,
    compare_pair,
)
from extproc.tools.shadow.store import Completed, Dropped, PairStore, StoreLimits
from extproc.tools.shadow.summary import judge, summarize
from extproc.tools.shadow.tally import Tally

__all__ = [
    "Completed",
    "Dropped",
    "Half",
    "InputKind",
    "InputResult",
    "PairResult",
    "PairStore",
    "RawHalf",
    "Role",
    "ShadowTolerances",
    "StoreLimits",
    "Tally",
    "compare_pair",
    "extract_half",
    "judge",
    "summarize",
]
