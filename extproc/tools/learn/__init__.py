"""`extproc learn`: write the policy from a live legacy server and the raw new upstream.

Modules, one concept each: ``session`` (the requests: budget, at most 4 in flight,
the record), ``local`` (the tokenizer, the model's files, the candidate prompts and
special tokens), one learner per aspect (``basics``, ``prompts``, ``truncation``,
``dimensions``, ``profile``, ``upstream``), ``findings`` (what a learner concludes),
``policy_file`` (the YAML), ``verify`` (the gateway against the baseline),
``report`` (Markdown, JSON) and ``command`` (CLI).
"""
