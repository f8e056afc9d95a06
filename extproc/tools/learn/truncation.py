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

from extproc.tools.learn.basics import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.session import Exchange, Session

LONG_SIZES = (4096, 32768)


def learn_truncation(
    session: Session, local: LocalModel, basics: Basics, candidate_max: int | None
) -> tuple[int | None, list[Finding]]:
    session.note("learn: truncation (a long input, the cut point, the end token)")
    field = "max_tokens"
    specials = basics.layout.count
    shown: list[Exchange] = []
    for size in LONG_SIZES:
        text = local.long_text(size)
        content = local.ids(text)
        whole = session.send(
            "baseline", f"long input ({len(content):,} tokens)", _body(basics, text)
        )
        shown.append(whole)
        if not whole.ok:
            return _refuses_long(session, local, basics, text, shown, candidate_max)
        if whole.prompt_tokens is None or whole.prompt_tokens < len(content) + specials:
            break
    else:
        return _never_cut(shown, candidate_max)
    guess = None if whole.prompt_tokens is None else whole.prompt_tokens - specials

    def same(tokens: int) -> bool:
        head, got = local.head(text, tokens)
        answer = session.send(
            "baseline", f"first {got:,} tokens of the long input", _body(basics, head)
        )
        shown.append(answer)
        return answer.same_as(whole)

    kept = _cut_point(same, guess, len(content))
    limit = whole.prompt_tokens if whole.prompt_tokens is not None else (kept or 0) + specials
    hypotheses = {
        "the first tokens, special tokens kept": basics.framed(content[: limit - specials]),
        "the first tokens, the end token lost": basics.framed(content)[:limit],
        "the last tokens": basics.framed(content[len(content) - (limit - specials) :]),
    }
    tries = session.send_all(
        [
            ("candidate", f"token ids: {name}", {"model": basics.upstream_model, "input": ids})
            for name, ids in hypotheses.items()
        ]
    )
    scores = [(whole.cosine_to(t) or -1.0, name) for t, name in zip(tries, hypotheses, strict=True)]
    notes = [
        f"usage: {whole.prompt_tokens} tokens kept of {len(content) + specials:,}",
        f"vectors: the baseline's answer for the first {kept} tokens equals the long input's"
        if kept
        else "vectors: no start of the input gives the long input's vector",
        *(f"candidate, {name}: cosine {cos(value)}" for value, name in scores),
    ]
    shown += tries
    best, how = max(scores)
    if best < EQUIVALENT:
        return limit, [
            unknown(
                field,
                f"the baseline keeps {limit} tokens; no known way of cutting gives its vector",
                shown,
            )
        ]
    if how != "the first tokens, special tokens kept":
        problem = f"the baseline keeps {how} ({limit} tokens); the gateway keeps the first tokens and the special tokens"
        return limit, [
            finding(field, limit, "verified", how, shown=shown, notes=notes, problem=problem)
        ]
    agree = kept == limit - specials
    summary = (
        f"{limit} tokens: the first {limit - specials} and the special tokens (the end token kept)"
    )
    found = [
        finding(
            field, limit, "verified" if agree else "measured", summary, shown=shown, notes=notes
        )
    ]
    if candidate_max is not None and limit > candidate_max:
        found.append(
            unknown(
                "max_tokens (candidate)",
                f"the baseline keeps {limit} tokens; the candidate takes at most {candidate_max}",
            )
        )
    return limit, found


def _cut_point(same: Callable[[int], bool], guess: int | None, total: int) -> int | None:
    """The fewest tokens whose start of the text gives the long text's vector: around
    ``guess`` first, else by bisection over 1..total (None: no start does)."""
    if guess is not None and 1 < guess < total:
        if not same(guess - 1):
            if same(guess):
                return guess
            if same(guess + 1):
                return guess + 1
    low, high = 0, total  # same(low) is false, same(high) is true (the text itself)
    while high - low > 1:
        middle = (low + high) // 2
        if same(middle):
            high = middle
        else:
            low = middle
    return high if high < total else None


def _refuses_long(
    session: Session,
    local: LocalModel,
    basics: Basics,
    text: str,
    shown: list[Exchange],
    candidate_max: int | None,
) -> tuple[int | None, list[Finding]]:
    """The baseline refuses long inputs: the longest it accepts, by bisection on status."""
    low, high = 1, local.count(text)
    while high - low > 1:
        middle = (low + high) // 2
        head, got = local.head(text, middle)
        answer = session.send(
            "baseline", f"first {got:,} tokens of the long input", _body(basics, head)
        )
        shown.append(answer)
        low, high = (middle, high) if answer.ok else (low, middle)
    limit = low + basics.layout.count
    if candidate_max is not None and limit > candidate_max:
        return limit, [
            unknown(
                "max_tokens",
                f"the baseline accepts {limit} tokens; the candidate at most {candidate_max}",
                shown,
            )
        ]
    warning = f"the baseline refuses inputs over {limit} tokens ({shown[0].status}); the gateway cuts them"
    return limit, [
        finding(
            "max_tokens",
            limit,
            "measured",
            f"{limit} tokens, longer inputs refused",
            shown=shown,
            warning=warning,
        )
    ]


def _never_cut(
    shown: list[Exchange], candidate_max: int | None
) -> tuple[int | None, list[Finding]]:
    longest = shown[-1].prompt_tokens
    if candidate_max is None or longest is None or candidate_max < longest:
        problem = f"the baseline embeds {longest} tokens whole; the candidate takes at most {candidate_max}"
        return candidate_max, [unknown("max_tokens", problem, shown)]
    summary = f"not cut at {longest} tokens: the candidate's {candidate_max}"
    return candidate_max, [finding("max_tokens", candidate_max, "measured", summary, shown=shown)]


def _body(basics: Basics, text: str) -> dict[str, object]:
    return {"model": basics.model, "input": [text]}
