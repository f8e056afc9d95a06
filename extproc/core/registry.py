"""Tables of named parts (upstream adapters, client dialects) and the one way to look
one up: a name no table holds is an error that lists the names it does hold."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class UnknownNameError(LookupError):
    """No part of a table has this name."""


def table(*parts: T) -> Mapping[str, T]:
    """The parts by name, read-only."""
    return MappingProxyType({part.name: part for part in parts})


def named(parts: Mapping[str, T], name: str, what: str) -> T:
    """The part called ``name``; UnknownNameError naming ``what`` and the known ones."""
    try:
        return parts[name]
    except KeyError:
        known = ", ".join(sorted(parts))
        raise UnknownNameError(f"unknown {what} {name!r} (known: {known})") from None
