"""The package's HTTP client (extproc/runtime/blocking_http.py) against a small local
server: one kept-alive connection per thread, a request on a connection the server
closed in the meantime sent again on a new one, no exception for a request without an
answer, the client's headers over a request's defaults, and the one-shot helpers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from extproc.runtime.blocking_http import HttpClient, answers_ok, request_once, split_url
from testing_support.processes import free_port


class _Server(ThreadingHTTPServer):
    requests = 0
    connections = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the server closes
    server: _Server

    def setup(self) -> None:  # once per connection
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self._answer(self.rfile.read(length))

    def _answer(self, echoed: bytes = b"") -> None:
        self.server.requests += 1  # before the answer: the client may look right after it
        status = 404 if self.path == "/missing" else 200
        body = echoed or f"{self.headers.get('content-type')}|{self.headers.get('x-key')}".encode()
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        # "/drop": close the connection without saying so (a stale keep-alive to come)
        self.close_connection = self.path == "/drop"

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_one_kept_alive_connection_per_thread(server: _Server) -> None:
    with HttpClient(_url(server), timeout_s=5.0) as client:
        assert [client.get("/").status for _ in range(3)] == [200, 200, 200]
        assert server.connections == 1
        other = threading.Thread(target=client.get, args=("/",))
        other.start()
        other.join()
        assert server.connections == 2


def test_a_stale_keep_alive_is_sent_again_on_a_new_connection(server: _Server) -> None:
    with HttpClient(_url(server), timeout_s=5.0) as client:
        assert client.get("/drop").status == 200  # the server closes after this answer
        result = client.post("/", b'{"a": 1}')
    assert (result.status, result.body, result.error) == (200, b'{"a": 1}', None)
    assert server.connections == 2 and server.requests == 2


def test_no_answer_is_a_result_not_an_exception() -> None:
    refused = request_once("GET", f"http://127.0.0.1:{free_port()}/", timeout_s=2.0)
    assert (refused.status, refused.error) == (0, "connection refused")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        hung = request_once("GET", f"http://127.0.0.1:{port}/", timeout_s=0.2)
    assert (hung.status, hung.error) == (0, "timed out")


def test_the_clients_headers_win_over_a_requests_defaults(server: _Server) -> None:
    with HttpClient(_url(server), timeout_s=5.0, headers={"x-key": "k"}) as client:
        assert client.get("/").body == b"None|k"
    with HttpClient(_url(server), timeout_s=5.0, headers={"content-type": "text/x"}) as client:
        assert client.request("GET", "/", headers={"content-type": "a/b"}).body == b"text/x|None"


def test_one_shot_helpers_and_urls(server: _Server) -> None:
    assert answers_ok(_url(server) + "/", timeout_s=2.0)
    assert not answers_ok(_url(server) + "/missing", timeout_s=2.0)
    assert split_url("https://h:1/a/b?c=d") == ("https://h:1", "/a/b?c=d")
    assert split_url("http://h") == ("http://h", "/")
    for bad in ("h:1/x", "ftp://h/", "http:///x"):
        with pytest.raises(ValueError):
            split_url(bad)
    with pytest.raises(ValueError):
        HttpClient("http://h/v1", timeout_s=1.0)  # a server, not a path on it
