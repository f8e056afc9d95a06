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

from dataclasses import dataclass, field

from extproc.core.policy.presets import presets
from extproc.tools.learn.basics import EQUIVALENT, Basics
from extproc.tools.learn.findings import Finding, cos, finding, unknown
from extproc.tools.learn.local import INSTRUCTION, TEXT, LocalModel, Template, templates
from extproc.tools.learn.session import Exchange, Session

QUERY_ALIASES = ("query", "search_query", "retrieval.query", "question")
DOCUMENT_ALIASES = ("document", "passage", "search_document", "retrieval.passage", "doc")
UNKNOWN_TYPE = "no-such-input-type"
MAX_TRIES = 6  # candidate requests per role: templates passing the count are few


@dataclass(frozen=True)
class Match:
    template: Template | None
    tries: tuple[Exchange, ...]
    notes: tuple[str, ...]
    extra_tokens: int | None  # tokens the baseline adds beyond the text and specials


@dataclass(frozen=True)
class Prompts:
    query: str = "{text}"
    document: str = "{text}"
    default_instruction: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    source: str = ""  # where the query and document templates come from


def learn_prompts(
    session: Session, local: LocalModel, basics: Basics, hint: str | None
) -> tuple[Prompts, list[Finding]]:
    session.note("learn: prompts (every input_type, instruction)")
    extras = sorted({k for p in presets().values() for k in p.prompts.extra})
    kinds = [*QUERY_ALIASES, *DOCUMENT_ALIASES, *extras, UNKNOWN_TYPE]
    model = basics.model

    def body(**fields: str) -> dict[str, object]:
        return {"model": model, "input": [TEXT], **fields}

    answers = session.send_all(
        [("baseline", f"input_type {t!r}", body(input_type=t)) for t in kinds]
        + [
            ("baseline", "instruction alone", body(instruction=INSTRUCTION)),
            (
                "baseline",
                "input_type 'query' + instruction",
                body(input_type="query", instruction=INSTRUCTION),
            ),
            (
                "baseline",
                "input_type 'document' + instruction",
                body(input_type="document", instruction=INSTRUCTION),
            ),
        ]
    )
    by_type = dict(zip(kinds, answers, strict=False))
    alone, query_and, document_and = answers[len(kinds) :]
    found = [_none(local, basics)]
    extra: dict[str, str] = {}
    roles: dict[str, Template] = {}
    for role, aliases in (("query", QUERY_ALIASES), ("document", DOCUMENT_ALIASES)):
        accepted = [by_type[a] for a in aliases if by_type[a].ok]
        if not accepted:
            found.append(
                finding(
                    f"prompts.{role}",
                    "{text}",
                    "measured",
                    f"the baseline refuses every {role} input_type",
                    shown=[by_type[a] for a in aliases],
                    warning=f"the gateway accepts {role} input_types the baseline refuses",
                )
            )
            continue
        first = accepted[0]
        match = explain(session, local, basics, first, templates(role, hint, local.file_prompts))
        found.append(_role_finding(f"prompts.{role}", role, first, match, basics))
        if match.template is not None:
            roles[role] = match.template
        found += _aliases(role, first, [by_type[a] for a in aliases])
    query = roles.get("query")
    if query is not None:
        query, instruction_finding = _instruction(session, local, basics, query, alone, query_and)
        found.append(instruction_finding)
    document = roles.get("document")
    for t in extras:
        answer = by_type[t]
        if answer.ok and t not in QUERY_ALIASES + DOCUMENT_ALIASES:
            match = explain(session, local, basics, answer, templates(t, hint, local.file_prompts))
            found.append(_role_finding(f"prompts.extra.{t}", t, answer, match, basics))
            if match.template is not None and match.template.text != "{text}":
                extra[t] = match.template.text
    found.append(_input_types(by_type, document_and))
    learned = Prompts(
        query=query.text if query else "{text}",
        document=document.text if document else "{text}",
        default_instruction=query.instruction if query and query.takes_instruction else "",
        extra=extra,
        source=", ".join(sorted({t.source for t in (query, document) if t and t.text != "{text}"})),
    )
    return learned, found


