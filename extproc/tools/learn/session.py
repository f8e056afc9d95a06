"""Every request `extproc learn` sends, for every task: counted against a budget per
server (:mod:`extproc.tools.toolkit.budgeted_client`), at most four in flight across
both (:mod:`extproc.tools.toolkit.request_pool`), each answer recorded once as an
:class:`Exchange` (the learners and the report read the record). An embeddings
request goes to each server's embeddings endpoint; any other to a path of its root,
its answer read as the dialect the learner names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.tasks.rerank import Ranking, RerankDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.vectors import FloatMatrix
from extproc.runtime.blocking_http import HttpClient, HttpResult, split_url
from extproc.tools.parity import Answer, cosine
from extproc.tools.toolkit.budgeted_client import BudgetedClient, RequestBudget
from extproc.tools.toolkit.contract_table import error_text
from extproc.tools.toolkit.embeddings_client import DEFAULT_TIMEOUT_S, dialect_url, say, unsaid
from extproc.tools.toolkit.progress import Progress
from extproc.tools.toolkit.request_pool import RequestPool

Server = Literal["baseline", "candidate"]
SERVERS: tuple[Server, ...] = ("baseline", "candidate")
MAX_IN_FLIGHT = 4
SHOWN_CHARS = 48  # longer strings are shown as their length in the report
# One server's answers to the same token ids are the same floats. One token more or
# less at the end of a long input barely moves the cosine (pooling dilutes it), but
# moves some component by far more than this.
SAME_FLOATS = 1e-7


@dataclass(frozen=True)
class Exchange:
    """One request and what the server answered, reduced to what learning reads."""

    id: int
    server: Server
    label: str  # what the request asks, for people
    request: str  # the body, long strings shortened
    status: int  # 0: no answer
    prompt_tokens: int | None = None
    dims: int | None = None
    encoding: str | None = None  # "float" or "base64"
    norm: float | None = None
    message: str = ""  # an error's text
    envelope: str = ""  # an error body's shape (extproc.core.upstream_errors.Shape)
    vectors: FloatMatrix | None = field(default=None, repr=False, compare=False)
    # A rerank answer, and the dialect whose clients read it so.
    ranking: Ranking | None = field(default=None, repr=False, compare=False)
    read_as: str = ""
    # The body as answered, for the comparisons that must see it whole, and the one sent.
    body: bytes = field(default=b"", repr=False, compare=False)
    sent: bytes = field(default=b"", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """A usable answer: vectors, or a ranking."""
        return self.vectors is not None or self.ranking is not None

    def cosine_to(self, other: Exchange) -> float | None:
        """Cosine of the first vectors of two answers (None when not comparable)."""
        if self.vectors is None or other.vectors is None:
            return None
        if not len(self.vectors) or not len(other.vectors):  # an answer of no vectors
            return None
        try:
            return cosine(self.vectors[0], other.vectors[0])
        except ValueError:
            return None

    def same_as(self, other: Exchange) -> bool:
        """The same vector, to the float (for two answers of one server)."""
        a, b = self.vectors, other.vectors
        if a is None or b is None or a.shape[1:] != b.shape[1:] or not len(a) or not len(b):
            return False
        return bool(np.max(np.abs(a[0].astype(np.float64) - b[0])) <= SAME_FLOATS)

    def brief(self) -> str:
        """Status and result on one line, for the report and progress."""
        if self.status == 0:
            return f"no answer ({self.message})"
        if self.ranking is not None:
            return f"{self.status}, {self.ranking.count} results"
        if self.vectors is None:
            return f"{self.status}, {self.message}"
        tokens = "" if self.prompt_tokens is None else f", {self.prompt_tokens} tokens"
        return f"{self.status}, {self.dims}-d {self.encoding}{tokens}"


Request = tuple[Server, str, "dict[str, Any] | bytes"]


class Session:
    """Both servers' clients, their budgets and the record. ``urls``: each server's
    URL as given (its root, ``/v1``, or its embeddings endpoint); ``dialect``: the
    baseline's clients' (None: OpenAI's), in which every embeddings request to it is
    said and its answers read (the candidate, the new upstream, speaks OpenAI's)."""

    def __init__(
        self,
        urls: Mapping[str, str],
        budget: int,
        progress: Progress,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
        dialect: EmbeddingsDialect | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.dialects: dict[Server, EmbeddingsDialect | None] = {
            "baseline": dialect,
            "candidate": None,
        }
        self.headers = dict(headers or {})  # sent with every request, never recorded
        self.budgets = {server: RequestBudget(budget, server) for server in SERVERS}
        self.endpoints = {
            server: dialect_url(urls[server], self.dialects[server]) for server in SERVERS
        }
        ends = {server: split_url(self.endpoints[server]) for server in SERVERS}
        self.roots = {server: ends[server][0] for server in SERVERS}
        self._paths = {server: ends[server][1] for server in SERVERS}
        self._http = {
            server: HttpClient(self.roots[server], timeout_s=timeout_s, headers=self.headers)
            for server in SERVERS
        }
        self.exchanges: list[Exchange] = []
        self._progress = progress
        self._lock = threading.Lock()
        self._pool = RequestPool(MAX_IN_FLIGHT, "learn")

    @property
    def spent(self) -> dict[Server, int]:
        return {server: self.budgets[server].spent for server in SERVERS}

    def client(
        self, server: Server, url: str, dialect: EmbeddingsDialect | None = None
    ) -> BudgetedClient:
        """A client of the embeddings endpoint at ``url`` in ``dialect`` whose requests
        count against ``server``'s budget (the verification's, of the gateway)."""
        return BudgetedClient(
            url,
            self.budgets[server],
            timeout_s=self.timeout_s,
            headers=self.headers,
            dialect=dialect,
        )

    def close(self) -> None:
        self._pool.close()
        for client in self._http.values():
            client.close()

    def note(self, text: str) -> None:
        self._progress(text)

    def send(self, server: Server, label: str, body: dict[str, Any] | bytes) -> Exchange:
        """An embeddings request to the server's embeddings endpoint, as its clients
        say it (one the baseline's dialect cannot say is not sent: no answer)."""
        return self.ask(server, self._paths[server], label, body, self.dialects[server])

    def ask(
        self,
        server: Server,
        path: str,
        label: str,
        body: dict[str, Any] | bytes,
        dialect: EmbeddingsDialect | None,
    ) -> Exchange:
        """An OpenAI embeddings request to ``path``, said and read as ``dialect``'s
        clients do (None: OpenAI's)."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        said = say(dialect, raw)
        if said is None:
            result = unsaid(dialect)
        else:
            result = self._post(server, path, said)
        answer = Answer.read(result.status, result.body, dialect)
        vectors = answer.vectors
        message = (
            (result.error or "")
            if result.status == 0
            else (answer.problem or ("" if vectors is not None else error_text(result.body)))
        )
        return self._record(
            server,
            label,
            shown(body) if said is None or said is raw else f"POST {path} {shown_said(said)}",
            result,
            sent=said or raw,
            message=message,
            prompt_tokens=answer.prompt_tokens,
            dims=answer.dims,
            encoding=answer.encoding,
            norm=None if vectors is None or not len(vectors) else float(np.linalg.norm(vectors[0])),
            vectors=vectors,
        )

    def post(
        self,
        server: Server,
        path: str,
        label: str,
        body: dict[str, Any] | bytes,
        readers: Sequence[RerankDialect],
    ) -> Exchange:
        """A rerank request to ``path`` of the server's root, its answer read by the
        first of ``readers`` whose clients read it as a rerank answer."""
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        result = self._post(server, path, raw)
        ranking, read_as = None, ""
        if 200 <= result.status < 300:
            for dialect in readers:
                ranking = dialect.read_answer(result.body)
                if ranking is not None:
                    read_as = dialect.name
                    break
        error = parse_upstream_error(result.body)
        message = result.error or ("" if ranking else (error.message or ""))
        request = f"POST {path} {shown(body)}"
        fields = {"message": message, "ranking": ranking, "read_as": read_as, "sent": raw}
        return self._record(server, label, request, result, **fields)

    def _post(self, server: Server, path: str, raw: bytes) -> HttpResult:
        self.budgets[server].take()
        return self._http[server].post(path, raw)

    def _record(
        self, server: Server, label: str, request: str, result: HttpResult, **fields: Any
    ) -> Exchange:
        usable = fields.get("vectors") is not None or fields.get("ranking") is not None
        envelope = "" if usable else parse_upstream_error(result.body).shape
        with self._lock:
            exchange = Exchange(
                id=len(self.exchanges) + 1,
                server=server,
                label=label,
                request=request,
                status=result.status,
                envelope=envelope,
                body=result.body,
                **fields,
            )
            self.exchanges.append(exchange)
        return exchange

    def get_json(self, server: Server, path: str) -> tuple[Exchange, Any]:
        """GET ``path`` under the server's API root (``/v1``): the record and the JSON
        (None when the answer is not a 2xx JSON document)."""
        api_root = self._paths[server].rsplit("/", 1)[0]
        self.budgets[server].take()
        result = self._http[server].get(api_root + path)
        doc, message = None, result.error or ""
        if 200 <= result.status < 300:
            try:
                doc = orjson.loads(result.body)
            except orjson.JSONDecodeError:
                message = "not JSON"
            else:
                message = shown(doc) if isinstance(doc, dict) else ""
        elif result.status:
            message = error_text(result.body)
        label = "GET " + api_root + path
        with self._lock:
            exchange = Exchange(
                len(self.exchanges) + 1, server, label, "", result.status, message=message
            )
            self.exchanges.append(exchange)
        return exchange, doc

    def send_all(self, requests: Sequence[Request]) -> list[Exchange]:
        """Send in parallel (at most MAX_IN_FLIGHT); answers in the order asked."""
        return self._pool.send_all(lambda request: self.send(*request), requests)


def shown_said(said: bytes) -> str:
    """A body a dialect said, for the report, shortened as :func:`shown` does."""
    try:
        doc = orjson.loads(said)
    except orjson.JSONDecodeError:
        return shown(said)
    return shown(doc if isinstance(doc, dict) else said)


def shown(body: dict[str, Any] | bytes) -> str:
    """A request body for the report: JSON, with long strings and long lists shortened."""
    if isinstance(body, bytes):
        text = body.decode("utf-8", errors="replace").replace("\ufeff", "<BOM>")
        return text if len(text) <= 2 * SHOWN_CHARS else text[:SHOWN_CHARS] + "…"

    def short(value: Any) -> Any:
        if isinstance(value, str) and len(value) > SHOWN_CHARS:
            return f"<text, {len(value):,} chars>"
        if isinstance(value, list) and len(value) > 8 and all(isinstance(v, int) for v in value):
            return f"<{len(value):,} token ids>"
        if isinstance(value, list):
            return [short(v) for v in value]
        return value

    return orjson.dumps({k: short(v) for k, v in body.items()}).decode()


def first_true(test: Callable[[int], bool], low: int, high: int) -> int:
    """The smallest n in (low, high] for which ``test`` holds, by bisection: ``test``
    must hold from some n on, and hold at ``high`` (which is never asked)."""
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if test(middle) else (middle, high)
    return high
