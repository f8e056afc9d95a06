"""What the baseline does to a text before embedding it: line breaks folded to spaces,
runs of white space collapsed, both ends stripped, a Unicode normal form (the
policy's ``preprocess``).

Each probe text has one such trait. The baseline's vector for it is compared with the
candidate's for the text as sent and as each change would make it: the change whose
vector is the baseline's is what the baseline did (none, when the text as sent already
is; a tokenizer that ignores the trait leaves nothing to learn). A probe that no change
explains is named: a pre-processing no policy field says.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from extproc.core.policy.model import Preprocess, UnicodeForm
from extproc.core.preprocess import preprocess_text
from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding, unknown
from extproc.tools.learn.session import Exchange, Session

# Per trait: the probe text, and the policy's changes that may explain the answer,
# each as the rule that makes it.
TRAITS: Final[dict[str, tuple[str, dict[str, Preprocess]]]] = {
    "line breaks": (
        "The first line of a note\nand its second line\r\nand a third",
        {
            "fold_newlines": Preprocess(fold_newlines=True),
            "collapse_whitespace": Preprocess(collapse_whitespace=True),
        },
    ),
    "runs of white space": (
        "Words   with\t\truns  of    white space between them",
        {"collapse_whitespace": Preprocess(collapse_whitespace=True)},
    ),
    "white space at both ends": (
        "   A text with white space at both ends   ",
        {"strip": Preprocess(strip=True)},
    ),
    # Decomposed accents, a ligature and full-width letters: NFC composes the first,
    # NFKC the others too.
    "decomposed accents": (
        unicodedata.normalize("NFD", "Le café de la gare, déjà fermé: un \ufb01chier \uff21\uff22"),
        {form.name: Preprocess(unicode_form=form) for form in (UnicodeForm.NFC, UnicodeForm.NFKC)},
    ),
}


@dataclass(frozen=True)
class Texts:
    rule: Preprocess
    fields: dict[str, Any]  # the policy's `preprocess` (empty: as sent)


def learn_texts(session: Session, basics: Basics, prefix: str = "") -> tuple[Texts, list[Finding]]:
    """``prefix``: what the baseline puts before a text sent with no role (the
    candidate's texts get it too)."""
    session.note("learn: what the baseline does to a text before embedding it")
    plain = {"model": basics.model}
    candidate = {"model": basics.upstream_model}
    sent: list[tuple[Any, str, dict[str, Any]]] = []
    for trait, (text, changes) in TRAITS.items():
        sent.append(("baseline", trait, {**plain, "input": [text]}))
        sent.append(("candidate", f"{trait}, as sent", {**candidate, "input": [prefix + text]}))
        for name, rule in changes.items():
            changed = prefix + preprocess_text(rule, text)
            sent.append(("candidate", f"{trait}, {name}", {**candidate, "input": [changed]}))
    answers = iter(session.send_all(sent))
    fields: dict[str, Any] = {}
    found: list[Finding] = []
    explained: dict[str, list[str]] = {}
    for trait, (_, changes) in TRAITS.items():
        base, as_sent = next(answers), next(answers)
        tried = {name: next(answers) for name in changes}
        finding_, explained[trait] = _explain(trait, base, as_sent, tried)
        found.append(finding_)
    for names in sorted(explained.values(), key=len):
        # A trait several changes explain (a line break is white space too) takes one
        # another trait needs (those explained one way go first), else its first.
        if names and not any(n in fields or fields.get("unicode_form") == n for n in names):
            name = names[0]
            if name in _FLAGS:
                fields[name] = True
            else:
                fields["unicode_form"] = name
    rule = _rule(fields)
    return Texts(rule, fields), found


def _explain(
    trait: str, base: Exchange, as_sent: Exchange, tried: dict[str, Exchange]
) -> tuple[Finding, list[str]]:
    """The finding, and the changes that explain the baseline's vector (none: as sent)."""
    field = f"preprocess ({trait})"
    shown = [base, as_sent, *tried.values()]
    if not base.ok:
        return unknown(field, f"the baseline does not embed it: {base.brief()}", shown), []
    notes = [f"as sent: cosine {cos(base.cosine_to(as_sent))}"]
    notes += [f"{name}: cosine {cos(base.cosine_to(a))}" for name, a in tried.items()]
    # Two engines' vectors for the same ids agree to the probe's threshold, not to the
    # float: the closest way of reading the text wins, "as sent" on a tie (a text the
    # tokenizer reads alike either way).
    scores = {name: _cosine(base, answer) for name, answer in tried.items()}
    best = max([_cosine(base, as_sent), *scores.values()])
    if best < EQUIVALENT or _cosine(base, as_sent) >= best - _TIE:
        if best >= EQUIVALENT:
            said = finding(field, None, "verified", "embedded as sent", shown=shown, notes=notes)
            return said, []
        names: list[str] = []
    else:
        names = [name for name, value in scores.items() if value >= best - _TIE]
    if names:
        summary = f"embedded as {' or '.join(names)} makes it"
        return finding(field, names, "verified", summary, shown=shown, notes=notes), names
    problem = f"the baseline changes texts with {trait} in a way no `preprocess` field says"
    said = finding(field, None, "measured", problem, shown=shown, notes=notes, problem=problem)
    return said, []


_FLAGS: Final = ("fold_newlines", "collapse_whitespace", "strip")


# Cosines this close are one reading of the text (two engines' float noise).
_TIE: Final = 1e-5


def _cosine(baseline: Exchange, candidate: Exchange) -> float:
    value = baseline.cosine_to(candidate)
    return -1.0 if value is None else value


def _rule(fields: dict[str, Any]) -> Preprocess:
    form = fields.get("unicode_form")
    flags: dict[str, bool] = {k: True for k in fields if k in _FLAGS}
    build: Callable[..., Preprocess] = Preprocess
    return build(unicode_form=None if form is None else UnicodeForm[form], **flags)
