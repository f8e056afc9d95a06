"""The two servers a tool compares, and how its clients ask them: the baseline (what
clients rely on today), the candidate (what replaces it), the timeout of each socket
operation and the headers every request carries (an API key: never in a report, nor
in this value's repr).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from extproc.tools.toolkit.embeddings_client import DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class ServerPair:
    baseline: str  # a URL; each tool says what it names (a server, an endpoint)
    candidate: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def urls(self) -> dict[str, str]:
        """By role: ``baseline``, ``candidate``."""
        return {"baseline": self.baseline, "candidate": self.candidate}
