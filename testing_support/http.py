"""An HTTP client for loopback tests and tools, and a reader of Prometheus text."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from http.client import HTTPConnection
from typing import Any

import orjson

from testing_support.qwen import QWEN_MODEL

ENVELOPE_KEYS = frozenset({"message", "type", "param", "code"})


def envelope_error(body: bytes) -> dict[str, Any]:
    """The error of the OpenAI error envelope ``body`` must be: exactly
    ``{"error": {"message", "type", "param", "code"}}``, a message and a type that say
    something, ``param`` and ``code`` strings or null."""
    doc = orjson.loads(body)
    assert isinstance(doc, dict) and list(doc) == ["error"], doc
    error = doc["error"]
    assert isinstance(error, dict) and set(error) == ENVELOPE_KEYS, doc
    assert isinstance(error["message"], str) and error["message"].strip(), doc
    assert isinstance(error["type"], str) and error["type"], doc
    assert error["param"] is None or isinstance(error["param"], str), doc
    assert error["code"] is None or isinstance(error["code"], str), doc
    return dict(error)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    def error(self) -> dict[str, Any]:
        """The error of the OpenAI error envelope it must be (:func:`envelope_error`)."""
        return envelope_error(self.body)


def http(
    method: str,
    url: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Reply:
    """One request (a dict body is sent as JSON); an HTTP error status is a Reply too."""
    data = orjson.dumps(body) if isinstance(body, dict) else body
    all_headers = {"content-type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def request_body(inputs: int, dimensions: int, input_bytes: int) -> bytes:
    """``inputs`` distinct English documents of about ``input_bytes`` each, for
    QWEN_MODEL; with ``dimensions`` (0: none, the answer passes through untouched)."""
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps. "
    filler = (text * (input_bytes // len(text) + 1))[: max(input_bytes - 24, 0)]
    doc: dict[str, object] = {
        "model": QWEN_MODEL,
        "input": [f"document number {i} {filler}" for i in range(inputs)],
    }
    if dimensions:
        doc["dimensions"] = dimensions
    return orjson.dumps(doc)


def post(url: str, body: bytes, timeout: float) -> tuple[Reply, bool]:
    """POST ``body`` to ``url``'s /v1/embeddings as the common HTTP clients do (urllib3
    under requests, httpcore under httpx and the OpenAI SDK; curl reads while it sends):
    a gateway answer that comes before the upload is over (a 503 at the request headers,
    Envoy's 413) is followed by Envoy closing the connection, so the rest of the upload
    fails; the answer is read all the same. True: the upload was cut that way."""
    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    connection = HTTPConnection(host, int(port), timeout=timeout)
    cut = False
    try:
        try:
            connection.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            cut = True
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Reply(response.status, headers, response.read()), cut
    finally:
        connection.close()


def answers_ok(url: str, timeout: float = 2.0) -> bool:
    """GET ``url`` answers 200 (False while nothing listens there)."""
    try:
        return http("GET", url, timeout=timeout).status == 200
    except OSError:
        return False


def metric_value(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_part = head.partition("{")
        if metric != name:
            continue
        found = dict(
            item.split("=", 1) for item in label_part.rstrip("}").split(",") if "=" in item
        )
        if all(found.get(k, "").strip('"') == v for k, v in labels.items()):
            total += float(value)
    return total
