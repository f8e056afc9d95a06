"""`extproc index-check`: can the index the legacy server built stay, once clients'
queries are embedded by the new path? Answered with retrieval over a sample, not
with cosines: ``beir_files`` (the corpus, queries and judgements), ``rankings``
(exact top-k), ``retrieval_metrics`` (agreement and relevance measures),
``index_verdict`` (KEEP INDEX / RE-INDEX / INCONCLUSIVE and the likely cause). The
command line is :mod:`extproc.commands.index_check`.
"""
