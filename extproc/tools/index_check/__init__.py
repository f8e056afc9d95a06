"""`extproc index-check`: can the index the legacy server built stay, once clients'
queries are embedded by the new path? Answered with retrieval over a sample, not
with cosines: ``beir_files`` (the corpus, queries and judgements), ``embedding_run``
(a sample embedded by one server), ``rankings`` (exact top-k), ``retrieval_metrics``
(agreement and relevance measures), ``index_measures`` (the four retrievals and the
per-text similarities), ``index_verdict`` (KEEP INDEX / RE-INDEX / INCONCLUSIVE and
the likely cause), ``index_run`` (one run against both servers) and ``index_report``
(Markdown, JSON, HTML). The command line is :mod:`extproc.commands.index_check`.
"""
