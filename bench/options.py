"""Command-line pieces the benchmark and the soak share."""

from __future__ import annotations

import argparse

from bench.upstream import KINDS


def command_parser(prog: str, doc: str, epilog: str) -> argparse.ArgumentParser:
    """A parser whose help is the module docstring's first paragraph."""
    return argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n", maxsplit=1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )


def add_upstream(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        choices=["auto", *KINDS],
        default="auto",
        help="instant upstream implementation (auto: nginx+njs if installed)",
    )
