"""The gateway's errors, each raised as what it is.

Every non-2xx answer a client sees from the gateway - our own rejections, upstream
errors we re-envelope, faults - is an :class:`ApiError`. An error carries its HTTP
meaning (status, OpenAI ``type``, offending ``param``) the way h11's ProtocolError
carries ``error_status_hint``, so callers never pick statuses by hand; a client
mistake is raised as the subclass of its :class:`ErrorClass`, a fault as a
:class:`ServerError`. How an error reaches the client (its status and body) is the
endpoint's :class:`~extproc.core.error_dialect.ErrorDialect`.
"""

from __future__ import annotations

import enum
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


class ErrorClass(enum.Enum):
    """Kinds of client mistake whose status a legacy server chose (``ErrorStatuses``)."""

    MALFORMED = "malformed"
    INVALID = "invalid"
    UNKNOWN_MODEL = "unknown_model"
    TOO_LARGE = "too_large"
    DIMENSIONS = "dimensions"
    TOO_LONG = "too_long"
    INSTRUCTION = "instruction"
    TOO_MANY_INPUTS = "too_many_inputs"


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
        # The body the client sent, when the error is about it: a template that
        # echoes the offending input (FastAPI's `input`) reads it from there.
        self.request: bytes | None = None

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

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        reason: str = "value",
    ) -> None:
        super().__init__(
            self.default_status,
            message,
            param=param or self.default_param,
            code=code or self.default_code,
        )
        # What exactly is wrong, in the words pydantic-style servers tell apart:
        # "missing" (a required field absent), "empty" (an empty list or text),
        # "below" / "above" (a number under or over its range), else "value". An error
        # body, and its status, may differ by it within one kind of mistake.
        self.reason = reason


class MalformedBodyError(ClientError):
    """The body is not a JSON object (bad JSON, empty, a byte order mark refused);
    ``position``: where its JSON broke, when that is what is wrong."""

    error_class = ErrorClass.MALFORMED
    default_code = MALFORMED_CODE

    def __init__(
        self, message: str, *, code: str | None = None, position: int | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.position = position


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


class TooManyInputsError(ClientError):
    """More inputs (or documents) in one request than the legacy server took."""

    error_class = ErrorClass.TOO_MANY_INPUTS


class InstructionError(ClientError):
    """An ``instruction`` the policy refuses, or one it cannot apply."""

    error_class = ErrorClass.INSTRUCTION
    default_param = "instruction"


def type_for_status(status: int) -> str:
    """The OpenAI error ``type`` clients expect for an HTTP status."""
    if status >= 500:
        return SERVER_ERROR
    return {401: AUTHENTICATION, 403: PERMISSION, 429: RATE_LIMIT}.get(status, INVALID_REQUEST)


def _fields(error: ApiError) -> dict[str, Any]:
    return {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
