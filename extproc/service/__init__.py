"""The ext_proc service: the I/O shell around the core.

The stream: ``stream`` (the per-stream state machine that maps Envoy's messages onto
the core), ``envoy_messages`` (those messages read and answered), ``servicer`` and
``server`` (grpc.aio around it), ``admission`` (the budget of work in flight),
``memory`` (memory given back), ``net`` (addresses and ports), ``stop_signals``.
What it reports: ``stream_metrics`` and ``metrics`` (Prometheus), ``stream_tracer``
and ``tracing`` (OpenTelemetry). TLS: ``tls`` and ``tls_credentials``. The policy and
its files: ``regular_file`` (reading a file an operator names), ``policy_file`` (the
policy file read and loaded), ``tokenizer_overrides`` (``--tokenizer`` and its
environment variable), ``tokenizer_files`` (tokenizers loaded), ``contract_loading``
(a policy's contract) and ``reload`` (the policy reloaded live)."""
