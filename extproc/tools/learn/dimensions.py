"""Matryoshka: which ``dimensions`` the baseline accepts, what it answers for them,
and whether the candidate cuts them itself.

A first round asks for the native size, sizes around it and its half, 0, 1 and the
powers of two and every preset's allowed sizes. A size that is neither a power of
two nor a preset's (native - 1, half + 1) accepted means a range: its lower end is
found by bisection and a few sizes inside it are checked. Otherwise the accepted
sizes of the first round are the set (sizes not asked are assumed refused, and the
report says so). An accepted cut must be the native vector's first components,
re-normalised (what the gateway computes). The candidate is then asked for the
range's ends (or every allowed size): answers equal to the emulated cut of its own
native vector mean it cuts itself (``upstream.native.dimensions: true``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extproc.core.policy.presets import presets
from extproc.core.vectors import truncate_renormalise
from extproc.tools.learn.basics import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Server, Session

NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Dimensions:
    min_dimensions: int | None = None  # a range min..native
    allowed: tuple[int, ...] = ()  # or a set (native included)
    native_cut: bool = False  # the candidate cuts itself

    @property
    def matryoshka(self) -> bool:
        return self.min_dimensions is not None or len(self.allowed) > 1

    def sizes(self, native: int) -> list[int]:
        """The sizes to check on the candidate: the range's ends, or the set."""
        if self.min_dimensions is not None:
            return sorted({self.min_dimensions, (self.min_dimensions + native) // 2, native - 1})
        return [d for d in self.allowed if d != native]


def learn_dimensions(session: Session, basics: Basics) -> tuple[Dimensions, list[Finding]]:
    session.note("learn: Matryoshka dimensions")
    native = basics.native
    powers = {2**k for k in range(12) if 2**k < native}
    shipped = {d for p in presets().values() for d in p.matryoshka.allowed if d < native}
    odd = {native - 1, native // 2 + 1}
    first = sorted({0, 1, native, native + 1, *powers, *shipped, *odd})
    answers = dict(zip(first, _ask(session, "baseline", basics, first), strict=True))
    accepted = sorted(d for d, a in answers.items() if a.ok)
    refused = {d: a.status for d, a in answers.items() if not a.ok}
    shown = list(answers.values())
    notes = [f"refused: {_statuses(refused)}"]
    if not accepted or accepted == [native]:
        warning = (
            ""
            if accepted
            else f"the baseline refuses `dimensions` (even {native}); the gateway accepts {native}"
        )
        summary = f"not Matryoshka: {'only ' + str(native) if accepted else 'no size'} accepted"
        return Dimensions(), [
            finding(
                "matryoshka", None, "measured", summary, shown=shown, notes=notes, warning=warning
            ),
            finding("upstream.native.dimensions", False, "default", "nothing to cut"),
        ]
    if any(d in accepted for d in odd - shipped - powers):
        low = _lowest(session, basics, answers, shown)
        inside = sorted({low + (native - low) // 3, low + 2 * (native - low) // 3} - set(answers))
        checks = _ask(session, "baseline", basics, inside)
        shown += checks
        holes = [d for d, a in zip(inside, checks, strict=True) if not a.ok]
        learned = Dimensions(min_dimensions=low)
        summary = f"a range: {low}..{native}" + (f"; yet {holes} refused" if holes else "")
        value: object = {"min_dimensions": low}
        problem = f"sizes inside {low}..{native} refused: {holes}" if holes else ""
    else:
        learned = Dimensions(allowed=tuple(accepted))
        summary = f"a set: {accepted} (of the {len(first)} sizes asked; others assumed refused)"
        value, problem = {"allowed": accepted}, ""
    cut = [answers[d] for d in accepted if d != native][:2]
    problem = problem or _renormalised(cut, answers[native], notes)
    found = [
        finding("matryoshka", value, "verified", summary, shown=shown, notes=notes, problem=problem)
    ]
    native_cut, capability = _candidate_cuts(session, basics, learned)
    found.append(capability)
    return Dimensions(learned.min_dimensions, learned.allowed, native_cut), found


def _ask(session: Session, server: Server, basics: Basics, sizes: list[int]) -> list[Exchange]:
    model = basics.model if server == "baseline" else basics.upstream_model
    body = {"model": model, "input": [TEXT]}
    return session.send_all([(server, f"dimensions {d}", {**body, "dimensions": d}) for d in sizes])


def _lowest(
    session: Session, basics: Basics, answers: dict[int, Exchange], shown: list[Exchange]
) -> int:
    """The smallest accepted size, by bisection between the largest refused one below
    the smallest accepted and that accepted one."""
    high = min(d for d, a in answers.items() if a.ok)
    low = max((d for d, a in answers.items() if not a.ok and d < high), default=0)
    while high - low > 1:
        middle = (low + high) // 2
        (answer,) = _ask(session, "baseline", basics, [middle])
        shown.append(answer)
        low, high = (middle, high) if not answer.ok else (low, middle)
    return high


def _renormalised(cuts: list[Exchange], whole: Exchange, notes: list[str]) -> str:
    """'' when every cut is the native vector's head, re-normalised; else why not."""
    assert whole.vectors is not None
    for cut in cuts:
        assert cut.vectors is not None and cut.dims is not None
        expected = truncate_renormalise(whole.vectors[:1], cut.dims)
        value = float(np.dot(expected[0], cut.vectors[0]) / (np.linalg.norm(cut.vectors[0]) or 1.0))
        notes.append(
            f"{cut.label}: norm {cut.norm:.6f}, cosine {cos(value)} to the native vector's head"
        )
        if value < EQUIVALENT:
            return f"{cut.label}: not the native vector's first components (cosine {cos(value)})"
        if cut.norm is not None and abs(cut.norm - 1.0) > NORM_TOLERANCE:
            norm = f"{cut.norm:.4f}"
            return f"{cut.label}: the cut is not re-normalised (norm {norm}); the gateway's is"
    return ""


def _candidate_cuts(session: Session, basics: Basics, learned: Dimensions) -> tuple[bool, Finding]:
    field = "upstream.native.dimensions"
    sizes = learned.sizes(basics.native)
    answers = _ask(session, "candidate", basics, sizes)
    whole = basics.plain_candidate
    assert whole.vectors is not None
    notes = []
    for d, answer in zip(sizes, answers, strict=True):
        if not answer.ok or answer.dims != d or answer.vectors is None:
            summary = f"no: dimensions {d} -> {answer.brief()}; the gateway cuts"
            return False, finding(field, False, "verified", summary, shown=answers)
        expected = truncate_renormalise(whole.vectors[:1], d)[0]
        value = float(
            np.dot(expected, answer.vectors[0]) / (np.linalg.norm(answer.vectors[0]) or 1.0)
        )
        notes.append(
            f"dimensions {d}: cosine {cos(value)} to the emulated cut, norm {answer.norm:.6f}"
        )
        if value < EQUIVALENT or abs((answer.norm or 0.0) - 1.0) > NORM_TOLERANCE:
            summary = f"no: its {d}-d answer is not the emulated cut; the gateway cuts"
            return False, finding(field, False, "verified", summary, shown=answers, notes=notes)
    summary = f"yes: {sizes} answered, each equal to the emulated cut"
    return True, finding(field, True, "verified", summary, shown=answers, notes=notes)


def _statuses(refused: dict[int, int]) -> str:
    by_status: dict[int, list[int]] = {}
    for d, status in sorted(refused.items()):
        by_status.setdefault(status, []).append(d)
    return "; ".join(f"{s}: {sizes}" for s, sizes in sorted(by_status.items())) or "none"
