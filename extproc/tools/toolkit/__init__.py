"""What the tools are built from: the pieces probe, learn, shadow mode and
index-check share, and what a new tool starts with. A tool imports these and
:mod:`extproc.tools.parity` (answers read, compared and judged), never another tool's
modules (``tests/test_layers.py``).

Modules, one concept each:

- asking servers: ``server_pair`` (the two servers compared, and how they are asked),
  ``embeddings_client`` (one embeddings endpoint, on the package's HTTP client
  :mod:`extproc.runtime.blocking_http`), ``budgeted_client`` (a request budget per
  server), ``request_pool`` (at most N requests in flight, answers in order);
- what is sent: ``corpus`` (documents and queries, read with ``json_lines``),
  ``long_text`` (inputs past a token limit), ``rerank_requests`` (what a rerank
  dialect's clients send);
- comparing two servers: ``vector_parity`` (both servers' vectors for the corpus),
  ``contract_table`` (requests sent unchanged to both, judged row by row),
  ``readiness_checks`` (the verdict of those two), ``stats`` (percentiles, spreads,
  bootstrap intervals, histograms);
- reporting: ``run_meta`` (what every report says first: the servers, the model,
  when), ``report_format`` (Markdown cells, tables, numbers),
  ``comparison_markdown`` (the verdict, parity, contract and rerank sections),
  ``svg_charts`` (the HTML pages' charts), ``report_files`` (the JSON and the report
  directory), ``progress`` (notes on stderr).
"""
