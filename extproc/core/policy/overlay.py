"""Laying one partial ``ModelPolicy`` over another: how presets fill policy entries."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message


def overlay(base: Message, top: Message) -> None:
    """Copy every field set in ``top`` onto ``base``; lists and maps replace, not append."""
    for fd, value in top.ListFields():
        if fd.message_type is not None and not _is_repeated(fd) and fd.containing_oneof is None:
            overlay(getattr(base, fd.name), value)
        elif _is_repeated(fd):
            base.ClearField(fd.name)
            container = getattr(base, fd.name)
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                container.update(value)
            else:
                container.extend(value)
        else:
            setattr(base, fd.name, value)


def _is_repeated(fd: Any) -> bool:
    return bool(fd.is_repeated)
