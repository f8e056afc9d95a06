"""Prompts: what the baseline puts before an input for each ``input_type`` it accepts,
for no field at all, and what ``instruction`` does.

One text goes to the baseline with every ``input_type`` the gateway knows (query and
document aliases, every preset's extra types, one unknown type) and with
``instruction``. A role's answer is explained by a candidate template when both
checks hold: the baseline's ``usage.prompt_tokens`` equals the local count of the
prompted text plus the special tokens, and the candidate's vector for the prompted
text equals the baseline's. Of the templates passing the count, the best cosine wins.
An alias whose answer differs from the first of its role gets a template of its own
(``prompts.aliases``). An input with neither field is embedded as sent, or gets the
prompt of the role whose answer it equals (``prompts.default_input_type``).

``instruction`` (``prompts.instruction``): refused (REFUSED); an answer equal to the
plain text's (IGNORED); the instruction's text alone before the input (PROMPT); or a
query template with the task in it (TASK), the one that also gives the query's own
prefix for the default task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from extproc.core.policy.model import InstructionUse, PromptTemplates
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
# The instruction as the whole prompt (prompts.instruction: PROMPT).
AS_PROMPT = Template("{instruction}{text}", INSTRUCTION, "the instruction as the prompt")


@dataclass(frozen=True)
class Match:
    template: Template | None
    tries: tuple[Exchange, ...]
    notes: tuple[str, ...]
    extra_tokens: int | None  # tokens the baseline adds beyond the text and specials


@dataclass
class LearnedPrompts:
    templates: PromptTemplates
    findings: list[Finding]
    accepted: dict[str, bool]  # each request of requests(), by label: 2xx?
    refused_instruction: Exchange | None = None  # the baseline's refusal, for its status
    # What the baseline puts before an input sent with neither field ("" as sent).
    untyped_prefix: str = ""
    roles: dict[str, Template] = field(default_factory=dict)
    # Its refusal of an instruction sent with a document role.
    refused_document_instruction: Exchange | None = None


def input_types() -> list[str]:
    """Every input_type asked: the aliases, every preset's extra types, an unknown one."""
    extras = sorted({k for p in presets().values() for k in p.prompts.extra})
    return [*QUERY_ALIASES, *DOCUMENT_ALIASES, *extras, UNKNOWN_TYPE]


def requests(model: str, role_field: str = "input_type") -> dict[str, dict[str, Any]]:
    """Label -> body: TEXT with each input_type (in ``role_field``), `instruction` alone
    and with a role. A label names the role's values as input_types whatever the field."""
    plain = {"model": model, "input": [TEXT]}
    asked = {f"input_type {t!r}": {**plain, role_field: t} for t in input_types()}
    asked[INSTRUCTION_ALONE] = {**plain, "instruction": INSTRUCTION}
    for role in ("query", "document"):
        asked[f"input_type {role!r} + instruction"] = {
            **plain,
            role_field: role,
            "instruction": INSTRUCTION,
        }
    return asked


# The fields legacy servers take an input's role from, and each one's query value:
# OpenAI-style servers' `input_type`, sentence-transformers' and TEI's `prompt_name`,
# Jina's `task`.
ROLE_FIELDS: Final = (
    ("input_type", "query"),
    ("prompt_name", "query"),
    ("task", "retrieval.query"),
)


def learn_role_field(session: Session, basics: Basics) -> tuple[str, Finding]:
    """The field whose query value changes the baseline's vector (the first that does;
    `input_type` when none does: then no role has a prompt to tell them by)."""
    plain = {"model": basics.model, "input": [TEXT]}
    answers = session.send_all(
        [("baseline", f"{f} {v!r}", {**plain, f: v}) for f, v in ROLE_FIELDS]
    )
    for (name, _), answer in zip(ROLE_FIELDS, answers, strict=True):
        if answer.ok and not answer.same_as(basics.plain):
            summary = f"{name}: its query value changes the vector"
            return name, finding("prompts.role_field", name, "verified", summary, shown=answers)
    summary = "input_type: no field's query value changes the vector"
    return "input_type", finding(
        "prompts.role_field", "input_type", "default", summary, shown=answers
    )


