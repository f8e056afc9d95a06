"""The probing plan: every learner in order, each reading what the earlier ones
learned, into one :class:`Learned` value (the policy's fields, plus what the
verification needs).

The candidate is surveyed first (the name it serves, its token limit), then one
plain text to both servers (basics: without it nothing else can be learned), then
prompts, truncation, Matryoshka, the encoding profile and the candidate's kind.
Once a server's budget is spent, every later learner is marked not learned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.core.policy.model import PromptTemplates, TokenizerSource
from extproc.tools.learn.basics_learner import Basics, learn_basics
from extproc.tools.learn.dimensions_learner import Dimensions, learn_dimensions
from extproc.tools.learn.findings import Finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.profile_learner import learn_profile
from extproc.tools.learn.prompts_learner import learn_prompts
from extproc.tools.learn.session import BudgetSpentError, Session
from extproc.tools.learn.truncation_learner import learn_truncation
from extproc.tools.learn.upstream_learner import learn_kind, learn_max_tokens, survey

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
    dimensions: Dimensions = field(default_factory=Dimensions)
    prompts: PromptTemplates = field(default_factory=PromptTemplates)
    profile: str = "OPENAI"
    kind: str = "dynamo"
    truncate_prompt_tokens: bool = True
    # input_type or lenient/bad request label -> the baseline answered it 2xx
    accepted: dict[str, bool] = field(default_factory=dict)

    @property
    def limit(self) -> int:
        return self.max_tokens or self.candidate_max or FALLBACK_MAX_TOKENS

    def size_below_native(self, native: int) -> int:
        """A Matryoshka size the baseline accepts (native when there is none)."""
        d = self.dimensions
        return d.min_dimensions or next((a for a in d.allowed if a != native), native)


def learn(
    session: Session, local: LocalModel, model: str, hint: str | None
) -> tuple[Learned, list[Finding]]:
    learned = Learned(model, local.source, upstream_model=model)
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

    def prompts() -> list[Finding]:
        learned.prompts, items, accepted = learn_prompts(session, local, basics, hint)
        learned.accepted |= accepted
        return items

    def truncation() -> list[Finding]:
        limit, first = learn_max_tokens(session, local, basics, learned.candidate_max)
        learned.candidate_max = limit
        learned.max_tokens, items = learn_truncation(session, local, basics, limit)
        return [first, *items]

    def dimensions() -> list[Finding]:
        learned.dimensions, items = learn_dimensions(session, basics)
        return items

    def profile() -> list[Finding]:
        size = learned.size_below_native(basics.native)
        learned.profile, items, base, cand = learn_profile(session, basics, size)
        learned.accepted |= {e.label: e.ok for e in base}
        kind, learned.truncate_prompt_tokens, more = learn_kind(
            session, basics, learned.owner, cand
        )
        learned.kind = kind or learned.kind
        return items + more

    steps: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("prompts", prompts),
        ("max_tokens", truncation),
        ("matryoshka", dimensions),
        ("encoding_profile", profile),
    ]
    spent = ""
    for name, step in steps:
        try:
            found += [unknown(name, f"not learned: {spent}")] if spent else step()
        except BudgetSpentError as exc:
            spent = str(exc)
            found.append(unknown(name, f"not learned: {spent}"))
    return learned, found
