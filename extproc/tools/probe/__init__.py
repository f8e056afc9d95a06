"""Offline parity probe: `extproc probe --baseline URL --candidate URL`.

Answers are read and compared, and judged, with :mod:`extproc.tools.parity`.

Modules, one concept each: ``corpus`` (documents and queries), ``client`` (HTTP),
``stats`` (percentiles, spreads), ``parity`` (section 1), ``contract`` (section 2),
``latency`` (section 3), ``verdict`` (the checks, on the shared verdict model),
``report`` (Markdown, JSON), ``html_report`` and ``svg`` (HTML page), ``command`` (CLI).
"""

from extproc.tools.probe.command import add_parser, run

__all__ = ["add_parser", "run"]
