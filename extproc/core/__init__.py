"""The sans-I/O contract core: bytes and a policy in, bytes and a plan (or a typed
ApiError) out. Nothing here imports grpc, prometheus_client or Envoy's protos; the
layers above it (service, runtime, tools, commands) touch sockets and processes."""
