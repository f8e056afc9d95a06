"""Offline parity probe: `extproc probe --baseline URL --candidate URL`, for
embeddings or (``--task rerank``) reranking.

Built on :mod:`extproc.tools.toolkit` (the clients, the corpus, the vector parity and
contract sections and their checks, the rerank requests) and
:mod:`extproc.tools.parity` (answers read, compared and judged).

Modules, one concept each: ``embeddings_probe`` and ``rerank_probe`` (one run of each
task against both servers), ``latency`` (the embeddings run's section 3),
``probe_verdict`` (each task's checks), ``probe_report`` (the report of either task:
Markdown, JSON) and ``html_report`` (its HTML page). The command line is
:mod:`extproc.commands.probe`.
"""
