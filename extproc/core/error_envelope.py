"""Error answers, built in exactly one place.

Every non-2xx answer a client sees from the gateway - our own rejections, upstream
errors we re-envelope, faults - is an :class:`ApiError`. An error carries its HTTP
meaning (status, OpenAI ``type``, offending ``param``) the way h11's ProtocolError
carries ``error_status_hint``, so callers never pick statuses by hand.

How it reaches the client is the policy's :class:`ErrorDialect`: by default OpenAI's
``{"error": {"message", "type", "param", "code"}}`` with OpenAI's statuses; or the
legacy server's, which gives each kind of client mistake (:class:`ErrorClass`) its
own status and writes the body in its shape (FastAPI's ``detail``, or flat). Only
client mistakes change status: a 5xx stays the same 5xx in every dialect.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final

import orjson

INVALID_REQUEST: Final = "invalid_request_error"
SERVER_ERROR: Final = "server_error"
RATE_LIMIT: Final = "rate_limit_error"
AUTHENTICATION: Final = "authentication_error"
PERMISSION: Final = "permission_error"

# Messages quote what the client sent (a model name, an input_type...). Bounded here,
# for every message at once, so an 8 MB field is never echoed back whole; room is left
# for the longest message of our own (the 404 lists every served model).
MAX_MESSAGE_CHARS: Final = 2048
# One value of the client's quoted back in its own field's message (an unknown model
# name, an input_type, a content type): OpenAI echoes the model name too. Bounded much
# tighter than a whole message, and escaped (see quoted).
MAX_QUOTED_CHARS: Final = 100


def quoted(value: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``value`` as a quoted literal for a message: at most ``limit`` characters, then
    "..."; control, format and separator characters escaped (repr), so a quoted value
    can neither break a log line nor hide text behind bidi controls."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + "..."


class ErrorShape(enum.Enum):
    """The body of an error answer (policy.proto's ``Errors.Shape``)."""

    OPENAI = "openai"  # {"error": {"message", "type", "param", "code"}}
    # FastAPI's: {"detail": [{"type", "loc", "msg", "input"}]} for what its request
    # model validates (VALIDATED), {"detail": "..."} for what its handler raises.
    FASTAPI = "fastapi"
    FLAT = "flat"  # {"message", "type", "param", "code"}
    TEI = "tei"  # {"error", "error_type"}: Hugging Face text-embeddings-inference's


class ErrorClass(enum.Enum):
    """Kinds of client mistake whose status a legacy server chose (``ErrorStatuses``)."""

    MALFORMED = "malformed"
    INVALID = "invalid"
    UNKNOWN_MODEL = "unknown_model"
    TOO_LARGE = "too_large"
    DIMENSIONS = "dimensions"
    TOO_LONG = "too_long"
    INSTRUCTION = "instruction"


# The codes that name a class on their own (the rest go by status and param).
MALFORMED_CODE: Final = "invalid_json"
UNKNOWN_MODEL_CODE: Final = "model_not_found"
TOO_LONG_CODE: Final = "context_length_exceeded"
UPSTREAM_CODE: Final = "upstream_error"  # the upstream's own refusal, passed on


class ApiError(Exception):
    """An answer for the client in OpenAI's error envelope. A client mistake whose
    status a legacy server chose is raised as one of the subclasses below, which
    name their :class:`ErrorClass` where they are raised: the class decides the status
    a policy's dialect gives it, so it is never worked out afterwards from codes."""

    error_class: ClassVar[ErrorClass | None] = None  # None: not a client mistake

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # the envelope's own field name
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def envelope(self) -> bytes:
        """The OpenAI envelope (the default dialect's body)."""
        return orjson.dumps({"error": _fields(self)})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.status}, {self.message!r}, type={self.type!r}, "
            f"param={self.param!r})"
        )


class ServerError(ApiError):
    """A fault, never the client's: its 5xx stays the same in every dialect."""

    def __init__(self, status: int, message: str, *, code: str) -> None:
        super().__init__(status, message, type=SERVER_ERROR, code=code)


class ClientError(ApiError):
    """A client mistake of one :class:`ErrorClass`, with OpenAI's status for it."""

    default_status: ClassVar[int] = 400
    default_param: ClassVar[str | None] = None
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(
            self.default_status,
            message,
            param=param or self.default_param,
            code=code or self.default_code,
        )


