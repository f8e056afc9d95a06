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

from dataclasses import dataclass, replace

import numpy as np

from extproc.core.policy.presets import presets
from extproc.core.vectors import truncate_renormalise
from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Server, Session, first_true

NORM_TOLERANCE = 1e-3
FIELD = "upstream.native.dimensions"


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
    shown = list(answers.values())
    notes = [f"refused: {_statuses({d: a.status for d, a in answers.items() if not a.ok})}"]
    if not accepted or accepted == [native]:
        summary = f"not Matryoshka: {'only ' + str(native) if accepted else 'no size'} accepted"
        warning = "" if accepted else f"the baseline refuses {native}; the gateway accepts it"
        return Dimensions(), [
            finding("matryoshka", None, "measured", summary, shown=shown, warning=warning),
            finding(FIELD, False, "default", "nothing to cut"),
        ]
    problem = ""
    value: dict[str, object]
    if any(d in accepted for d in odd - shipped - powers):

        def ok(size: int) -> bool:
            (answer,) = _ask(session, "baseline", basics, [size])
            shown.append(answer)
            return answer.ok

        below = max((d for d in first if d < accepted[0]), default=0)
        low = first_true(ok, below, accepted[0])
        inside = sorted({low + (native - low) // 3, low + 2 * (native - low) // 3} - set(first))
        holes = [d for d in inside if not ok(d)]
        learned, value = Dimensions(min_dimensions=low), {"min_dimensions": low}
        summary = f"a range: {low}..{native}"
        problem = f"sizes inside {low}..{native} refused: {holes}" if holes else ""
    else:
        learned, value = Dimensions(allowed=tuple(accepted)), {"allowed": accepted}
        summary = f"a set: {accepted} (of the {len(first)} sizes asked; others assumed refused)"
    for d in [d for d in accepted if d != native][:2]:
        same, note = _is_cut(answers[native], answers[d], d)
        notes.append(note)
        problem = problem or ("" if same else f"dimensions {d}: {note}; the gateway's cut differs")
    found = [
        finding("matryoshka", value, "verified", summary, shown=shown, notes=notes, problem=problem)
    ]
    native_cut, capability = _candidate_cuts(session, basics, learned)
    return replace(learned, native_cut=native_cut), [*found, capability]


def _ask(session: Session, server: Server, basics: Basics, sizes: list[int]) -> list[Exchange]:
    model = basics.model if server == "baseline" else basics.upstream_model
    body = {"model": model, "input": [TEXT]}
    return session.send_all([(server, f"dimensions {d}", {**body, "dimensions": d}) for d in sizes])


def _is_cut(whole: Exchange, answer: Exchange, size: int) -> tuple[bool, str]:
    """Is ``answer`` the ``size``-d cut of ``whole``'s vector, re-normalised (the
    gateway's emulation)? And a note saying how close it is."""
    if whole.vectors is None or answer.vectors is None or answer.dims != size:
        return False, f"dimensions {size}: {answer.brief()}"
    expected = truncate_renormalise(whole.vectors[:1], size)[0]
    norm = float(np.linalg.norm(answer.vectors[0]))
    value = float(np.dot(expected, answer.vectors[0]) / (norm or 1.0))
    note = f"dimensions {size}: cosine {cos(value)} to the emulated cut, norm {norm:.6f}"
    return value >= EQUIVALENT and abs(norm - 1.0) <= NORM_TOLERANCE, note


def _candidate_cuts(session: Session, basics: Basics, learned: Dimensions) -> tuple[bool, Finding]:
    """Does the candidate cut itself, as the gateway would, at the sizes that matter?"""
    sizes = learned.sizes(basics.native)
    answers = _ask(session, "candidate", basics, sizes)
    notes = []
    for size, answer in zip(sizes, answers, strict=True):
        same, note = _is_cut(basics.plain_candidate, answer, size)
        notes.append(note)
        if not same:
            return False, finding(
                FIELD,
                False,
                "verified",
                f"no: {note}; the gateway cuts",
                shown=answers,
                notes=notes,
            )
    summary = f"yes: {sizes} answered, each equal to the emulated cut"
    return True, finding(FIELD, True, "verified", summary, shown=answers, notes=notes)


def _statuses(refused: dict[int, int]) -> str:
    by_status: dict[int, list[int]] = {}
    for d, status in sorted(refused.items()):
        by_status.setdefault(status, []).append(d)
    return "; ".join(f"{s}: {sizes}" for s, sizes in sorted(by_status.items())) or "none"
