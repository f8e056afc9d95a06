"""What the response phase must do, decided once while the request is rewritten."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.core.upstreams import ADAPTERS

# Wider than any embedding model; bounds what a plan read from metadata may allocate.
MAX_NATIVE_DIMENSIONS = 1 << 20


class Encoding(enum.Enum):
    FLOAT = "float"
    BASE64 = "base64"


OPENAI_DIALECT: Final = "openai"

# Bytes per vector component as the upstream or the client sees it: base64 of a
# float32 is 16/3 bytes; a float32 written as JSON (`-0.012345678,`) about 12.
_BYTES_PER_VALUE = {Encoding.BASE64: 16 / 3, Encoding.FLOAT: 12.0}
_BYTES_PER_ITEM = 96  # `{"object":"embedding","index":N,"embedding":...}`


@dataclass(frozen=True)
class ResponsePlan:
    """The contract the client expects back, and what the upstream was asked for.

    ``native_dimensions`` is the width of the vectors the upstream answers: the
    model's native size, or the size forwarded to an upstream that cuts Matryoshka
    vectors itself. ``dimensions`` is set only when the gateway emulates Matryoshka
    (cut and re-normalise); a request for the native size needs no work.
    ``upstream_kind`` names the upstream adapter that reads the answer.
    """

    model: str
    input_count: int
    native_dimensions: int
    upstream_kind: str
    client_encoding: Encoding
    upstream_encoding: Encoding
    dimensions: int | None = None
    check_only: bool = False  # the policy asks for every 2xx to be checked
    renormalise: bool = True  # a cut is scaled back to unit length (matryoshka.renormalise)
    reshape: bool = False  # the answer is written anew: a layout of its own, a dialect's
    # The client's dialect and what its writer needs (options of its request): only
    # OpenAI's plans travel to a second stream; the others' routes carry the whole
    # exchange.
    dialect: str = OPENAI_DIALECT
    answer: tuple[tuple[str, Any], ...] = ()
    started: float = 0.0  # the clock when the request was read (seconds, monotonic)

    @property
    def rewrites_vectors(self) -> bool:
        return self.dimensions is not None or self.client_encoding is not self.upstream_encoding

    @property
    def needs_response(self) -> bool:
        """The gateway must see a 2xx body: to rewrite its vectors or its layout, or to
        check them."""
        return self.rewrites_vectors or self.check_only or self.reshape

    def answer_bytes(self) -> int:
        """The upstream's answer and the client's, both held while it is rewritten."""
        items = self.input_count
        upstream = items * (self.native_dimensions * _BYTES_PER_VALUE[self.upstream_encoding])
        client_dims = self.dimensions or self.native_dimensions
        client = items * (client_dims * _BYTES_PER_VALUE[self.client_encoding])
        return int(upstream + client) + 2 * items * _BYTES_PER_ITEM

    def to_json(self) -> str | None:
        """Compact form carried from the request's ext_proc stream to the response's
        (as Envoy dynamic metadata) when the two are separate filters. The upstream
        kind is written as the adapter's name ("dynamo", "vllm"): the same strings
        the older flavour field wrote, so plans from either version read the same.
        The flags that differ from their defaults follow as a ninth item, an object
        (``{"renormalise": false, "reshape": true}``): a plan of eight items has none;
        a dialect's answer options among them (``"dialect"``, ``"answer"``) where they
        are strings, booleans and lists of strings. None for a plan whose options are
        not: its routes carry the whole exchange, it never travels."""
        if not all(_travels(value) for _, value in self.answer):
            return None
        fields = [
            self.model,
            self.input_count,
            self.native_dimensions,
            self.upstream_kind,
            self.client_encoding.value,
            self.upstream_encoding.value,
            self.dimensions,
            self.check_only,
        ]
        flags: dict[str, Any] = {
            k: v
            for k, v in (("renormalise", self.renormalise), ("reshape", self.reshape))
            if v != _FLAG_DEFAULTS[k]
        }
        if self.dialect != OPENAI_DIALECT:
            flags["dialect"] = self.dialect
        if self.answer:
            flags["answer"] = [[name, value] for name, value in self.answer]
        if flags:
            fields.append(flags)
        return orjson.dumps(fields).decode()

    @classmethod
    def from_json(cls, text: str) -> ResponsePlan | None:
        """The plan, or None when ``text`` is not one (never raises)."""
        try:
            model, count, native, kind, client, upstream, dims, check, *rest = orjson.loads(text)
            flags = dict(_FLAG_DEFAULTS)
            dialect: Any = OPENAI_DIALECT
            answer: tuple[tuple[str, Any], ...] | None = ()
            if rest:
                (written,) = rest
                if not isinstance(written, dict):
                    return None
                dialect = written.pop("dialect", OPENAI_DIALECT)
                answer = _answer_options(written.pop("answer", []))
                if not isinstance(dialect, str) or answer is None:
                    return None
                if not written.keys() <= flags.keys():
                    return None
                if not all(type(v) is bool for v in written.values()):
                    return None
                flags |= written
            plan = cls(
                model=str(model),
                input_count=int(count),
                native_dimensions=int(native),
                upstream_kind=str(kind),
                client_encoding=Encoding(client),
                upstream_encoding=Encoding(upstream),
                dimensions=None if dims is None else int(dims),
                check_only=check is True,
                renormalise=flags["renormalise"],
                reshape=flags["reshape"],
                dialect=dialect,
                answer=answer or (),
            )
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return None
        # Only what to_json writes: int() would take true, 4.7 and "2"; a cut of 0, -3 or
        # past the native size would give vectors of the wrong size; a native size of
        # 10**12 would make numpy raise MemoryError.
        numbers = (count, native) if dims is None else (count, native, dims)
        if not isinstance(model, str) or not all(type(n) is int for n in numbers):
            return None
        if not isinstance(kind, str) or kind not in ADAPTERS:
            return None
        if type(check) is not bool:
            return None
        if plan.input_count < 1 or not 1 <= plan.native_dimensions <= MAX_NATIVE_DIMENSIONS:
            return None
        if plan.dimensions is not None and not 1 <= plan.dimensions <= plan.native_dimensions:
            return None
        return plan


_FLAG_DEFAULTS: Final = {"renormalise": True, "reshape": False}


def _travels(value: Any) -> bool:
    """An answer option JSON carries and reads back the same (a list as a tuple)."""
    if isinstance(value, tuple):
        return all(isinstance(item, str) for item in value)
    return isinstance(value, (str, bool))


def _answer_options(written: Any) -> tuple[tuple[str, Any], ...] | None:
    """Answer options as :meth:`ResponsePlan.to_json` writes them; None otherwise."""
    if not isinstance(written, list):
        return None
    options = []
    for pair in written:
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            return None
        name, value = pair
        value = tuple(value) if isinstance(value, list) else value
        if not _travels(value):
            return None
        options.append((name, value))
    return tuple(options)


@dataclass(frozen=True)
class RequestStats:
    """Per-request facts for metrics: no request text, only counts."""

    inputs: int
    prompted: bool = False
    truncated_inputs: int = 0
    tokens_cut: int = 0  # at least; see ModelTokenizer.encode_heads
    dimensions_emulated: bool = False
    dimensions_forwarded: bool = False  # the upstream cuts them itself (native path)
    fields_stripped: int = 0
