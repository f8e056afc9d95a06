"""What the tools are built from: the pieces probe, learn and shadow mode share, and a
new tool starts with. A tool imports these (and :mod:`extproc.tools.parity`), never
another tool's modules.

Modules, one concept each: ``embeddings_client`` (one embeddings endpoint, on
:mod:`extproc.runtime.blocking_http`), ``corpus`` (documents and queries), ``stats``
(percentiles, spreads, histograms), ``vector_parity`` (both servers' vectors for the
corpus), ``contract_table`` (requests sent unchanged to both, judged row by row) and
``readiness_checks`` (the verdict of those two).
"""
