"""Command-line options that several `extproc` commands share, each defined once.

A tool adds the groups it needs (``add_tool_parser``, ``add_servers_options``,
``add_timeout_option``, ``add_budget_option``, ``add_header_option``); a command that
starts Envoy, ``add_envoy_options`` and ``add_workers_option``. The options of the
ext_proc server a command runs are :mod:`extproc.runtime.server_options`. A flag
therefore means the same, with the same default and environment variable, wherever
it appears.
"""

from __future__ import annotations

import argparse

from extproc.runtime.server_options import add_seconds_option
from extproc.tools.toolkit.embeddings_client import DEFAULT_TIMEOUT_S


def add_tool_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str | None,
) -> argparse.ArgumentParser:
    """A tool's sub-command: ``summary`` in `extproc --help`, ``description`` (the
    command module's docstring) kept as written in `extproc NAME --help`."""
    return subparsers.add_parser(
        name,
        help=summary,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_servers_options(parser: argparse._ActionsContainer, baseline: str, candidate: str) -> None:
    """--baseline and --candidate: the two servers a tool compares, each a URL
    (``baseline``, ``candidate``: what each is, for the help)."""
    parser.add_argument("--baseline", required=True, metavar="URL", help=baseline)
    parser.add_argument("--candidate", required=True, metavar="URL", help=candidate)


def add_timeout_option(parser: argparse._ActionsContainer) -> None:
    """--timeout: how long a tool's client waits on each socket operation."""
    text = f"per socket operation (default {DEFAULT_TIMEOUT_S:g})"
    add_seconds_option(parser, "--timeout", DEFAULT_TIMEOUT_S, text)


def add_budget_option(parser: argparse._ActionsContainer, default: int) -> None:
    """--budget: the most requests a tool sends to each server."""
    parser.add_argument(
        "--budget",
        type=int,
        default=default,
        metavar="N",
        help=f"most requests to each server (default {default})",
    )


def check_budget(budget: int, most: int) -> None:
    """ValueError (the tool's exit 2) for a budget outside 1..most."""
    if not 1 <= budget <= most:
        raise ValueError(f"--budget must be within 1..{most}")


def add_header_option(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra request header for both servers, e.g. an API key "
        "(repeatable; never written to the report)",
    )


def headers_from(raw_headers: list[str]) -> dict[str, str]:
    """``--header`` values -> a mapping; ValueError naming a malformed one (never its value)."""
    headers: dict[str, str] = {}
    for raw in raw_headers:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header must be NAME:VALUE, got {raw.split(':')[0]!r}...")
        headers[name.strip()] = value.strip()
    return headers


def add_envoy_options(parser: argparse._ActionsContainer) -> None:
    """How a command runs the Envoy it starts."""
    text = "how long Envoy waits for the upstream's answer (then 504)"
    add_seconds_option(parser, "--upstream-timeout", 300.0, text)
    parser.add_argument("--envoy-log-level", default="warning")
    parser.add_argument("--envoy-concurrency", type=int, default=None)


def add_workers_option(parser: argparse._ActionsContainer) -> None:
    """--workers: how many ext_proc server processes a command runs behind its Envoy."""
    from extproc.runtime.cpu_count import cpus_available

    parser.add_argument(
        "--workers",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="ext_proc server processes behind the one Envoy, each on its own port; 1 "
        "serves in this process (default: the CPUs this process may use, from its "
        f"affinity and cgroup quota: {cpus_available()} here)",
    )


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
