"""The OpenAI error envelope, built in exactly one place.

Every non-2xx answer a client sees from the gateway - our own rejections, upstream
errors we re-envelope, faults - is an :class:`ApiError` turned into
``{"error": {"message", "type", "param", "code"}}``. An error carries its HTTP
meaning (status, OpenAI ``type``, offending ``param``) the way h11's ProtocolError
carries ``error_status_hint``, so callers never pick statuses by hand.
"""

from __future__ import annotations

from typing import Final

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


class ApiError(Exception):
    """An answer for the client in OpenAI's error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,  # the envelope's own field name
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
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

    def __repr__(self) -> str:
        return (
            f"ApiError({self.status}, {self.message!r}, type={self.type!r}, param={self.param!r})"
        )


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, type=INVALID_REQUEST, param=param, code=code)


def type_for_status(status: int) -> str:
    """The OpenAI error ``type`` clients expect for an HTTP status."""
    if status >= 500:
        return SERVER_ERROR
    return {401: AUTHENTICATION, 403: PERMISSION, 429: RATE_LIMIT}.get(status, INVALID_REQUEST)
