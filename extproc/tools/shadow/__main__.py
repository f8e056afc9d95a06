"""``python -m extproc.tools.shadow shadow-compare|shadow-report|shadow ...``: the shadow
commands on their own (the same as ``extproc shadow-compare`` etc.)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from extproc.tools.shadow.command import add_parsers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extproc.tools.shadow")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("EXTPROC_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.shadow_handler(args))


if __name__ == "__main__":
    sys.exit(main())
