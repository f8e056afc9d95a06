"""The sans-I/O contract core: bytes and a policy in, bytes and a plan (or a typed
ApiError) out. Nothing here opens a file (the package's own presets aside, read as
package data like an import), reads the environment or a clock, or imports grpc,
prometheus_client or Envoy's protos (tests/test_layers.py); the layers above it
(service, runtime, tools, commands) touch files, sockets and processes.

The one contract interface: ``endpoint`` (an endpoint is a client dialect on a task;
the plan, the forward, the client's answer), ``routes`` (which endpoint serves each
path), ``tasks`` (embeddings and reranking, each the base of its dialects),
``dialects`` (one module per client dialect) and ``upstreams`` (one adapter per
upstream kind, for every task), both found by name with ``registry``. Around them:
``policy`` (the policy's schema, presets and loader) and ``contract`` (a policy, its
tokenizers and its routes).

Embeddings requests: ``request_headers`` (the line and headers), ``request_coding``
(how the body was coded), ``request_json`` and ``lax`` (the body read, lax spellings
included), ``preprocess`` (what a legacy server did to each text), ``prompts`` (the
prompt prefix of each role), ``tokens`` and ``truncation`` (counting and cutting
tokens within a budget), ``request_rewrite`` (what the upstream is asked) and ``plan``
(what the response phase must do). Their answers: ``embeddings_body`` (the success
body read), ``vectors`` (decoded, checked, cut, encoded), ``quantize`` (int8, uint8
and binary vectors from floats), ``response_rewrite`` (what
the client receives), ``upstream_errors`` (an upstream's error read) and
``status`` (status classes).

Bodies as a legacy server wrote them: ``json_templates`` (a body with slots the
gateway fills), ``answer_layout`` (a success body's), ``api_errors`` (each error raised
as its kind), ``error_templates`` (an error body's slots and the shipped shapes) and
``error_dialect`` (a kind's status and body)."""
