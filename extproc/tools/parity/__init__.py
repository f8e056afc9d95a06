"""What the tools share to judge two servers: their answers to the same request,
read and compared, and the verdict model.

``answer_comparison`` reads an embeddings answer with the core's parsers
(:class:`Answer`) and compares two of them (status class, vector count, cosine,
dimensions and norm per input, ``usage.prompt_tokens``); ``rerank_comparison`` reads
a rerank reply in the dialect the caller names and compares two as its client sees
them; ``json_shape`` compares two bodies as a client's code reads them (keys, their
order, the values' types); ``readiness_verdict`` holds the thresholds, checks and exit
codes every tool reports. Pure: no I/O.
"""

from extproc.tools.parity.answer_comparison import (
    Answer,
    Comparison,
    InputComparison,
    Tolerances,
    compare_answers,
    compare_inputs,
    cosine,
)
from extproc.tools.parity.readiness_verdict import (
    Check,
    ExitCode,
    Thresholds,
    Verdict,
    cosine_check,
    rerank_check,
)

__all__ = [
    "Answer",
    "Check",
    "Comparison",
    "ExitCode",
    "InputComparison",
    "Thresholds",
    "Tolerances",
    "Verdict",
    "compare_answers",
    "compare_inputs",
    "cosine",
    "cosine_check",
    "rerank_check",
]
