"""The probing plan: every learner in order, each reading what the earlier ones
learned, into one :class:`Learned` value (the policy's fields, plus what the
verification needs).

The candidate is surveyed first (the name it serves, its token limit), then one
plain text to both servers (basics: without it nothing else can be learned), then
prompts, truncation, Matryoshka, encoding and leniency and the candidate's kind,
and last the error dialect from every refusal seen on the way. Once a server's
budget is spent, every later learner is marked not learned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from extproc.core.api_errors import ErrorClass
from extproc.core.policy.model import PromptTemplates, TokenizerSource
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.tools.learn.answer_learner import learn_answer
from extproc.tools.learn.basics_learner import Basics, learn_basics
from extproc.tools.learn.batch_learner import Batches, learn_batches
from extproc.tools.learn.dialects_learner import FoundDialect, learn_dialects
from extproc.tools.learn.dimensions_learner import Dimensions, learn_dimensions
from extproc.tools.learn.errors_learner import REASON_OF, learn_errors
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.learn.local import TEXT, LocalModel
from extproc.tools.learn.names_learner import Names, learn_names
from extproc.tools.learn.profile_learner import (
    BOM_LABEL,
    EMPTY_INPUT,
    LAX,
    MALFORMED,
    NO_INPUT,
    UNKNOWN,
    LearnedEncoding,
    learn_profile,
)
from extproc.tools.learn.prompts_learner import UNKNOWN_TYPE, learn_prompts
from extproc.tools.learn.session import Exchange, Session
from extproc.tools.learn.text_learner import Texts, learn_texts
from extproc.tools.learn.truncation_learner import learn_truncation
from extproc.tools.learn.upstream_learner import learn_kind, learn_max_tokens, survey
from extproc.tools.toolkit.budgeted_client import BudgetSpentError

FALLBACK_MAX_TOKENS = 512  # written (marked) only when no limit was learned


@dataclass
class Learned:
    """What is learned so far; a default stands for what is not (and is marked so)."""

    model: str
    tokenizer: TokenizerSource
    basics: Basics | None = None
    upstream_model: str = ""
    candidate_max: int | None = None
    owner: str = ""  # /v1/models owned_by
    max_tokens: int | None = None
    truncation: dict[str, Any] = field(default_factory=dict)  # the policy's `truncation`
    dimensions: Dimensions = field(default_factory=Dimensions)
    prompts: PromptTemplates = field(default_factory=PromptTemplates)
    encoding: LearnedEncoding = field(default_factory=LearnedEncoding)
    errors: dict[str, Any] = field(default_factory=dict)  # the policy's `errors`
    kind: str = "dynamo"
    truncate_prompt_tokens: bool = True
    # input_type or lenient/bad request label -> the baseline answered it 2xx
    accepted: dict[str, bool] = field(default_factory=dict)
    # the baseline's refusals, each under the kind of mistake the gateway names it
    refusals: list[tuple[ErrorClass, Exchange]] = field(default_factory=list)
    answer: dict[str, Any] | None = None  # the policy's `answer` (None: the upstream's)
    names: Names | None = None
    batches: Batches | None = None
    texts: Texts | None = None
    dialects: list[FoundDialect] = field(default_factory=list)  # served besides learn's own
    dialect: EmbeddingsDialect | None = None  # the one learn spoke (None: OpenAI's)

    @property
    def limit(self) -> int:
        return self.max_tokens or self.candidate_max or FALLBACK_MAX_TOKENS

    def refusal_reason(self, kind: ErrorClass, exchange: Exchange) -> str:
        """What exactly is wrong in a refused request: a size under or over the
        learned range ("below", "above"), else by the request's label."""
        if kind is ErrorClass.DIMENSIONS:
            size = _sent_dimensions(exchange)
            d = self.dimensions
            if size is not None and d.min_dimensions is not None and not d.allowed:
                return "below" if size < d.min_dimensions else "above"
        return REASON_OF.get(exchange.label, "value")

    def size_below_native(self, native: int) -> int:
        """A Matryoshka size the baseline accepts (native when there is none)."""
        d = self.dimensions
        return d.min_dimensions or next((a for a in d.allowed if a != native), native)


