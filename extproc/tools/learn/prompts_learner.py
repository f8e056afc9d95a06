"""Prompts: what the baseline puts before an input for each ``input_type`` it accepts,
for ``instruction`` alone, and for no field at all.

One text goes to the baseline with every ``input_type`` the gateway knows (query and
document aliases, every preset's extra types, one unknown type) and with
``instruction``. A role's answer is explained by a candidate template when both
checks hold: the baseline's ``usage.prompt_tokens`` equals the local count of the
prompted text plus the special tokens, and the candidate's vector for the prompted
text equals the baseline's. Of the templates passing the count, the best cosine wins.
The instruction's answer then picks, among the templates that give the query's
prefix, the one that also gives its prefix for another task.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.core.policy.model import PromptTemplates
from extproc.core.policy.presets import presets
from extproc.tools.learn.basics_learner import EQUIVALENT, Basics
from extproc.tools.learn.findings import Confidence, Finding, cos, finding, unknown
from extproc.tools.learn.local import INSTRUCTION, TEXT, LocalModel, Template, templates
from extproc.tools.learn.session import Exchange, Session

QUERY_ALIASES = ("query", "search_query", "retrieval.query", "question")
DOCUMENT_ALIASES = ("document", "passage", "search_document", "retrieval.passage", "doc")
UNKNOWN_TYPE = "no-such-input-type"
INSTRUCTION_ALONE = "instruction alone"
MAX_TRIES = 6  # candidate requests per role: templates passing the count are few


@dataclass(frozen=True)
class Match:
    template: Template | None
    tries: tuple[Exchange, ...]
    notes: tuple[str, ...]
    extra_tokens: int | None  # tokens the baseline adds beyond the text and specials


def learn_prompts(
    session: Session, local: LocalModel, basics: Basics, hint: str | None
) -> tuple[PromptTemplates, list[Finding], dict[str, bool]]:
    """(the templates, findings, whether the baseline accepted each input_type asked
    and `instruction` alone)."""
    session.note("learn: prompts (every input_type, instruction)")
    extras = sorted({k for p in presets().values() for k in p.prompts.extra})
    kinds = [*QUERY_ALIASES, *DOCUMENT_ALIASES, *extras, UNKNOWN_TYPE]
    plain = {"model": basics.model, "input": [TEXT]}
    asked = {f"input_type {t!r}": {**plain, "input_type": t} for t in kinds}
    asked[INSTRUCTION_ALONE] = {**plain, "instruction": INSTRUCTION}
    for role in ("query", "document"):
        asked[f"input_type {role!r} + instruction"] = {
            **plain,
            "input_type": role,
            "instruction": INSTRUCTION,
        }
    answers = session.send_all([("baseline", label, body) for label, body in asked.items()])
    by_type = dict(zip(kinds, answers, strict=False))
    alone, query_and, document_and = answers[len(kinds) :]
    found = [_none(local, basics)]
    roles: dict[str, Template] = {}
    for role in ("query", "document", *extras):
        aliases = {"query": QUERY_ALIASES, "document": DOCUMENT_ALIASES}.get(role, (role,))
        accepted = [by_type[a] for a in aliases if by_type[a].ok]
        if not accepted:
            if role in ("query", "document"):
                warning = f"the gateway accepts {role} input_types; the baseline refuses them all"
                summary = f"the baseline refuses every {role} input_type"
                found.append(finding(f"prompts.{role}", None, "measured", summary, warning=warning))
            continue
        match = explain(
            session, local, basics, accepted[0], templates(role, hint, local.file_prompts)
        )
        name = f"prompts.{role}" if role in ("query", "document") else f"prompts.extra.{role}"
        found.append(_role_finding(name, role, accepted[0], match))
        if match.template is not None:
            roles[role] = match.template
        found += _aliases(role, accepted[0], accepted)
    query, document = roles.get("query"), roles.get("document")
    if query is not None:
        query, instruction = _instruction(session, local, basics, query, (alone, query_and))
        found.append(instruction)
    found.append(_input_types(by_type, document_and))
    extra = {t: roles[t].text for t in extras if t in roles}
    learned = PromptTemplates(
        query=query.text if query else "{text}",
        document=document.text if document else "{text}",
        default_instruction=query.instruction if query and query.takes_instruction else "",
        extra=extra,
    )
    asked_ok = {t: a.ok for t, a in by_type.items()} | {INSTRUCTION_ALONE: alone.ok}
    return learned, found, asked_ok


def explain(
    session: Session,
    local: LocalModel,
    basics: Basics,
    answer: Exchange,
    candidates: list[Template],
    *,
    instruction: str | None = None,
) -> Match:
    """The template that explains the baseline's ``answer`` to TEXT (see the module)."""
    specials = basics.layout.count
    extra = None if answer.prompt_tokens is None else answer.prompt_tokens - local.count(TEXT)
    extra = None if extra is None else extra - specials
    prefixes: dict[str, Template] = {}
    for template in candidates:
        prefix = template.prefix(instruction)
        tokens = local.count(prefix + TEXT) + specials
        if answer.prompt_tokens in (None, tokens):
            prefixes.setdefault(prefix, template)
    if "" in prefixes and answer.same_as(basics.plain):
        note = "the same vector as the text without any field"
        return Match(Template("{text}", "", "no prompt"), (), (note,), extra)
    tried = list(prefixes.items())[:MAX_TRIES]
    body = {"model": basics.upstream_model}
    tries = session.send_all(
        [("candidate", f"prompted text {p!r}", {**body, "input": [p + TEXT]}) for p, _ in tried]
    )
    scored = [(answer.cosine_to(t) or -1.0, i) for i, t in enumerate(tries)]
    notes = tuple(f"{tried[i][0]!r} ({tried[i][1].source}): cosine {cos(s)}" for s, i in scored)
    best, index = max(scored, default=(-1.0, 0))
    if best >= EQUIVALENT:
        return Match(tried[index][1], (tries[index],), notes, extra)
    return Match(None, tuple(tries), notes, extra)


