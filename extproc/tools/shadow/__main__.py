"""``python -m extproc.tools.shadow shadow|shadow-compare|shadow-report ...``: the same
as ``extproc shadow`` etc., without the gateway's own commands."""

import argparse
import logging
import sys

from extproc.commands.shadow import add_parsers

parser = argparse.ArgumentParser(prog="python -m extproc.tools.shadow")
add_parsers(parser.add_subparsers(dest="command", required=True))
arguments = parser.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
sys.exit(arguments.shadow_handler(arguments))
