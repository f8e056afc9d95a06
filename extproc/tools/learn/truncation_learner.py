"""Truncation: where the baseline cuts a long input, and how - or that it refuses it.

A long text of plain words goes to the baseline (4,096 tokens, then 32,768 if that
was kept whole), with no field: the prompt it gives such inputs (``prefix``, usually
none) is part of what it cuts. Its ``usage.prompt_tokens`` is the limit L. How the
ids were cut is asked of the candidate, which embeds token ids as sent: the framed
ids cut on the right or the left, keeping the special tokens or cutting them too;
the one whose vector equals the baseline's is how it cuts. The cut point is then
found a second way, from the baseline's vectors alone: the start (or, for a cut on
the left, the end) of the text whose vector equals the long text's is where the cut
falls, tried around L first and searched by bisection when it is not there.

A baseline that refuses the long text refuses long inputs: the longest it accepts is
found by bisection on status (``truncation.refuse``; its status is the errors'
``too_long``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Confidence, Finding, cos, finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.session import Exchange, Session, first_true
from extproc.tools.toolkit.long_text import plain_words

LONG_SIZES = (4096, 32768)


@dataclass(frozen=True)
class Cut:
    """One way of cutting framed ids to L (policy.proto's ``Truncation``)."""

    name: str
    side: str  # RIGHT or LEFT
    keep_special_tokens: bool

    def ids(self, basics: Basics, content: list[int], limit: int) -> list[int]:
        layout = basics.layout
        if self.keep_special_tokens:
            room = limit - layout.count
            kept = content[:room] if self.side == "RIGHT" else content[len(content) - room :]
            return layout.frame(kept)
        framed = layout.frame(content)
        return framed[:limit] if self.side == "RIGHT" else framed[len(framed) - limit :]

    def policy(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.side == "RIGHT" else {"side": self.side}
        return out | ({} if self.keep_special_tokens else {"keep_special_tokens": False})


CUTS = (
    Cut("the first tokens, the special tokens kept", "RIGHT", True),
    Cut("the first tokens of the framed ids (the end tokens lost)", "RIGHT", False),
    Cut("the last tokens, the special tokens kept", "LEFT", True),
    Cut("the last tokens of the framed ids (the start tokens lost)", "LEFT", False),
)


@dataclass
class LearnedTruncation:
    max_tokens: int | None
    policy: dict[str, Any] = field(default_factory=dict)  # the policy's `truncation`
    findings: list[Finding] = field(default_factory=list)
    refused: Exchange | None = None  # the baseline's refusal of a long input


def learn_truncation(
    session: Session,
    local: LocalModel,
    basics: Basics,
    candidate_max: int | None,
    prefix: str = "",
) -> LearnedTruncation:
    session.note("learn: truncation (a long input, how it is cut, the cut point)")
    specials = basics.layout.count
    shown: list[Exchange] = []

    def ask(text: str, label: str) -> Exchange:
        shown.append(session.send("baseline", label, {"model": basics.model, "input": [text]}))
        return shown[-1]

    for size in LONG_SIZES:
        text = plain_words(size)
        prompted = prefix + text
        content = local.ids(prompted)
        whole = ask(text, f"long input ({len(content):,} tokens)")
        if not whole.ok:
            return _refuses_long(
                local, ask, prompted, prefix, basics, candidate_max=candidate_max, refusal=whole
            )
        if whole.prompt_tokens is None or whole.prompt_tokens < len(content) + specials:
            break
    else:
        return _never_cut(shown, candidate_max)

    def ask_head(tokens: int) -> Exchange:
        head, got = local.head(prompted, tokens)
        return ask(head[len(prefix) :], f"first {got:,} tokens of the long input")

    def ask_tail(tokens: int) -> Exchange:
        tail, got = local.tail(text, tokens)
        return ask(tail, f"last {got:,} tokens of the long input")

    limit = whole.prompt_tokens
    searched: tuple[int, str] | None = None  # (tokens kept, side), by the baseline's vectors
    if limit is None:  # no usage: the cut point from vectors alone
        kept = _cut_point(lambda n: ask_head(n).same_as(whole), None, len(content))
        searched = None if kept is None else (kept, "RIGHT")
        limit = None if kept is None else kept + specials
    if limit is None:
        return LearnedTruncation(
            None, findings=[unknown("max_tokens", "the baseline reports no usage", shown)]
        )
    if candidate_max is not None and limit > candidate_max:
        problem = f"the baseline keeps {limit} tokens; the candidate takes at most {candidate_max}"
        found = finding("max_tokens", limit, "measured", problem, shown=shown, problem=problem)
        return LearnedTruncation(limit, findings=[found])
    body = {"model": basics.upstream_model}
    tries = session.send_all(
        [
            ("candidate", f"ids of {c.name}", {**body, "input": c.ids(basics, content, limit)})
            for c in CUTS
        ]
    )
    shown += tries
    cosines = {c.name: whole.cosine_to(t) or -1.0 for c, t in zip(CUTS, tries, strict=True)}
    best = max(CUTS, key=lambda c: cosines[c.name])
    notes = [
        f"usage: {whole.prompt_tokens} tokens kept of {len(content) + specials:,}",
        *(f"candidate, ids of {name}: cosine {cos(value)}" for name, value in cosines.items()),
    ]
    if cosines[best.name] < EQUIVALENT:
        problem = f"the baseline keeps {limit} tokens; no known way of cutting gives its vector"
        return LearnedTruncation(limit, findings=[unknown("max_tokens", problem, shown)])
    # The same cut seen from the baseline alone: the fewest tokens of the text's start
    # (or end) whose vector is the long text's. A cut on the left takes the prompt first,
    # which the baseline would put back: then only the candidate tells.
    lost = best.name if not best.keep_special_tokens else ""
    expected = limit - (
        len(basics.layout.prepend) if best.side == "RIGHT" else len(basics.layout.append)
    )
    expected = expected if lost else limit - specials
    if searched is None and (best.side == "RIGHT" or not prefix):
        ask_side = ask_head if best.side == "RIGHT" else ask_tail
        kept = _cut_point(lambda n: ask_side(n).same_as(whole), expected, len(content))
        searched = None if kept is None else (kept, best.side)
    if searched is not None:
        end = "first" if searched[1] == "RIGHT" else "last"
        notes.append(
            f"vectors: the baseline's answer for the {end} {searched[0]} tokens "
            "equals the long input's"
        )
    confidence: Confidence = "verified" if searched == (expected, best.side) else "measured"
    summary = f"{limit} tokens: {best.name}"
    return LearnedTruncation(
        limit,
        best.policy(),
        [finding("max_tokens", limit, confidence, summary, shown=shown, notes=notes)],
    )


def _cut_point(same: Callable[[int], bool], guess: int | None, total: int) -> int | None:
    """The fewest tokens whose part of the text gives the long text's vector: around
    ``guess`` first, else by bisection over 1..total (None: no part does)."""
    if guess is not None and 1 < guess < total and not same(guess - 1):
        if same(guess):
            return guess
        if same(guess + 1):
            return guess + 1
    cut = first_true(same, 0, total)  # same(total): the text itself
    return cut if cut < total else None


def _refuses_long(
    local: LocalModel,
    ask: Callable[[str, str], Exchange],
    prompted: str,
    prefix: str,
    basics: Basics,
    *,
    candidate_max: int | None,
    refusal: Exchange,
) -> LearnedTruncation:
    """The baseline refuses long inputs: the longest it accepts, by bisection on status."""
    shown = [refusal]

    def refused(tokens: int) -> bool:
        head, got = local.head(prompted, tokens)
        shown.append(ask(head[len(prefix) :], f"first {got:,} tokens of the long input"))
        return not shown[-1].ok

    total = len(local.ids(prompted))
    limit = first_true(refused, local.count(prefix), total) - 1 + basics.layout.count
    if candidate_max is not None and limit > candidate_max:
        problem = f"the baseline accepts {limit} tokens; the candidate at most {candidate_max}"
        return LearnedTruncation(limit, findings=[unknown("max_tokens", problem, shown)])
    summary = f"{limit} tokens, longer inputs refused ({refusal.status})"
    return LearnedTruncation(
        limit,
        {"refuse": True},
        [finding("max_tokens", limit, "measured", summary, shown=shown)],
        refusal,
    )


def _never_cut(shown: list[Exchange], candidate_max: int | None) -> LearnedTruncation:
    longest = shown[-1].prompt_tokens
    if candidate_max is None or longest is None or candidate_max < longest:
        problem = f"the baseline embeds {longest} tokens whole; the candidate takes {candidate_max}"
        return LearnedTruncation(candidate_max, findings=[unknown("max_tokens", problem, shown)])
    summary = f"not cut at {longest} tokens: the candidate's {candidate_max}"
    found = finding("max_tokens", candidate_max, "measured", summary, shown=shown)
    return LearnedTruncation(candidate_max, findings=[found])
