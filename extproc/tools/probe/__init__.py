"""Offline parity probe: `extproc probe --baseline URL --candidate URL`.

Answers are read and compared, and judged, with :mod:`extproc.tools.parity`.

Modules, one concept each: ``corpus`` (documents and queries), ``client`` (HTTP),
``stats`` (percentiles, spreads), ``vector_parity`` (section 1), ``contract_table``
(section 2), ``latency`` (section 3), ``readiness_checks`` (the checks, on the shared
verdict model), ``probe_report`` (Markdown, JSON), ``html_report`` and ``svg`` (HTML
page). The command line is :mod:`extproc.commands.probe`.
"""
