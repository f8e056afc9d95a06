"""What runs the gateway: its processes, and the Envoy configs they start from.

``gateway_launcher`` runs `extproc run`: the ext_proc server(s) of ``extproc_servers``
(one in this process, or the worker processes of ``worker_pool``, whose metrics
``worker_metrics`` adds up; ``worker_process`` is a worker's own side) and Envoy in
front of them (``envoy_process``), on a config ``envoy_config`` renders from a shipped
template. ``cpu_count`` says how many CPUs this
process may use (the default number of workers); ``default_upstream`` is the plain vLLM
`extproc run` starts when given no upstream.

The layer sits on core and service; the tools and the command lines sit on it, and it
imports neither (tests/test_layers.py).
"""
