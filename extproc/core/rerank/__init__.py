"""The rerank contract, sans-I/O: a legacy rerank request (in one of the dialects
clients speak) in, what the rerank upstream is asked and a plan out; the upstream's
answer and the plan in, the client's answer in the legacy dialect out.

``dialects`` reads and writes the legacy shapes; ``rerank_upstreams`` writes what each
upstream kind is asked and reads what it answers; ``rerank_rewrite`` decides between
them (scores, order, top_n, documents, long pairs).
"""
