"""Policy: what the gateway knows per served model.

``model`` holds the typed, validated policy; ``loader`` builds it from the policy's
text (the schema is `v1`, generated from protos/extproc/core/policy/v1/policy.proto),
filling each entry from its preset (``presets``, laid over with ``overlay``);
``errors`` is the one error a policy that cannot be served raises; ``changes`` says
what a reload changed."""

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
