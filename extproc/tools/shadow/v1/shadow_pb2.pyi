from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    BASELINE: _ClassVar[Role]
    CANDIDATE: _ClassVar[Role]
    NOISE: _ClassVar[Role]

class InputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_KIND_UNSPECIFIED: _ClassVar[InputKind]
    DOCUMENT: _ClassVar[InputKind]
    QUERY: _ClassVar[InputKind]
ROLE_UNSPECIFIED: Role
BASELINE: Role
CANDIDATE: Role
NOISE: Role
INPUT_KIND_UNSPECIFIED: InputKind
DOCUMENT: InputKind
QUERY: InputKind

class Half(_message.Message):
    __slots__ = ("request_id", "role", "status", "latency_seconds", "kind", "inputs", "rows", "dims", "vectors", "prompt_tokens", "request_digest", "problem", "texts", "upstream_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    role: Role
    status: int
    latency_seconds: float
    kind: InputKind
    inputs: int
    rows: int
    dims: int
    vectors: bytes
    prompt_tokens: int
    request_digest: int
    problem: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    upstream_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., status: _Optional[int] = ..., latency_seconds: _Optional[float] = ..., kind: _Optional[_Union[InputKind, str]] = ..., inputs: _Optional[int] = ..., rows: _Optional[int] = ..., dims: _Optional[int] = ..., vectors: _Optional[bytes] = ..., prompt_tokens: _Optional[int] = ..., request_digest: _Optional[int] = ..., problem: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., upstream_seconds: _Optional[float] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("halves",)
    HALVES_FIELD_NUMBER: _ClassVar[int]
    halves: _containers.RepeatedCompositeFieldContainer[Half]
    def __init__(self, halves: _Optional[_Iterable[_Union[Half, _Mapping]]] = ...) -> None: ...

class ForwardReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class GetTallyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTallyReply(_message.Message):
    __slots__ = ("tally_json",)
    TALLY_JSON_FIELD_NUMBER: _ClassVar[int]
    tally_json: bytes
    def __init__(self, tally_json: _Optional[bytes] = ...) -> None: ...
