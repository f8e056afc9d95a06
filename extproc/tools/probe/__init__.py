"""Offline parity probe: `extproc probe --baseline URL --candidate URL`.

Modules, one concept each: ``corpus`` (documents and queries), ``client`` (HTTP),
``answers`` (reading bodies), ``stats`` (cosine, percentiles), ``parity`` (section 1),
``contract`` (section 2), ``latency`` (section 3), ``verdict`` (thresholds, exit code),
``report`` (Markdown, JSON), ``html_report`` and ``svg`` (HTML page), ``command`` (CLI).
"""

from extproc.tools.probe.command import add_parser, run

__all__ = ["add_parser", "run"]
