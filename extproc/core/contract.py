"""The loaded contract: a policy plus a ready tokenizer for each of its models, its
route table, and the check that needs both (a prompt's length in tokens). The
tokenizers are loaded by :mod:`extproc.service.contract_loading`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.model import GatewayPolicy, ModelPolicy
from extproc.core.prompts import policy_prompts, prompt_budget_problem
from extproc.core.routes import Routes, routes_of
from extproc.core.tokens import ModelTokenizer


@dataclass(frozen=True)
class Contract:
    policy: GatewayPolicy
    tokenizers: Mapping[str, ModelTokenizer]
    # Per model (and per reranker, by RerankPolicy.key), what its tokenizer was loaded
    # from (extproc.service.contract_loading.tokenizer_key): a reload reuses it.
    tokenizer_keys: Mapping[str, Hashable] = field(default_factory=dict)

    @cached_property
    def routes(self) -> Routes:
        """Which endpoint serves each path (made once per contract)."""
        return routes_of(self.policy)


def check_prompt_budgets(
    source: str, index: int, model: ModelPolicy, tokenizer: ModelTokenizer
) -> None:
    """Raise PolicyError naming file, model and field when a prompt of the policy's own
    leaves too few of ``max_tokens`` for the input (extproc.core.prompts)."""
    for prompt in policy_prompts(model.prompts):
        (ids,) = tokenizer.encode([prompt.prefix])
        problem = prompt_budget_problem(
            prompt, len(ids), max_tokens=model.max_tokens, special_tokens=tokenizer.special_count
        )
        if problem is not None:
            raise PolicyError(
                source, f"models[{index}].{prompt.field}", f"model {model.name!r}: {problem}"
            )
