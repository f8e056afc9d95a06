"""A :class:`Half` to and from the peer service's protobuf message (compact: float32 bytes)."""

from __future__ import annotations

import numpy as np

from extproc.tools.shadow.half import NO_VECTORS, Half, InputKind, Role
from extproc.tools.shadow.v1 import shadow_pb2 as pb

_ROLES = {Role.BASELINE: pb.BASELINE, Role.CANDIDATE: pb.CANDIDATE, Role.NOISE: pb.NOISE}
_ROLES_BACK = {v: k for k, v in _ROLES.items()}
_KINDS = {InputKind.DOCUMENT: pb.DOCUMENT, InputKind.QUERY: pb.QUERY}
_KINDS_BACK = {v: k for k, v in _KINDS.items()}


class BadHalfError(ValueError):
    pass


def to_proto(half: Half) -> pb.Half:
    rows, dims = int(half.vectors.shape[0]), int(half.vectors.shape[1])
    message = pb.Half(
        request_id=half.request_id,
        role=_ROLES[half.role],
        status=half.status,
        latency_seconds=half.latency_s,
        kind=_KINDS[half.kind],
        rows=rows,
        dims=dims,
        vectors=half.vectors.astype("<f4", copy=False).tobytes(),
        request_digest=half.request_digest,
        problem=half.problem,
        texts=list(half.texts),
    )
    if half.inputs is not None:
        message.inputs = half.inputs
    if half.prompt_tokens is not None:
        message.prompt_tokens = half.prompt_tokens
    if half.upstream_s is not None:
        message.upstream_seconds = half.upstream_s
    return message


def from_proto(message: pb.Half) -> Half:
    role = _ROLES_BACK.get(message.role)
    kind = _KINDS_BACK.get(message.kind)
    if role is None or kind is None or not message.request_id:
        raise BadHalfError("half without role, kind or request id")
    if len(message.vectors) != 4 * message.rows * message.dims:
        raise BadHalfError("vector bytes do not match rows x dims")
    vectors = NO_VECTORS
    if message.rows:
        vectors = (
            np.frombuffer(message.vectors, dtype="<f4")
            .reshape(message.rows, message.dims)
            .astype(np.float32)
        )
    return Half(
        request_id=message.request_id,
        role=role,
        status=message.status,
        latency_s=message.latency_seconds,
        kind=kind,
        inputs=message.inputs if message.HasField("inputs") else None,
        vectors=vectors,
        prompt_tokens=message.prompt_tokens if message.HasField("prompt_tokens") else None,
        request_digest=message.request_digest,
        problem=message.problem,
        texts=tuple(message.texts),
        upstream_s=message.upstream_seconds if message.HasField("upstream_seconds") else None,
    )
