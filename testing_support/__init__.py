"""What the tests (tests/) and the benchmark tools (bench/) both use to run the gateway
on loopback: the one process wrapper, the gateway, `extproc serve` and a bare Envoy
started through it, an HTTP client, free ports, the real Qwen3 tokenizer's location and
the fake Dynamo/vLLM upstream. Neither tests/ nor bench/ imports the other; both import
this package. It is not part of the shipped wheel."""
