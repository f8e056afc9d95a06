"""Matryoshka: which ``dimensions`` the baseline accepts, what it answers for them,
and whether the candidate cuts them itself.

A first round asks for the native size, sizes around it and its half, 0, 1 and the
powers of two and every preset's allowed sizes. A size that is neither a power of
two nor a preset's (native - 1, half + 1) accepted means a range: its lower end is
found by bisection, its upper end too when native - 1 is refused, and a few sizes
inside it are checked. Otherwise the accepted sizes of the first round are the set
(sizes not asked are assumed refused, and the report says so). The native size is
accepted or not on its own (``accepts_native``).

An accepted cut must be the plain text's vector (asked without ``dimensions``) cut
to its first components: re-normalised (a norm of 1) or as it is (the norm of those
components, ``renormalise: false``). The candidate is then asked for the range's
ends (or every allowed size): answers equal to the emulated cut of its own native
vector mean it cuts itself (``upstream.native.dimensions: true``); an upstream always
re-normalises, so a cut that is not re-normalised is the gateway's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from extproc.core.policy.presets import presets
from extproc.core.vectors import FloatMatrix, truncate_renormalise
from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Server, Session, first_true

NORM_TOLERANCE = 1e-3
FIELD = "upstream.native.dimensions"


@dataclass(frozen=True)
class Dimensions:
    min_dimensions: int | None = None  # a range min..max (max None: native)
    max_dimensions: int | None = None
    allowed: tuple[int, ...] = ()  # or a set (native not included)
    accepts_native: bool = True
    renormalise: bool = True
    native_cut: bool = False  # the candidate cuts itself
    refused: tuple[Exchange, ...] = field(default=(), compare=False)  # for their status

    @property
    def matryoshka(self) -> bool:
        return self.min_dimensions is not None or bool(self.allowed)

    def sizes(self, native: int) -> list[int]:
        """The sizes to check on the candidate: the range's ends, or the set."""
        if self.min_dimensions is not None:
            top = self.max_dimensions or native - 1
            return sorted({self.min_dimensions, (self.min_dimensions + top) // 2, top})
        return list(self.allowed)

    def policy(self) -> dict[str, Any]:
        """The policy's ``matryoshka`` section."""
        rule: dict[str, Any] = (
            {"min_dimensions": self.min_dimensions}
            if self.min_dimensions is not None
            else {"allowed": list(self.allowed)}
        )
        if self.max_dimensions is not None:
            rule["max_dimensions"] = self.max_dimensions
        if not self.accepts_native:
            rule["accepts_native"] = False
        if not self.renormalise:
            rule["renormalise"] = False
        return rule


def learn_dimensions(session: Session, basics: Basics) -> tuple[Dimensions, list[Finding]]:
    session.note("learn: Matryoshka dimensions")
    native = basics.native
    powers = {2**k for k in range(12) if 2**k < native}
    shipped = {d for p in presets().values() for d in p.matryoshka.allowed if d < native}
    odd = {native - 1, native // 2 + 1}
    first = sorted({0, 1, native, native + 1, *powers, *shipped, *odd})
    answers = dict(zip(first, _ask(session, "baseline", basics, first), strict=True))
    shown = list(answers.values())

    def ok(size: int) -> bool:
        (answer,) = _ask(session, "baseline", basics, [size])
        shown.append(answer)
        answers[size] = answer
        return answer.ok

    accepts_native = answers[native].ok
    below_native = sorted(d for d, a in answers.items() if a.ok and d < native)
    if not below_native:
        summary = (
            f"not Matryoshka: {'only ' + str(native) if accepts_native else 'no size'} accepted"
        )
        warning = "" if accepts_native else f"the baseline refuses {native}; the gateway accepts it"
        refused = _refused(answers)
        return Dimensions(refused=refused), [
            finding("matryoshka", None, "measured", summary, shown=shown, warning=warning),
            finding(FIELD, False, "default", "nothing to cut"),
        ]
    problem = ""
    if any(d in below_native for d in odd - shipped - powers):
        low = first_true(
            ok, max((d for d in first if d < below_native[0]), default=0), below_native[0]
        )
        high: int | None = None
        if not answers[native - 1].ok:
            # the range ends below native - 1: the largest accepted size, by bisection
            top = max(below_native)
            high = first_true(lambda n: not ok(n), top, native - 1) - 1
        end = high or native - 1
        inside = sorted({low + (end - low) // 3, low + 2 * (end - low) // 3} - set(answers))
        holes = [d for d in inside if not ok(d)]
        learned = Dimensions(min_dimensions=low, max_dimensions=high, accepts_native=accepts_native)
        summary = f"a range: {low}..{end}" + (f" and {native}" if accepts_native else "")
        problem = f"sizes inside {low}..{end} refused: {holes}" if holes else ""
    else:
        learned = Dimensions(allowed=tuple(below_native), accepts_native=accepts_native)
        native_too = f" and {native}" if accepts_native else f"; {native} refused"
        summary = (
            f"a set: {below_native}{native_too} "
            f"(of the {len(first)} sizes asked; others assumed refused)"
        )
    notes = [f"refused: {_statuses({d: a.status for d, a in answers.items() if not a.ok})}"]
    renormalise: bool | None = None
    for d in below_native[:2]:
        how, note = _cut_kind(basics.plain, answers[d], d)
        notes.append(note)
        if how is None or (renormalise is not None and how != renormalise):
            problem = problem or f"dimensions {d}: {note}; neither cut the gateway knows"
        elif renormalise is None:
            renormalise = how
    learned = replace(learned, renormalise=renormalise is not False, refused=_refused(answers))
    found = [
        finding(
            "matryoshka",
            learned.policy(),
            "verified",
            summary,
            shown=shown,
            notes=notes,
            problem=problem,
        )
    ]
    if not learned.renormalise:
        reason = (
            "no: the baseline does not re-normalise its cuts, and an upstream does; "
            "the gateway cuts"
        )
        return learned, [*found, finding(FIELD, False, "verified", reason)]
    native_cut, capability = _candidate_cuts(session, basics, learned)
    return replace(learned, native_cut=native_cut), [*found, capability]


def _ask(session: Session, server: Server, basics: Basics, sizes: list[int]) -> list[Exchange]:
    model = basics.model if server == "baseline" else basics.upstream_model
    body = {"model": model, "input": [TEXT]}
    return session.send_all([(server, f"dimensions {d}", {**body, "dimensions": d}) for d in sizes])


def _refused(answers: dict[int, Exchange]) -> tuple[Exchange, ...]:
    """The refused sizes' answers (their status is the errors' ``dimensions``)."""
    return tuple(a for a in answers.values() if not a.ok and a.status)


def _cut_kind(whole: Exchange, answer: Exchange, size: int) -> tuple[bool | None, str]:
    """Is ``answer`` the ``size``-d cut of ``whole``'s vector, re-normalised (True) or
    as it is (False)? None: neither. And a note saying how close it is."""
    if whole.vectors is None or answer.vectors is None or answer.dims != size:
        return None, f"dimensions {size}: {answer.brief()}"
    head: FloatMatrix = whole.vectors[:1, :size]
    expected = truncate_renormalise(whole.vectors[:1], size)[0]
    norm = float(np.linalg.norm(answer.vectors[0]))
    value = float(np.dot(expected, answer.vectors[0]) / (norm or 1.0))
    raw_norm = float(np.linalg.norm(head[0]))
    note = (
        f"dimensions {size}: cosine {cos(value)} to the cut, norm {norm:.6f} "
        f"(the first {size} components' own: {raw_norm:.6f})"
    )
    if value < EQUIVALENT:
        return None, note
    if abs(norm - 1.0) <= NORM_TOLERANCE:
        return True, note
    if abs(norm - raw_norm) <= NORM_TOLERANCE * max(raw_norm, 1e-12):
        return False, note
    return None, note


def _candidate_cuts(session: Session, basics: Basics, learned: Dimensions) -> tuple[bool, Finding]:
    """Does the candidate cut itself, as the gateway would, at the sizes that matter?"""
    sizes = learned.sizes(basics.native)
    answers = _ask(session, "candidate", basics, sizes)
    notes = []
    for size, answer in zip(sizes, answers, strict=True):
        how, note = _cut_kind(basics.plain_candidate, answer, size)
        notes.append(note)
        if how is not True:
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
