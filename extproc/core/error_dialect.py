"""How a client hears of an error: the status of each kind of client mistake and the
body it is written in, as the legacy server answered (the policy's ``errors``, or a
rerank path's own).

By default OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with OpenAI's
statuses. A legacy server's dialect gives each kind of mistake (:class:`ErrorClass`)
its own status, and writes bodies from templates (:mod:`extproc.core.error_templates`):
a shipped shape's (:class:`ErrorShape`), or the server's own, learned from the bodies
it wrote, one for every kind or one per kind. Only client mistakes change status: a
fault keeps its 5xx in every dialect, and is written in the dialect's default
template.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

import orjson

from extproc.core.api_errors import ApiError, ErrorClass
from extproc.core.error_templates import (
    DETAIL_TEMPLATE,
    FASTAPI_TEMPLATES,
    FLAT_TEMPLATE,
    OPENAI_TEMPLATE,
    TEI_TEMPLATE,
    fill_template,
)
from extproc.core.json_templates import Template


class ErrorShape(enum.Enum):
    """The shipped error bodies (policy.proto's ``Errors.Shape``)."""

    OPENAI = "openai"  # {"error": {"message", "type", "param", "code"}}
    # FastAPI's: {"detail": [{"type", "loc", "msg", "input"}]} for what its request
    # model validates, {"detail": "..."} for what its handler raises.
    FASTAPI = "fastapi"
    FLAT = "flat"  # {"message", "type", "param", "code"}
    TEI = "tei"  # {"error", "error_type"}: Hugging Face text-embeddings-inference's


# Each shape as templates: the body of every kind, and of the kinds with their own.
SHAPE_TEMPLATES: Final[Mapping[ErrorShape, tuple[Template, Mapping[ErrorClass, Template]]]] = {
    ErrorShape.OPENAI: (OPENAI_TEMPLATE, {}),
    ErrorShape.FASTAPI: (DETAIL_TEMPLATE, FASTAPI_TEMPLATES),
    ErrorShape.FLAT: (FLAT_TEMPLATE, {}),
    ErrorShape.TEI: (TEI_TEMPLATE, {}),
}
# Classes that take INVALID's status when the dialect gives them none.
NARROWER: Final = (
    ErrorClass.DIMENSIONS,
    ErrorClass.TOO_LONG,
    ErrorClass.INSTRUCTION,
    ErrorClass.TOO_MANY_INPUTS,
)


@dataclass(frozen=True)
class ErrorDialect:
    """How the legacy server answered errors: a status per kind of client mistake (only
    those that differ from the gateway's own), the body of every error (``body``, a
    template; None: the shape's) and of the kinds with a body of their own."""

    shape: ErrorShape = ErrorShape.OPENAI
    statuses: Mapping[ErrorClass, int] = field(default_factory=lambda: MappingProxyType({}))
    body: Template = None
    # By kind ("invalid") or by kind and reason ("invalid.missing"): bodies that differ.
    bodies: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    # By kind and reason: statuses that differ from their kind's.
    status_by_reason: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_openai(self) -> bool:
        return (
            self.shape is ErrorShape.OPENAI
            and not self.statuses
            and self.body is None
            and not self.bodies
            and not self.status_by_reason
        )

    def status_of(self, error: ApiError) -> int:
        kind = error.error_class
        if kind is None:
            return error.status
        reason = getattr(error, "reason", None)
        if reason is not None and f"{kind.value}.{reason}" in self.status_by_reason:
            return self.status_by_reason[f"{kind.value}.{reason}"]
        status = self.statuses.get(kind)
        if status is None and kind in NARROWER:
            status = self.statuses.get(ErrorClass.INVALID)
        return error.status if status is None else status

    def answer(self, error: ApiError) -> tuple[int, bytes]:
        """The status and body the client gets for ``error``."""
        if self.is_openai:
            return error.status, error.envelope()
        status = self.status_of(error)
        return status, self.write(error, status)

    def write(self, error: ApiError, status: int) -> bytes:
        """``error``'s body in this dialect, answered with ``status``."""
        reason = getattr(error, "reason", None)
        template = self.template(error.error_class, reason)
        return orjson.dumps(fill_template(template, error, status))

    def template(self, kind: ErrorClass | None, reason: str | None = None) -> Template:
        """The body template of a kind of mistake (None: any other error), for what
        exactly is wrong where the dialect tells that apart."""
        default, own = SHAPE_TEMPLATES[self.shape]
        if kind is not None:
            for key in (f"{kind.value}.{reason}", kind.value):
                if key in self.bodies:
                    return self.bodies[key]
            if self.body is None and kind in own:
                return own[kind]
        return default if self.body is None else self.body


OPENAI_ERRORS: Final = ErrorDialect()
