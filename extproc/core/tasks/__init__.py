"""The tasks an endpoint does: ``embed`` (embeddings) and ``rerank``. A task is the
base class of its dialects (:mod:`extproc.core.dialects`): it holds what happens
between reading a client's request and writing its answer, the same for every
dialect of the task."""
