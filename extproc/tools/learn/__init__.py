"""`extproc learn`: write the policy from a live legacy server and the raw new upstream.

Built on :mod:`extproc.tools.toolkit`: its budgeted clients and request pool carry the
session's requests, and the verification is its vector parity and contract table,
judged by its readiness checks and shown by its Markdown sections.

Modules, one concept each: ``session`` (the requests: budget, at most 4 in flight,
the record), ``local`` (the tokenizer, the model's files, the candidate prompts and
special tokens), one learner per aspect (``basics_learner``, ``prompts_learner``,
``truncation_learner``, ``dimensions_learner``, ``profile_learner``,
``upstream_learner``), ``probing_plan`` (every learner in order), ``findings`` (what a
learner concludes), ``policy_file`` (the YAML), ``verify`` (the gateway against the
baseline) and ``learn_report`` (Markdown, JSON). The command line is
:mod:`extproc.commands.learn`.
"""
