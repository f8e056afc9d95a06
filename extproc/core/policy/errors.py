"""The one error a policy (or a preset file) that cannot be served raises."""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy file that cannot be served: which file, which field, why."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        super().__init__(f"{source}: {field}: {reason}")
        self.source = source
        self.field = field
        self.reason = reason
