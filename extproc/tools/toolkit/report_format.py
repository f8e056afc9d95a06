"""How the tools' reports show things: Markdown table rows and cells, code spans, and
numbers, cosines and ratios as the tables print them (the probe's HTML page shows the
same strings, escaped). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(text: str) -> str:
    """Make text safe inside a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def code_span(text: str) -> str:
    """Text as a code span inside a table cell; "-" for none."""
    return f"`{cell(text)}`" if text else "-"


def table_row(cells: Sequence[str]) -> str:
    """One Markdown table row of cells already made safe (:func:`cell`)."""
    return "| " + " | ".join(cells) + " |"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header, the rule, the rows."""
    return [table_row(header), "|" + "---|" * len(header), *(table_row(row) for row in rows)]


def fmt_num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_dim(value: int | None) -> str:
    return "-" if value is None else str(value)


def fmt_cos(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
