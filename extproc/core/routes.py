"""A policy's route table: which endpoint serves each path (pure).

Every spelling of the embeddings endpoint (``/v1/embeddings``, ``/embeddings``) is
the OpenAI embeddings dialect, always there for every model (or a dialect that reads
every OpenAI request, Jina's, where a model's ``serves`` puts it there); each path
of the models' ``serves`` is the dialect named there, for the models that name it;
each of the policy's rerank paths is the rerank dialect its entries name. A path is
compared as Envoy's routes compare it (:func:`extproc.core.request_headers.route_of`).
A path no entry covers is not served: a 404, or, for a path a mesh's filter lets
through to the gateway (:data:`MESH_PATHS`), the legacy server's own traffic, left
untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from extproc.core.dialects import EMBEDDINGS_DIALECTS, OPENAI, RERANK_DIALECTS, rerank_dialect
from extproc.core.endpoint import Endpoint
from extproc.core.plan import ResponsePlan
from extproc.core.policy.model import GatewayPolicy, Served
from extproc.core.request_headers import UPSTREAM_PATH
from extproc.core.upstreams import adapter_for

# The paths a mesh's filter sends to the gateway besides the embeddings endpoint's
# (envoy/istio): every dialect's own, but the root (TEI's second path: a policy that
# serves it there extends the mesh's pattern).
MESH_PATHS: Final = frozenset(
    path
    for paths in (
        *(d.paths for d in RERANK_DIALECTS.values()),
        *(d.paths for d in EMBEDDINGS_DIALECTS.values()),
    )
    for path in paths
    if path != "/"
)


@dataclass(frozen=True)
class Routes:
    endpoints: Mapping[str, Endpoint[Any]]
    # What answers a response whose request this stream never read (envoy/
    # standalone.yaml's response stream, Envoy's own replies): only the embeddings
    # endpoint's plans travel between streams.
    embeddings: Endpoint[ResponsePlan]

    def at(self, route: str) -> Endpoint[Any] | None:
        return self.endpoints.get(route)

    def left_alone(self, route: str) -> bool:
        """A path a mesh lets through that no entry covers: not the gateway's."""
        return route in MESH_PATHS and route not in self.endpoints


def routes_of(policy: GatewayPolicy) -> Routes:
    answers = {m.name: m.answer for m in policy.models.values() if m.answer is not None}
    endpoints: dict[str, Endpoint[Any]] = {
        path: Endpoint(path, OPENAI, UPSTREAM_PATH, policy.errors, answers) for path in OPENAI.paths
    }
    served: dict[str, dict[str, Served]] = {}
    for model in policy.models.values():
        for entry in model.serves:
            served.setdefault(entry.path, {})[model.name] = entry
    for path, entries in sorted(served.items()):
        first = next(iter(entries.values()))  # the loader holds a path to one dialect
        dialect = EMBEDDINGS_DIALECTS[first.dialect]
        errors = next((e.errors for e in entries.values() if e.errors is not None), None)
        endpoints[path] = Endpoint(
            path,
            dialect,
            UPSTREAM_PATH,
            errors or dialect.errors or policy.errors,
            answers,
            # OpenAI's paths serve every model, in whichever dialect reads them.
            {} if path in OPENAI.paths else entries,
        )
    embeddings: Endpoint[ResponsePlan] = endpoints[UPSTREAM_PATH]
    for path in sorted(policy.rerank_paths()):
        first_reranker = policy.rerankers_at(path)[0]  # one dialect a path, too
        endpoints[path] = Endpoint(
            path,
            rerank_dialect(first_reranker.dialect),
            adapter_for(first_reranker.upstream_kind).rerank_path,
            first_reranker.errors or policy.errors,
        )
    return Routes(endpoints, embeddings)
