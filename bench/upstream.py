"""An instant embeddings upstream for the benchmark: Dynamo-shaped bodies, no model.

Why nginx + njs (Debian ``nginx`` + ``libnginx-mod-http-js``): the benchmark must
measure the gateway, so the upstream has to cost next to nothing per request on a
2-core machine where everything (client, Envoy, ext_proc, upstream) shares the CPU.
nginx is event-driven C; one worker answers a 104 KB body in a few microseconds of
CPU, and njs is only used to pick one of four precomputed bodies (a substring test
on the request, no JSON parsing). When nginx or its njs module is missing, a Node.js
``http`` server (``upstream_node.js``, node ships on this machine's image) serves
the same files: single-threaded JavaScript costs a few times more CPU per request,
which only matters for the configurations without ext_proc (A, B); the harness
measures and reports the upstream's CPU per request either way.

Bodies are computed once, here, and written to files that the server loads at start:

- ``float-<n>.json``: ``{"object":"list","data":[{"object":"embedding","index":i,
  "embedding":[...]}],"model":...,"usage":{...}}`` with 1,024-d L2-unit vectors,
  floats printed as the shortest float32 repr (what Dynamo 1.6.1 prints), no
  ``id``/``created`` (Dynamo has none). ~104 KB for n = 8.
- ``base64-<n>.json``: the same vectors as base64 of their little-endian float32
  bytes (Dynamo's answer to ``"encoding_format":"base64"``; the gateway asks for it
  when it must cut vectors to ``dimensions``).
- ``float-<n>-d256.json``, ``base64-<n>-d256.json``: the same vectors cut to their
  first 256 components and re-normalised, what an upstream started Matryoshka answers
  to ``"dimensions": 256``. Served only on the second, "native" port (when started
  with one), to a request that asks for 256. The first port ignores ``dimensions``
  (where a real upstream not started Matryoshka would refuse it), so the cases that
  forward the field untouched (the floors) keep receiving whole vectors.

The server knows two batch sizes only: a request body over ``BIG_REQUEST_BYTES`` gets
the ``BIG_BATCH`` (2,048) answer, anything else the 8-vector one. The harness checks,
once per configuration and workload, that the count and size of the vectors the
client receives are right. Usage: ``python bench/upstream.py --port 8000`` serves
until Ctrl-C (for trying things by hand).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import orjson

from testing_support.processes import Process, port_open

HERE = Path(__file__).resolve().parent
MODEL = "Qwen/Qwen3-Embedding-0.6B"
DIMENSIONS = 1024
CUT_DIMENSIONS = 256  # what the native port answers to `"dimensions": 256`
CUT_SUFFIX = f"-d{CUT_DIMENSIONS}"
SMALL_BATCH = 8
BIG_BATCH = 2048
BIG_REQUEST_BYTES = 65536  # 8 docs ~ 3.5 KB, 2,048 docs ~ 850 KB
TOKENS_PER_INPUT = 87  # the seed's documents: ~84 tokens of text + EOS
NJS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
KINDS = ("nginx", "node")


def _float32_json(values: np.ndarray) -> bytes:
    # str(np.float32) is the shortest repr that round-trips to the same float32.
    return b"[" + b",".join(str(v).encode() for v in values) + b"]"


def embeddings_body(n: int, encoding: str, seed: int = 7, dimensions: int = DIMENSIONS) -> bytes:
    """The upstream's answer for a batch of ``n`` inputs (``float`` or ``base64``),
    cut to ``dimensions`` and re-normalised when that is below the native size."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIMENSIONS)).astype(np.float32)[:, :dimensions]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    items = []
    for i, vector in enumerate(vectors):
        if encoding == "base64":
            embedding = b'"' + base64.b64encode(vector.astype("<f4").tobytes()) + b'"'
        else:
            embedding = _float32_json(vector)
        items.append(b'{"object":"embedding","index":%d,"embedding":%s}' % (i, embedding))
    tokens = n * TOKENS_PER_INPUT
    tail = orjson.dumps(
        {"model": MODEL, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )
    return b'{"object":"list","data":[' + b",".join(items) + b"]," + tail[1:]


def write_bodies(
    directory: Path, sizes: tuple[int, ...] = (SMALL_BATCH, BIG_BATCH)
) -> dict[str, int]:
    """Write the bodies (float and base64 per batch size); return their sizes by name.

    The 2,048-vector float body takes ~4 s to print: skip it when no workload needs it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for n in sizes:
        for encoding in ("float", "base64"):
            for dimensions, suffix in ((DIMENSIONS, ""), (CUT_DIMENSIONS, CUT_SUFFIX)):
                name = f"{encoding}-{n}{suffix}.json"
                body = embeddings_body(n, encoding, dimensions=dimensions)
                (directory / name).write_bytes(body)
                written[name] = len(body)
    return written


def nginx_available() -> bool:
    return shutil.which("nginx") is not None and NJS_MODULE.is_file()


def _nginx_conf(directory: Path, port: int, native_port: int) -> str:
    d = str(directory)
    native = (
        f"""
    server {{
        listen 127.0.0.1:{native_port} backlog=4096;
        location = /v1/embeddings {{ js_content up.embeddings_cut; }}
        {_BODIES_LOCATION.format(d=d)}
        location / {{ return 404; }}
    }}"""
        if native_port
        else ""
    )
    return f"""
load_module {NJS_MODULE};
daemon off;
master_process on;
worker_processes 1;
user root root;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_max_body_size 16m;
    client_body_buffer_size 16m;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    tcp_nodelay on;
    sendfile on;
    js_path {HERE};
    js_preload_object bodies from {d}/bodies-8.json;
    js_import up from upstream_njs.js;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /v1/embeddings {{ js_content up.embeddings; }}
        {_BODIES_LOCATION.format(d=d)}
        location / {{ return 404; }}
    }}{native}
}}
"""


_BODIES_LOCATION = """location /_bodies/ {{
            internal;
            alias {d}/;
            default_type application/json;
            # The static module answers POST with 405; this re-serves it as GET.
            error_page 405 =200 $uri;
        }}"""


@dataclass
class UpstreamProcess:
    kind: str  # "nginx" or "node"
    process: Process
    port: int
    native_port: int = 0  # answers `dimensions` itself; 0 when not started

    def pids(self) -> list[int]:
        """The server's PIDs: nginx's master and its workers, or node."""
        pids = [self.process.pid]
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        with contextlib.suppress(OSError):
            pids += [int(p) for p in children.read_text().split()]
        return pids

    def stop(self, timeout: float = 10.0) -> None:
        workers = self.pids()[1:]
        self.process.stop(timeout)  # SIGTERM: nginx's fast shutdown
        for pid in workers:  # forked by our nginx master, normally gone with it
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "nginx":
                    os.kill(pid, signal.SIGKILL)


def start(
    directory: Path,
    port: int,
    kind: str = "auto",
    *,
    die_with_parent: bool = False,
    ready_timeout: float = 15.0,
    native_port: int = 0,
) -> UpstreamProcess:
    """Start the upstream on 127.0.0.1:port serving the bodies in ``directory``, and
    on ``native_port`` (unless 0) the same as an upstream that cuts ``dimensions``;
    ``die_with_parent``: it gets SIGTERM if this process dies."""
    if kind == "auto":
        kind = "nginx" if nginx_available() else "node"
    if kind == "nginx":
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (directory / sub).mkdir(exist_ok=True)
        small = [f"{e}-8{cut}" for e in ("float", "base64") for cut in ("", CUT_SUFFIX)]
        bodies = {name: (directory / f"{name}.json").read_text() for name in small}
        (directory / "bodies-8.json").write_bytes(orjson.dumps(bodies))
        conf = directory / "nginx.conf"
        conf.write_text(_nginx_conf(directory, port, native_port))
        argv = ["nginx", "-p", str(directory), "-c", str(conf), "-e", str(directory / "err.log")]
    elif kind == "node":
        node_ports = [str(port), *([str(native_port)] if native_port else [])]
        argv = ["node", str(HERE / "upstream_node.js"), str(directory), *node_ports]
    else:
        raise ValueError(f"unknown upstream kind {kind!r}")
    process = Process.start(
        argv, directory / f"{kind}.log", name=f"{kind} upstream", die_with_parent=die_with_parent
    )
    upstream = UpstreamProcess(kind, process, port, native_port)
    try:
        for listening in (p for p in (port, native_port) if p):
            process.wait_until(partial(port_open, listening), ready_timeout, f"on :{listening}")
    except BaseException:
        upstream.stop()
        raise
    return upstream


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-upstream"))
    parser.add_argument("--kind", choices=["auto", *KINDS], default="auto")
    args = parser.parse_args()
    print(write_bodies(args.dir))
    upstream = start(args.dir, args.port, args.kind)
    print(f"{upstream.kind} upstream on http://127.0.0.1:{args.port}/v1/embeddings", flush=True)
    try:
        upstream.process.popen.wait()
    except KeyboardInterrupt:
        pass
    finally:
        upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
