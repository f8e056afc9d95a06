"""`extproc learn`: write the policy from a live legacy server and the raw new upstream,
for every task (embeddings, reranking), and verify it through the gateway.

Built on :mod:`extproc.tools.toolkit` (budgeted clients, the request pool, what is
sent) and :mod:`extproc.tools.parity` (answers compared and judged).

One skeleton for every task: ``session`` (every request: budget, at most 4 in
flight, the record), ``findings`` (what a learner concludes), a plan of learners per
task, ``policy_file`` (the YAML), ``verify`` (the gateway against the baseline) and
``learn_report`` (Markdown, JSON), with ``battery`` (the texts and batches verification
sends besides learning's requests).

- embeddings: ``local`` (the tokenizer, the model's files, the candidate prompts and
  special tokens) and one learner per aspect (``basics_learner``,
  ``prompts_learner``, ``truncation_learner``, ``dimensions_learner``,
  ``profile_learner``, ``upstream_learner``, ``names_learner``, ``batch_learner``,
  ``text_learner``, ``answer_learner``, ``dialects_learner``: the other dialects
  served), in order in ``probing_plan``;
- reranking: ``rerank_paths_learner`` (every path and its dialect),
  ``rerank_scores_learner`` (the scale, results and documents by default),
  ``rerank_long_pairs_learner``, in order in ``rerank_plan``;
- both: ``errors_learner`` (the error dialect, from every refusal seen).

The command line is :mod:`extproc.commands.learn`.
"""
