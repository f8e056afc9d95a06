"""Shadow mode: prove on live traffic that the candidate answers like the baseline.

Envoy mirrors embeddings requests to a second listener; observability-mode
ext_proc taps on both send copies of each exchange to a comparator
(``extproc shadow-compare``), which pairs the two halves by ``x-request-id``,
compares them input by input and serves a summary, Prometheus metrics and a
verdict (``extproc shadow-report``). ``extproc shadow`` runs it all on one machine.

The core is sans-I/O: :func:`extract_half` (bodies -> :class:`Half`),
:func:`compare_pair` (halves -> :class:`PairResult`), :class:`PairStore`,
:class:`Tally`, :func:`summarize` and :func:`judge`.
"""

from extproc.tools.shadow.compare import (
    InputResult,
    PairResult,
    Tolerances,
    compare_pair,
    status_class,
)
from extproc.tools.shadow.half import Half, InputKind, RawHalf, Role, extract_half
from extproc.tools.shadow.ownership import PeerSpec, owner, parse_peers
from extproc.tools.shadow.store import Completed, Dropped, PairStore, StoreLimits
from extproc.tools.shadow.summary import summarize
from extproc.tools.shadow.tally import Tally
from extproc.tools.shadow.verdict import Check, Thresholds, Verdict, judge

__all__ = [
    "Check",
    "Completed",
    "Dropped",
    "Half",
    "InputKind",
    "InputResult",
    "PairResult",
    "PairStore",
    "PeerSpec",
    "RawHalf",
    "Role",
    "StoreLimits",
    "Tally",
    "Thresholds",
    "Tolerances",
    "Verdict",
    "compare_pair",
    "extract_half",
    "judge",
    "owner",
    "parse_peers",
    "status_class",
    "summarize",
]
