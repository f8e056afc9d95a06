"""Embeddings contract gateway: an Envoy ext_proc service that makes a Dynamo or
vLLM embeddings frontend answer like the legacy server (or OpenAI) it replaces."""

from extproc.contract import Contract, load_contract
from extproc.errors import ApiError
from extproc.plan import Encoding, RequestStats, ResponsePlan
from extproc.request_rewrite import Forward, rewrite_request
from extproc.response_rewrite import ClientAnswer, rewrite_response

__all__ = [
    "ApiError",
    "ClientAnswer",
    "Contract",
    "Encoding",
    "Forward",
    "RequestStats",
    "ResponsePlan",
    "load_contract",
    "rewrite_request",
    "rewrite_response",
]
