"""Shadow mode: prove on live traffic that the candidate answers like the baseline.

Envoy mirrors embeddings requests to a second listener; observability-mode
ext_proc taps on both send copies of each exchange to one comparator
(``extproc shadow-compare``), which pairs the two halves by ``x-request-id``,
compares them input by input (with :mod:`extproc.tools.parity`) and serves a
summary, Prometheus metrics and a verdict (``extproc shadow-report``).
``extproc shadow`` runs it all on one machine.

The core is sans-I/O: :func:`extract_half` (bodies -> :class:`Half`),
:func:`compare_pair` (halves -> :class:`PairResult`), :class:`PairStore`,
:class:`Tally`, :func:`summarize` and :func:`judge`.
"""

from extproc.tools.shadow.compare import InputResult, PairResult, Tolerances, compare_pair
from extproc.tools.shadow.half import Half, InputKind, RawHalf, Role, extract_half
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
    "StoreLimits",
    "Tally",
    "Tolerances",
    "compare_pair",
    "extract_half",
    "judge",
    "summarize",
]