def learn(
    session: Session, local: LocalModel, model: str, hint: str | None
) -> tuple[Learned, list[Finding]]:
    learned = Learned(model, local.source, upstream_model=model)
    learned.dialect = session.dialects["baseline"]
    found: list[Finding] = []
    try:
        learned.upstream_model, learned.candidate_max, learned.owner, first = survey(session, model)
        basics, more = learn_basics(session, local, model, learned.upstream_model)
    except BudgetSpentError as exc:
        return learned, [unknown("budget", str(exc))]
    found += first + more
    if basics is None:
        return learned, found
    learned.basics = basics
    if learned.dialect is None or not learned.dialect.own_shape:
        learned.answer, answer_found = learn_answer(basics)
        found += answer_found
    untyped_prefix = ""

    def prompts() -> list[Finding]:
        nonlocal untyped_prefix
        result = learn_prompts(session, local, basics, hint)
        learned.prompts, learned.accepted = result.templates, learned.accepted | result.accepted
        untyped_prefix = result.untyped_prefix
        if result.refused_instruction is not None:
            learned.refusals.append((ErrorClass.INSTRUCTION, result.refused_instruction))
        if result.refused_document_instruction is not None:
            refusal = result.refused_document_instruction
            learned.refusals.append((ErrorClass.INSTRUCTION, refusal))
        learned.refusals += [
            (ErrorClass.INVALID, e)
            for e in session.exchanges
            if e.server == "baseline" and e.label == f"input_type {UNKNOWN_TYPE!r}"
        ]
        if learned.prompts.default_input_type is not None:
            # The plain text's vectors differed because of that prompt, now explained.
            _settle_model(found, learned.prompts.default_input_type)
        return result.findings

    def truncation() -> list[Finding]:
        limit, first = learn_max_tokens(session, local, basics, learned.candidate_max)
        learned.candidate_max = limit
        result = learn_truncation(session, local, basics, limit, untyped_prefix)
        learned.max_tokens, learned.truncation = result.max_tokens, result.policy
        if result.refused is not None:
            learned.refusals.append((ErrorClass.TOO_LONG, result.refused))
        return [first, *result.findings]

    def dimensions() -> list[Finding]:
        learned.dimensions, items = learn_dimensions(session, basics)
        learned.refusals += [(ErrorClass.DIMENSIONS, e) for e in learned.dimensions.refused]
        learned.dimensions = replace(learned.dimensions, refused=())
        return items

    def profile() -> list[Finding]:
        size = learned.size_below_native(basics.native)
        learned.encoding, items, base, cand = learn_profile(session, basics, size)
        learned.accepted |= {e.label: e.ok for e in base}
        kinds = {MALFORMED: ErrorClass.MALFORMED, BOM_LABEL: ErrorClass.MALFORMED}
        kinds |= {EMPTY_INPUT: ErrorClass.INVALID, NO_INPUT: ErrorClass.INVALID}
        kinds |= {UNKNOWN: ErrorClass.UNKNOWN_MODEL}
        kinds |= {base[i].label: ErrorClass.DIMENSIONS for i in LAX}
        learned.refusals += [(kinds[e.label], e) for e in base if e.label in kinds]
        kind, learned.truncate_prompt_tokens, more = learn_kind(
            session, basics, learned.owner, cand
        )
        learned.kind = kind or learned.kind
        unknown_name = next(e for e in base if e.label == UNKNOWN)
        learned.names, named = learn_names(session, basics, unknown_name)
        if not learned.names.unnamed:
            learned.refusals.append((ErrorClass.INVALID, learned.names.no_model))
        return items + more + named

    def batches() -> list[Finding]:
        learned.batches, items = learn_batches(session, basics)
        if learned.batches.refused is not None:
            learned.refusals.append((ErrorClass.TOO_MANY_INPUTS, learned.batches.refused))
        return items

    def texts() -> list[Finding]:
        learned.texts, items = learn_texts(session, basics, untyped_prefix)
        return items

    def dialects() -> list[Finding]:
        learned.dialects, items = learn_dialects(session, model, TEXT, basics.plain)
        raw = [d.dialect.name for d in learned.dialects if not d.normalized]
        if raw and learned.kind != "vllm":
            problem = (
                f"{', '.join(raw)} answers vectors as the model pools them, which only "
                f"vLLM gives; the candidate is {learned.kind}"
            )
            items.append(unknown("serves", problem))
        return items

    steps: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("prompts", prompts),
        ("max_tokens", truncation),
        ("matryoshka", dimensions),
        ("encoding", profile),
        ("batches", batches),
        ("preprocess", texts),
        ("serves", dialects),
    ]
    spent = ""
    for name, step in steps:
        try:
            found += [unknown(name, f"not learned: {spent}")] if spent else step()
        except BudgetSpentError as exc:
            spent = str(exc)
            found.append(unknown(name, f"not learned: {spent}"))
    learned.errors, errors_found = learn_errors(learned.refusals, learned.refusal_reason)
    return learned, found + errors_found


def _sent_dimensions(exchange: Exchange) -> int | None:
    """The ``dimensions`` a learning request sent, when an integer."""
    try:
        value = orjson.loads(exchange.sent).get("dimensions")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if type(value) is int else None


def _settle_model(found: list[Finding], role: str) -> None:
    """The basics' "the vectors differ" finding, once a default input_type's prompt
    explains the difference (its template was verified against the candidate)."""
    for index, item in enumerate(found):
        if item.field == "model" and item.problem:
            summary = f"the same model: a text without input_type gets the {role!r} prompt"
            found[index] = finding("model", None, "verified", summary, notes=item.notes)