def explain(
    session: Session,
    local: LocalModel,
    basics: Basics,
    answer: Exchange,
    candidates: list[Template],
    instruction: str | None = None,
) -> Match:
    """The template that explains the baseline's ``answer`` to TEXT (see the module)."""
    specials = basics.layout.count
    base = local.count(TEXT) + specials
    extra = None if answer.prompt_tokens is None else answer.prompt_tokens - base
    prefixes: dict[str, Template] = {}
    for template in candidates:
        prefix = template.prefix(instruction)
        if (
            answer.prompt_tokens is None
            or local.count(prefix + TEXT) + specials == answer.prompt_tokens
        ):
            prefixes.setdefault(prefix, template)
    if "" in prefixes and answer.same_as(basics.plain):
        note = "the same vector as the text without any field"
        return Match(prefixes[""], (), (note,), extra)
    tried = list(prefixes.items())[:MAX_TRIES]
    tries = session.send_all(
        [
            (
                "candidate",
                f"prompted text {p!r}",
                {"model": basics.upstream_model, "input": [p + TEXT]},
            )
            for p, _ in tried
        ]
    )
    scored = [(answer.cosine_to(t) or -1.0, i) for i, t in enumerate(tries)]
    notes = tuple(f"{tried[i][0]!r} ({tried[i][1].source}): cosine {cos(s)}" for s, i in scored)
    if scored and max(scored)[0] >= EQUIVALENT:
        best = max(scored)[1]
        return Match(tried[best][1], (tries[best],), notes, extra)
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
        confidence = "verified" if plain.prompt_tokens == expected else "measured"
        return finding(
            "prompts.none",
            "as sent",
            confidence,
            "inputs without input_type are embedded as sent",
            shown=shown,
            notes=notes,
        )
    extra = None if plain.prompt_tokens is None else plain.prompt_tokens - expected
    return finding(
        "prompts.none",
        None,
        "measured",
        "the baseline changes inputs sent without input_type",
        shown=shown,
        notes=notes,
        problem=f"the baseline adds {extra if extra is not None else 'some'} tokens to inputs without input_type "
        "(a default prompt?); the gateway sends such inputs as they are",
    )


def _role_finding(
    field_name: str, role: str, answer: Exchange, match: Match, basics: Basics
) -> Finding:
    shown = [answer, *match.tries]
    if match.template is None:
        added = f"{match.extra_tokens} tokens" if match.extra_tokens is not None else "a prompt"
        problem = f"the baseline prepends {added} to {role} inputs (input_type {answer.label.split()[-1]}) that no known prompt explains"
        return finding(
            field_name, None, "unknown", problem, shown=shown, notes=match.notes, problem=problem
        )
    confidence = "verified" if answer.prompt_tokens is not None else "measured"
    summary = f"{match.template.text!r} ({match.template.source}), +{match.extra_tokens} tokens"
    return finding(
        field_name, match.template.text, confidence, summary, shown=shown, notes=match.notes
    )


def _aliases(role: str, first: Exchange, answers: list[Exchange]) -> list[Finding]:
    """Every alias the gateway takes for ``role`` must mean the same to the baseline."""
    differ = [a for a in answers if a.ok and not a.same_as(first)]
    if not differ:
        return []
    names = ", ".join(a.label for a in differ)
    return [
        unknown(
            f"input_type ({role})",
            f"{names}: other vectors than {first.label}; the gateway gives every {role} alias the same prompt",
            [first, *differ],
        )
    ]


def _instruction(
    session: Session,
    local: LocalModel,
    basics: Basics,
    query: Template,
    alone: Exchange,
    query_and: Exchange,
) -> tuple[Template, Finding]:
    field_name = "instruction"
    if not alone.ok:
        return query, finding(
            field_name,
            None,
            "measured",
            f"the baseline refuses `instruction`: {alone.brief()}",
            shown=[alone],
            warning="the gateway accepts `instruction` (a query with that task)",
        )
    same_prefix = [
        t for t in templates("query", None, local.file_prompts) if t.prefix() == query.prefix()
    ]
    match = explain(session, local, basics, alone, [query, *same_prefix], INSTRUCTION)
    shown = [alone, *match.tries, query_and]
    notes = [
        *match.notes,
        f"input_type 'query' + instruction: cosine {cos(query_and.cosine_to(alone))} to instruction alone",
    ]
    if match.template is None:
        ignored = alone.same_as(basics.plain)
        problem = (
            "the baseline ignores `instruction` alone (embeds the input as sent)"
            if ignored
            else f"the baseline adds {match.extra_tokens} tokens for `instruction` that no query template explains"
        )
        return query, finding(
            field_name,
            None,
            "unknown",
            problem,
            shown=shown,
            notes=notes,
            problem=problem + "; the gateway applies the query prompt with it",
        )
    chosen = match.template
    how = (
        "in place of the default task"
        if chosen.takes_instruction
        else "ignored: the query prompt is applied as it is"
    )
    warning = (
        ""
        if query_and.same_as(alone)
        else "input_type 'query' + instruction differs from instruction alone"
    )
    return chosen, finding(
        field_name,
        chosen.text,
        "verified",
        f"instruction alone is a query; its text is {how}",
        shown=shown,
        notes=notes,
        warning=warning,
    )


def _input_types(by_type: dict[str, Exchange], document_and: Exchange) -> Finding:
    accepted = [t for t, a in by_type.items() if a.ok]
    refused = {t: a.status for t, a in by_type.items() if not a.ok}
    statuses = ", ".join(f"{t!r} {s}" for t, s in refused.items())
    summary = f"accepted: {', '.join(map(repr, accepted))}; refused: {statuses or 'none'}; document + instruction: {document_and.brief()}"
    warning = ""
    if UNKNOWN_TYPE in accepted:
        warning = f"the baseline accepts any input_type ({UNKNOWN_TYPE!r}); the gateway answers 400 to types it does not know"
    elif any(t in refused for t in (*QUERY_ALIASES, *DOCUMENT_ALIASES)):
        warning = "the gateway accepts every query and document alias; the baseline refuses some"
    return finding(
        "input_type",
        accepted,
        "measured",
        summary,
        shown=[*by_type.values(), document_and],
        warning=warning,
    )
