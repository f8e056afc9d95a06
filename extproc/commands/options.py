"""Command-line options that several `extproc` commands share, each defined once.

A tool adds the groups it needs (``add_tool_parser``; ``add_compared_servers``, or
its parts ``add_servers_options``, ``add_timeout_option`` and ``add_header_option``;
``add_budget_option``), and reads the servers it compares with ``servers_from``; a command that
starts Envoy, ``add_envoy_options`` and ``add_workers_option``. The options of the
ext_proc server a command runs are :mod:`extproc.runtime.server_options`. A flag
therefore means the same, with the same default and environment variable, wherever
it appears.

Every command fills its option objects from its flags one way: a field takes the
value of the flag of its name (``flag_values``; the few named otherwise are in
``FLAG_OF_FIELD``), an upstream's field the URL of its flag read as an upstream
(``upstream_of``, ``upstream_values``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, Final

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.runtime.envoy_config import Upstream
from extproc.runtime.server_options import add_seconds_option
from extproc.tools.toolkit.embeddings_client import DEFAULT_TIMEOUT_S, embeddings_dialect
from extproc.tools.toolkit.server_pair import ServerPair

MAX_TIMEOUT_S: Final = 3600.0

# Option objects' fields whose flag (its argparse destination) is named otherwise.
FLAG_OF_FIELD: Final = {
    "metrics_address": "metrics",
    "grace_seconds": "grace",
    "upstream_timeout_s": "upstream_timeout",
    "timeout_s": "timeout",
    "policy_file": "config",
}
# What every command that starts Envoy takes from its flags alike: where clients
# connect, the ext_proc server's metrics and grace, how Envoy runs.
LAUNCHER_FIELDS: Final = (
    "listen",
    "metrics_address",
    "grace_seconds",
    "envoy_log_level",
    "envoy_concurrency",
    "upstream_timeout_s",
)


def flag_values(args: argparse.Namespace, *fields: str) -> dict[str, Any]:
    """Each of ``fields`` -> the value of its flag."""
    return {field: getattr(args, FLAG_OF_FIELD.get(field, field)) for field in fields}


def upstream_of(args: argparse.Namespace, field: str) -> Upstream | None:
    """The URL of ``field``'s flag read as an upstream (None when not given);
    ValueError naming the flag of a URL that is not one."""
    url = getattr(args, field)
    try:
        return Upstream.from_url(url) if url else None
    except ValueError as exc:
        raise ValueError(f"--{field.replace('_', '-')}: {exc}") from None


def upstream_values(args: argparse.Namespace, *fields: str) -> dict[str, Any]:
    """Each of ``fields`` -> its flag's upstream (:func:`upstream_of`)."""
    return {field: upstream_of(args, field) for field in fields}


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


def add_compared_servers(parser: argparse._ActionsContainer, baseline: str, candidate: str) -> None:
    """--baseline, --candidate, --timeout and --header: the two servers a tool compares
    and how its clients ask them (``baseline``, ``candidate``: what each is, for the
    help)."""
    add_servers_options(parser, baseline, candidate)
    add_timeout_option(parser)
    add_header_option(parser)


def servers_from(args: argparse.Namespace, url: Callable[[str], str]) -> ServerPair:
    """The flags of :func:`add_compared_servers`, each server's URL read by ``url``;
    ValueError (the tool's exit 2) naming the flag that is wrong."""
    if not 0 < args.timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"--timeout must be within (0, {MAX_TIMEOUT_S:g}] seconds")
    urls = {}
    for flag in ("baseline", "candidate"):
        try:
            urls[flag] = url(getattr(args, flag))
        except ValueError as exc:
            raise ValueError(f"--{flag}: {exc}") from None
    return ServerPair(**urls, timeout_s=args.timeout, headers=headers_from(args.header))


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


def add_dialect_option(
    parser: argparse._ActionsContainer, names: Iterable[str], help_text: str
) -> None:
    """--dialect: the legacy clients' API, one of ``names`` (spelt with hyphens)."""
    choices = sorted({name.replace("_", "-") for name in names})
    parser.add_argument("--dialect", choices=choices, default=None, help=help_text)


def embeddings_dialect_from(args: argparse.Namespace) -> EmbeddingsDialect | None:
    """--dialect as an embeddings dialect (None: OpenAI's)."""
    name = getattr(args, "dialect", None)
    return None if name is None else embeddings_dialect(name.replace("-", "_"))


EMBEDDINGS_DIALECT_HELP = (
    "the legacy clients' API, spoken to both servers (the candidate being the gateway "
    "serving it), at its path unless the URLs name one: openai (default), tei, "
    "cohere-v1, cohere-v2, ollama, ollama-embeddings, jina"
)
