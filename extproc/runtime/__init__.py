"""What runs the gateway: its processes, and the Envoy configs they start from.

``gateway_launcher`` runs `extproc run`: the ext_proc server(s) of ``extproc_servers``
(one in this process, or the worker processes of ``worker_pool``, whose metrics
``worker_metrics`` adds up; ``worker_process`` is a worker's own side and entry point)
and Envoy in front of them (``envoy_process``), on a config ``envoy_config`` renders
from a shipped template (with ``envoy_tracing``'s tracer under --tracing).
``serve_command`` is `extproc serve`, which a worker runs too, with the options of
``server_options``, from the contract ``starting_contract`` loads. ``cpu_count`` says
how many CPUs this process may use (the default number of workers);
``default_upstream`` is the plain vLLM `extproc run` starts when given no upstream;
``blocking_http`` is the package's one HTTP client.

The layer sits on core and service; the tools and the command lines sit on it, and it
imports neither, nor names their modules to run (tests/test_layers.py)."""
