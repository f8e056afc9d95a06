"""Embeddings contract gateway: an Envoy ext_proc service that makes a Dynamo or
vLLM embeddings frontend answer like the legacy server (or OpenAI) it replaces."""

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.endpoint import ClientAnswer, Endpoint, Forward
from extproc.core.plan import Encoding, RequestStats, ResponsePlan
from extproc.core.request_rewrite import rewrite_request
from extproc.core.response_rewrite import rewrite_response
from extproc.service.contract_loading import load_contract

__all__ = [
    "ApiError",
    "ClientAnswer",
    "Contract",
    "Encoding",
    "Endpoint",
    "Forward",
    "RequestStats",
    "ResponsePlan",
    "load_contract",
    "rewrite_request",
    "rewrite_response",
]
