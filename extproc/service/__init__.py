"""The ext_proc service: the per-stream state machine that maps Envoy's messages onto
the core, the grpc.aio servicer and server around it, metrics, TLS and memory upkeep."""