class MalformedBodyError(ClientError):
    """The body is not a JSON object (bad JSON, empty, a byte order mark refused)."""

    error_class = ErrorClass.MALFORMED
    default_code = MALFORMED_CODE


class InvalidFieldError(ClientError):
    """A field is missing, of the wrong type or out of range."""

    error_class = ErrorClass.INVALID


class UnknownModelError(ClientError):
    """The ``model`` is not one this endpoint serves."""

    error_class = ErrorClass.UNKNOWN_MODEL
    default_status = 404
    default_param = "model"
    default_code = UNKNOWN_MODEL_CODE


class TooLargeError(ClientError):
    """The body, its inputs or their tokenization are over a size limit."""

    error_class = ErrorClass.TOO_LARGE
    default_status = 413
    default_code = "request_too_large"


class DimensionsError(ClientError):
    """A ``dimensions`` the model does not take."""

    error_class = ErrorClass.DIMENSIONS
    default_param = "dimensions"


class TooLongError(ClientError):
    """An input over ``max_tokens``, where the policy refuses such inputs."""

    error_class = ErrorClass.TOO_LONG
    default_param = "input"
    default_code = TOO_LONG_CODE


class InstructionError(ClientError):
    """An ``instruction`` the policy refuses, or one it cannot apply."""

    error_class = ErrorClass.INSTRUCTION
    default_param = "instruction"


def type_for_status(status: int) -> str:
    """The OpenAI error ``type`` clients expect for an HTTP status."""
    if status >= 500:
        return SERVER_ERROR
    return {401: AUTHENTICATION, 403: PERMISSION, 429: RATE_LIMIT}.get(status, INVALID_REQUEST)


# Classes that default to INVALID's status when the dialect gives them none.
_NARROWER: Final = (ErrorClass.DIMENSIONS, ErrorClass.TOO_LONG, ErrorClass.INSTRUCTION)
# What a FastAPI server's request model refuses (pydantic: JSON, types, ranges, extra
# fields), answered as a list of errors; the rest its handler raises, as one text.
VALIDATED: Final = frozenset(
    {ErrorClass.MALFORMED, ErrorClass.INVALID, ErrorClass.DIMENSIONS, ErrorClass.INSTRUCTION}
)


@dataclass(frozen=True)
class ErrorDialect:
    """How the legacy server answered client mistakes: a status per class (only
    those that differ from the gateway's own) and the body's shape."""

    shape: ErrorShape = ErrorShape.OPENAI
    statuses: Mapping[ErrorClass, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_openai(self) -> bool:
        return self.shape is ErrorShape.OPENAI and not self.statuses

    def status_of(self, error: ApiError) -> int:
        kind = error.error_class
        if kind is None:
            return error.status
        status = self.statuses.get(kind)
        if status is None and kind in _NARROWER:
            status = self.statuses.get(ErrorClass.INVALID)
        return error.status if status is None else status

    def answer(self, error: ApiError) -> tuple[int, bytes]:
        """The status and body the client gets for ``error``."""
        if self.is_openai:
            return error.status, error.envelope()
        status = self.status_of(error)
        return status, self.body(error, status)

    def body(self, error: ApiError, status: int) -> bytes:
        """``error`` in this dialect's shape, answered with ``status``."""
        if self.shape is ErrorShape.OPENAI:
            return error.envelope()
        if self.shape is ErrorShape.FLAT:
            return orjson.dumps(_fields(error))
        if self.shape is ErrorShape.TEI:
            return orjson.dumps({"error": error.message, "error_type": _tei_type(status)})
        if error.error_class not in VALIDATED:
            return orjson.dumps({"detail": error.message})
        kind = "json_invalid" if error.error_class is ErrorClass.MALFORMED else "value_error"
        loc = ["body", error.param] if error.param else ["body"]
        item = {"type": kind, "loc": loc, "msg": error.message, "input": None}
        return orjson.dumps({"detail": [item]})


OPENAI_ERRORS: Final = ErrorDialect()


def _tei_type(status: int) -> str:
    if status in (429, 503):
        return "Overloaded"
    return "Backend" if status >= 500 else "Validation"


def _fields(error: ApiError) -> dict[str, Any]:
    return {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
