"""Offline parity probe: `extproc probe --baseline URL --candidate URL`.

Built on :mod:`extproc.tools.toolkit` (the client, the corpus, the vector parity and
contract sections and their checks) and :mod:`extproc.tools.parity` (answers read,
compared and judged).

Modules, one concept each: ``latency`` (section 3), ``probe_verdict`` (the toolkit's
checks and the latency section's), ``probe_report`` (Markdown, JSON), ``html_report``
and ``svg`` (HTML page). The command line is :mod:`extproc.commands.probe`.
"""