def learn_prompts(
    session: Session, local: LocalModel, basics: Basics, hint: str | None
) -> LearnedPrompts:
    session.note("learn: prompts (the role's field, every input_type, instruction)")
    role_field, role_finding = learn_role_field(session, basics)
    kinds = input_types()
    extras = kinds[len(QUERY_ALIASES) + len(DOCUMENT_ALIASES) : -1]
    asked = requests(basics.model, role_field)
    answers = session.send_all([("baseline", label, body) for label, body in asked.items()])
    by_type = dict(zip(kinds, answers, strict=False))
    alone, query_and, document_and = answers[len(kinds) :]
    found: list[Finding] = [role_finding]
    roles: dict[str, Template] = {}
    firsts: dict[str, str] = {}  # role -> the alias its template was learned from
    aliases: dict[str, str] = {}
    for role in ("query", "document", *extras):
        names = {"query": QUERY_ALIASES, "document": DOCUMENT_ALIASES}.get(role, (role,))
        accepted = [(a, by_type[a]) for a in names if by_type[a].ok]
        if not accepted:
            if role in ("query", "document"):
                warning = f"the gateway accepts {role} input_types; the baseline refuses them all"
                summary = f"the baseline refuses every {role} input_type"
                found.append(finding(f"prompts.{role}", None, "measured", summary, warning=warning))
            continue
        candidates = templates(role, hint, local.file_prompts)
        first_name, first = accepted[0]
        match = explain(session, local, basics, first, candidates)
        name = f"prompts.{role}" if role in ("query", "document") else f"prompts.extra.{role}"
        found.append(_role_finding(name, role, first, match))
        if match.template is None:
            continue
        roles[role], firsts[role] = match.template, first_name
        for alias, answer in accepted[1:]:
            if answer.same_as(first):
                continue
            own = explain(session, local, basics, answer, candidates)
            found.append(_role_finding(f"prompts.aliases.{alias}", alias, answer, own))
            if own.template is not None:
                aliases[alias] = own.template.text
    untyped, untyped_finding = _untyped(basics, by_type, roles, firsts, aliases)
    found.append(untyped_finding)
    query, document = roles.get("query"), roles.get("document")
    use, refused = InstructionUse.TASK, None
    instruction_findings: list[Finding] = []
    if query is not None:
        query, use, instruction_findings = _instruction(
            session, local, basics, query, (alone, query_and, by_type[firsts["query"]])
        )
        refused = alone if use is InstructionUse.REFUSED else None
    found += instruction_findings
    document_use, document_finding = _document_instruction(
        document_and, by_type.get(firsts.get("document", "")), alone, use
    )
    found.append(document_finding)
    found.append(_input_types(by_type, document_and))
    extra = {t: roles[t].text for t in extras if t in roles}
    known = [*QUERY_ALIASES, *DOCUMENT_ALIASES, *extra]
    taken = [t for t in known if by_type[t].ok]
    learned = PromptTemplates(
        query=query.text if query else "{text}",
        document=document.text if document else "{text}",
        default_instruction=query.instruction if query and query.takes_instruction else "",
        extra=extra,
        instruction=use,
        aliases=aliases,
        default_input_type=untyped,
        # only the values it took, when it refused some the gateway knows
        input_types=frozenset(taken) if len(taken) < len(known) else frozenset(),
        document_instruction=document_use,
        role_field=role_field,
    )
    asked_ok = {label: a.ok for label, a in zip(asked, answers, strict=True)}
    prefix = ""
    if untyped is not None:
        template = _template_of(untyped, roles, aliases)
        prefix = template.prefix() if template else ""
    refused_document = document_and if document_use is InstructionUse.REFUSED else None
    return LearnedPrompts(learned, found, asked_ok, refused, prefix, roles, refused_document)


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
    if "" in prefixes and basics.plain_as_sent and answer.same_as(basics.plain):
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


def _template_of(
    input_type: str, roles: dict[str, Template], aliases: dict[str, str]
) -> Template | None:
    if input_type in aliases:
        return Template(aliases[input_type], "", f"prompts.aliases.{input_type}")
    role = (
        "query"
        if input_type in QUERY_ALIASES
        else "document"
        if input_type in DOCUMENT_ALIASES
        else input_type
    )
    return roles.get(role)


def _untyped(
    basics: Basics,
    by_type: dict[str, Exchange],
    roles: dict[str, Template],
    firsts: dict[str, str],
    aliases: dict[str, str],
) -> tuple[str | None, Finding]:
    """No field at all: embedded as sent, or the prompt of the role (or alias) whose
    answer is the plain text's, to the float."""
    field_name = "prompts.default_input_type"
    plain = basics.plain
    shown = [plain, basics.plain_candidate]
    if basics.plain_as_sent:
        summary = "inputs without input_type are embedded as sent"
        return None, finding(field_name, None, "verified", summary, shown=shown)
    named = [*firsts.values(), *aliases]
    for name in named:
        answer = by_type.get(name)
        if answer is not None and answer.same_as(plain) and _template_of(name, roles, aliases):
            summary = f"inputs without input_type get the {name!r} prompt (the same vector)"
            return name, finding(field_name, name, "verified", summary, shown=[*shown, answer])
    extra = "a prompt" if plain.prompt_tokens is None else "tokens"
    problem = (
        f"the baseline adds {extra} to inputs without input_type, and no input_type's "
        "answer is the same; the gateway sends such inputs as they are"
    )
    return None, unknown(field_name, problem, shown)


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


