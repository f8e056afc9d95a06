"""The sans-I/O contract core: bytes and a policy in, bytes and a plan (or a typed
ApiError) out. Nothing here opens a file (the package's own presets aside, read as
package data like an import), reads the environment or a clock, or imports grpc,
prometheus_client or Envoy's protos (tests/test_layers.py); the layers above it
(service, runtime, tools, commands) touch files, sockets and processes.

Requests: ``request_headers`` (the line and headers), ``request_coding`` (how the body
was coded), ``request_json`` and ``lax`` (the body read, lax spellings included),
``prompts`` (the prompt prefix of each role), ``tokens`` and ``truncation`` (counting
and cutting tokens within a budget), ``request_rewrite`` (what the upstream is asked)
and ``plan`` (what the response phase must do). Responses: ``embeddings_body`` (the
success body read), ``vectors`` (decoded, checked, cut, encoded),
``response_rewrite`` (what the client receives), ``upstream_errors`` (an upstream's
error read) and ``error_envelope`` (every error answer), ``status`` (status classes).
Around them: ``policy`` (the policy's schema, presets and loader), ``contract`` (a
policy and its tokenizers), ``upstreams`` (one adapter per upstream kind) and
``rerank`` (the rerank contract)."""
