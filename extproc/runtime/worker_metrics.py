"""The launcher's /metrics for `extproc run --workers N`: every worker's, added up.

prometheus_client's multiprocess mode: each worker writes its metrics to files in one
directory (``PROMETHEUS_MULTIPROC_DIR``, set in the workers' environment only) and the
launcher serves their sum on the one ``--metrics`` address, so a scrape config, the
dashboard and the alert rules see one target whatever N is. Counters and histograms
add up over every worker that ever ran (a restarted worker's counts stay: the totals
never go back); gauges are summed, or maxed, over the live workers
(``multiprocess_mode`` in extproc/service/metrics.py). A worker's files of live gauges
go when it exits. The launcher adds its own: ``extproc_worker_restarts_total`` and
``extproc_workers_serving``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from extproc.service.net import split_host_port


class WorkerMetrics:
    """The multiprocess directory and the HTTP endpoint that serves it."""

    def __init__(self, address: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="extproc-metrics-"))
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(self.directory))  # type: ignore[no-untyped-call]
        self.restarts = Counter(
            "extproc_worker_restarts_total",
            "ext_proc worker processes restarted by `extproc run` after they exited.",
            registry=self.registry,
        )
        self.serving = Gauge(
            "extproc_workers_serving",
            "ext_proc worker processes of `extproc run` serving (started, not exited since).",
            registry=self.registry,
        )
        host, port = split_host_port(address)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def worker_exited(self, pid: int) -> None:
        """Drop the exited worker's live gauges (its counters stay in the sums)."""
        mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)