def _none(local: LocalModel, basics: Basics) -> Finding:
    """No field at all: the input must be embedded as sent (what the gateway does)."""
    plain, expected = basics.plain, local.count(TEXT) + basics.layout.count
    value = plain.cosine_to(basics.plain_candidate)
    notes = [
        f"baseline {plain.prompt_tokens} tokens, local count {expected}",
        f"cosine to the candidate {cos(value)}",
    ]
    shown = [plain, basics.plain_candidate]
    if plain.prompt_tokens in (None, expected) and value is not None and value >= EQUIVALENT:
        confidence: Confidence = "verified" if plain.prompt_tokens == expected else "measured"
        summary = "inputs without input_type are embedded as sent"
        return finding("prompts.none", "as sent", confidence, summary, shown=shown, notes=notes)
    extra = "some" if plain.prompt_tokens is None else plain.prompt_tokens - expected
    problem = (
        f"the baseline adds {extra} tokens to inputs without input_type (a default prompt?); "
        "the gateway sends such inputs as they are"
    )
    return unknown("prompts.none", problem, shown)


def _role_finding(field_name: str, role: str, answer: Exchange, match: Match) -> Finding:
    shown = [answer, *match.tries]
    if match.template is None:
        added = "a prompt" if match.extra_tokens is None else f"{match.extra_tokens} tokens"
        problem = (
            f"the baseline prepends {added} to {role} inputs ({answer.label}) "
            "that no known prompt explains"
        )
        return finding(
            field_name, None, "unknown", problem, shown=shown, notes=match.notes, problem=problem
        )
    confidence: Confidence = "verified" if answer.prompt_tokens is not None else "measured"
    template = match.template
    summary = f"{template.text!r} ({template.source}), +{match.extra_tokens} tokens"
    return finding(field_name, template.text, confidence, summary, shown=shown, notes=match.notes)


def _aliases(role: str, first: Exchange, accepted: list[Exchange]) -> list[Finding]:
    """Every alias the gateway takes for ``role`` must mean the same to the baseline."""
    differ = [a for a in accepted if not a.same_as(first)]
    if not differ:
        return []
    problem = (
        f"{', '.join(a.label for a in differ)}: other vectors than {first.label}; "
        f"the gateway gives every {role} alias the same prompt"
    )
    return [unknown(f"input_type ({role})", problem, [first, *differ])]


def _instruction(
    session: Session,
    local: LocalModel,
    basics: Basics,
    query: Template,
    answers: tuple[Exchange, Exchange],
) -> tuple[Template, Finding]:
    alone, query_and = answers
    if not alone.ok:
        summary = f"the baseline refuses `instruction`: {alone.brief()}"
        warning = "the gateway accepts `instruction` (a query with that task)"
        return query, finding(
            "instruction", None, "measured", summary, shown=[alone], warning=warning
        )
    known = templates("query", None, local.file_prompts)
    same = [query, *(t for t in known if t.prefix() == query.prefix())]
    match = explain(session, local, basics, alone, same, instruction=INSTRUCTION)
    shown = [alone, *match.tries, query_and]
    both = cos(query_and.cosine_to(alone))
    notes = [*match.notes, f"input_type 'query' + instruction: cosine {both} to instruction alone"]
    if match.template is None:
        problem = (
            "the baseline ignores `instruction` alone (embeds the input as sent)"
            if alone.same_as(basics.plain)
            else f"the baseline adds {match.extra_tokens} tokens for `instruction` "
            "that no query template explains"
        )
        problem += "; the gateway applies the query prompt with it"
        return query, finding(
            "instruction", None, "unknown", problem, shown=shown, notes=notes, problem=problem
        )
    chosen = match.template
    how = (
        "in place of the default task"
        if chosen.takes_instruction
        else "ignored: the query prompt is applied as it is"
    )
    differs = query_and.ok and not query_and.same_as(alone)
    warning = "input_type 'query' + instruction differs from instruction alone" if differs else ""
    summary = f"instruction alone is a query; its text is {how}"
    return chosen, finding(
        "instruction", chosen.text, "verified", summary, shown=shown, notes=notes, warning=warning
    )


def _input_types(by_type: dict[str, Exchange], document_and: Exchange) -> Finding:
    accepted = [t for t, a in by_type.items() if a.ok]
    refused = ", ".join(f"{t!r} {a.status}" for t, a in by_type.items() if not a.ok)
    summary = (
        f"accepted: {', '.join(map(repr, accepted))}; refused: {refused or 'none'}; "
        f"document + instruction: {document_and.brief()}"
    )
    warning = ""
    if UNKNOWN_TYPE in accepted:
        warning = (
            f"the baseline accepts any input_type ({UNKNOWN_TYPE!r}); "
            "the gateway answers 400 to types it does not know"
        )
    elif any(not by_type[t].ok for t in (*QUERY_ALIASES, *DOCUMENT_ALIASES)):
        warning = "the gateway accepts every query and document alias; the baseline refuses some"
    shown = [*by_type.values(), document_and]
    return finding("input_type", accepted, "measured", summary, shown=shown, warning=warning)
