"""Truncation: where the baseline cuts a long input, and how.

A long text of plain words goes to the baseline (4,096 tokens, then 32,768 if that
was kept whole). Its ``usage.prompt_tokens`` is the limit L. The cut point is then
found a second way, from vectors alone: the shortest start of the text (cut where a
token ends) whose baseline vector equals the long text's is where the cut falls,
tried first around L and searched by bisection if it is not there. How the ids end
is settled on the candidate, which embeds token ids as sent: the head with the
special tokens kept (what the gateway sends), the first L ids with the end token
lost, or the tail; the one whose vector equals the baseline's is how it cuts.
"""

from __future__ import annotations

from collections.abc import Callable

from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Confidence, Finding, cos, finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.session import Exchange, Session, first_true

LONG_SIZES = (4096, 32768)
KEEP = "the first tokens and the special tokens"
LOSE = "the first tokens of the framed ids (the end token lost)"
TAIL = "the last tokens"


def learn_truncation(
    session: Session, local: LocalModel, basics: Basics, candidate_max: int | None
) -> tuple[int | None, list[Finding]]:
    session.note("learn: truncation (a long input, the cut point, the end token)")
    specials = basics.layout.count
    shown: list[Exchange] = []

    def ask(text: str, label: str) -> Exchange:
        shown.append(session.send("baseline", label, {"model": basics.model, "input": [text]}))
        return shown[-1]

    def ask_head(tokens: int) -> Exchange:
        head, got = local.head(text, tokens)
        return ask(head, f"first {got:,} tokens of the long input")

    for size in LONG_SIZES:
        text = local.long_text(size)
        content = local.ids(text)
        whole = ask(text, f"long input ({len(content):,} tokens)")
        if not whole.ok:
            return _refuses_long(ask_head, len(content), specials, shown, candidate_max)
        if whole.prompt_tokens is None or whole.prompt_tokens < len(content) + specials:
            break
    else:
        return _never_cut(shown, candidate_max)

    def same(tokens: int) -> bool:
        return ask_head(tokens).same_as(whole)

    guess = None if whole.prompt_tokens is None else whole.prompt_tokens - specials
    kept = _cut_point(same, guess, len(content))
    limit = whole.prompt_tokens if whole.prompt_tokens is not None else (kept or 0) + specials
    hypotheses = {
        KEEP: basics.framed(content[: limit - specials]),
        LOSE: basics.framed(content)[:limit],
        TAIL: basics.framed(content[len(content) - (limit - specials) :]),
    }
    # The search's answer, from the baseline alone (same server, same ids: exact).
    searched = {limit - len(basics.layout.prepend): LOSE, limit - specials: KEEP}.get(kept or -1)
    if candidate_max is not None and limit > candidate_max:
        problem = f"the baseline keeps {limit} tokens; the candidate takes at most {candidate_max}"
        summary = f"{limit} tokens: {searched or 'cut'} (by the search)"
        return limit, [
            finding("max_tokens", limit, "measured", summary, shown=shown, problem=problem)
        ]
    body = {"model": basics.upstream_model}
    tries = session.send_all(
        [
            ("candidate", f"ids of {name}", {**body, "input": ids})
            for name, ids in hypotheses.items()
        ]
    )
    shown += tries
    cosines = {name: whole.cosine_to(t) or -1.0 for name, t in zip(hypotheses, tries, strict=True)}
    notes = [
        f"usage: {whole.prompt_tokens} tokens kept of {len(content) + specials:,}",
        f"vectors: the baseline's answer for the first {kept} tokens equals the long input's"
        if kept
        else "vectors: no start of the input gives the long input's vector",
        *(f"candidate, ids of {name}: cosine {cos(value)}" for name, value in cosines.items()),
    ]
    best = max(cosines, key=lambda name: cosines[name])
    how = searched if searched and cosines[searched] >= EQUIVALENT else best
    if cosines[how] < EQUIVALENT:
        problem = f"the baseline keeps {limit} tokens; no known way of cutting gives its vector"
        return limit, [unknown("max_tokens", problem, shown)]
    confidence: Confidence = "verified" if how == searched else "measured"
    problem = "" if how == KEEP else f"the baseline keeps {how}; the gateway keeps {KEEP}"
    summary = f"{limit} tokens: {how}" + (" (the end token kept)" if how == KEEP else "")
    return limit, [
        finding("max_tokens", limit, confidence, summary, shown=shown, notes=notes, problem=problem)
    ]


def _cut_point(same: Callable[[int], bool], guess: int | None, total: int) -> int | None:
    """The fewest tokens whose start of the text gives the long text's vector: around
    ``guess`` first, else by bisection over 1..total (None: no start does)."""
    if guess is not None and 1 < guess < total and not same(guess - 1):
        if same(guess):
            return guess
        if same(guess + 1):
            return guess + 1
    cut = first_true(same, 0, total)  # same(total): the text itself
    return cut if cut < total else None


def _refuses_long(
    ask_head: Callable[[int], Exchange],
    total: int,
    specials: int,
    shown: list[Exchange],
    candidate_max: int | None,
) -> tuple[int | None, list[Finding]]:
    """The baseline refuses long inputs: the longest it accepts, by bisection on status."""
    limit = first_true(lambda tokens: not ask_head(tokens).ok, 0, total) - 1 + specials
    if candidate_max is not None and limit > candidate_max:
        problem = f"the baseline accepts {limit} tokens; the candidate at most {candidate_max}"
        return limit, [unknown("max_tokens", problem, shown)]
    problem = f"the baseline refuses inputs over {limit} tokens; the gateway cuts them"
    summary = f"{limit} tokens, longer inputs refused"
    return limit, [finding("max_tokens", limit, "measured", summary, shown=shown, problem=problem)]


def _never_cut(
    shown: list[Exchange], candidate_max: int | None
) -> tuple[int | None, list[Finding]]:
    longest = shown[-1].prompt_tokens
    if candidate_max is None or longest is None or candidate_max < longest:
        problem = f"the baseline embeds {longest} tokens whole; the candidate takes {candidate_max}"
        return candidate_max, [unknown("max_tokens", problem, shown)]
    summary = f"not cut at {longest} tokens: the candidate's {candidate_max}"
    return candidate_max, [finding("max_tokens", candidate_max, "measured", summary, shown=shown)]