def _instruction(
    session: Session,
    local: LocalModel,
    basics: Basics,
    query: Template,
    answers: tuple[Exchange, Exchange, Exchange],
) -> tuple[Template, InstructionUse, list[Finding]]:
    """(the query template, what `instruction` does, findings)."""
    alone, query_and, query_alone = answers
    field_name = "prompts.instruction"
    if not alone.ok:
        summary = f"the baseline refuses `instruction`: {alone.brief()}"
        use = InstructionUse.REFUSED
        return query, use, [finding(field_name, use.name, "verified", summary, shown=[alone])]
    both = cos(query_and.cosine_to(alone))
    if alone.same_as(basics.plain) and not alone.same_as(query_alone):
        # Embedded as if the field were absent; with input_type "query" the same.
        shown = [alone, basics.plain, query_and, query_alone]
        use = InstructionUse.IGNORED
        if query_and.ok and not query_and.same_as(query_alone):
            problem = (
                "the baseline ignores `instruction` alone but not with input_type 'query'; "
                "the gateway ignores it in both"
            )
            return query, use, [unknown(field_name, problem, shown)]
        summary = "ignored: the input is embedded as its input_type alone says"
        return query, use, [finding(field_name, use.name, "verified", summary, shown=shown)]
    known = templates("query", None, local.file_prompts)
    same = [query, *(t for t in known if t.prefix() == query.prefix()), AS_PROMPT]
    match = explain(session, local, basics, alone, same, instruction=INSTRUCTION)
    shown = [alone, *match.tries, query_and]
    notes = [*match.notes, f"input_type 'query' + instruction: cosine {both} to instruction alone"]
    if match.template is None:
        problem = (
            f"the baseline adds {match.extra_tokens} tokens for `instruction` "
            "that no query template explains"
        )
        return query, InstructionUse.TASK, [unknown(field_name, problem, shown)]
    differs = query_and.ok and not query_and.same_as(alone)
    warning = "input_type 'query' + instruction differs from instruction alone" if differs else ""
    if match.template is AS_PROMPT:
        use = InstructionUse.PROMPT
        summary = "the instruction's text is the whole prompt (a query)"
        chosen = query
    else:
        use = InstructionUse.TASK
        chosen = match.template
        how = (
            "in place of the default task"
            if chosen.takes_instruction
            else "ignored: the query prompt is applied as it is"
        )
        summary = f"instruction alone is a query; its text is {how}"
    return (
        chosen,
        use,
        [
            finding(
                field_name,
                use.name,
                "verified",
                summary,
                shown=shown,
                notes=notes,
                warning=warning,
            )
        ],
    )


def _document_instruction(
    document_and: Exchange, document: Exchange | None, alone: Exchange, use: InstructionUse
) -> tuple[InstructionUse, Finding]:
    """What an instruction sent with a document role does: refused; ignored (the
    document's vector); or it wins (the vector of the instruction alone, a query)."""
    field_name = "prompts.document_instruction"
    shown = [e for e in (document_and, document, alone) if e is not None]
    if not document_and.ok:
        summary = f"refused: {document_and.brief()}"
        return InstructionUse.REFUSED, finding(field_name, None, "measured", summary, shown=shown)
    if document is not None and document_and.same_as(document):
        summary = "ignored: embedded as the document alone"
        found = finding(field_name, "IGNORED", "verified", summary, shown=shown)
        return InstructionUse.IGNORED, found
    if (
        alone.ok
        and document_and.same_as(alone)
        and use in (InstructionUse.TASK, InstructionUse.PROMPT)
    ):
        summary = "the instruction wins: embedded as the instruction alone (a query)"
        return use, finding(field_name, use.name, "verified", summary, shown=shown)
    problem = (
        "an instruction with a document role is answered, as neither the document alone "
        "nor the instruction alone"
    )
    return InstructionUse.REFUSED, unknown(field_name, problem, shown)


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
    shown = [*by_type.values(), document_and]
    return finding("input_type", accepted, "measured", summary, shown=shown, warning=warning)
