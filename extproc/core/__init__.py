"""The sans-I/O contract core: bytes and a policy in, bytes and a plan (or a typed
ApiError) out. Nothing here imports grpc, prometheus_client or Envoy's protos; the
service and commands layers are the only ones that touch sockets and processes."""
