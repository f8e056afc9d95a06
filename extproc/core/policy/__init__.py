"""Policy: what the gateway knows per served model (schema, presets, loader)."""

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.loader import load_policy_text
from extproc.core.policy.model import (
    EncodingProfile,
    GatewayPolicy,
    Limits,
    Matryoshka,
    ModelPolicy,
    PromptTemplates,
    SpecialTokens,
    TokenizerSource,
    UpstreamPolicy,
)

__all__ = [
    "EncodingProfile",
    "GatewayPolicy",
    "Limits",
    "Matryoshka",
    "ModelPolicy",
    "PolicyError",
    "PromptTemplates",
    "SpecialTokens",
    "TokenizerSource",
    "UpstreamPolicy",
    "load_policy_text",
]
