from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodingProfile(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_PROFILE_UNSPECIFIED: _ClassVar[EncodingProfile]
    LEGACY: _ClassVar[EncodingProfile]
    OPENAI: _ClassVar[EncodingProfile]

class UpstreamFlavour(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPSTREAM_FLAVOUR_UNSPECIFIED: _ClassVar[UpstreamFlavour]
    DYNAMO: _ClassVar[UpstreamFlavour]
    VLLM: _ClassVar[UpstreamFlavour]
ENCODING_PROFILE_UNSPECIFIED: EncodingProfile
LEGACY: EncodingProfile
OPENAI: EncodingProfile
UPSTREAM_FLAVOUR_UNSPECIFIED: UpstreamFlavour
DYNAMO: UpstreamFlavour
VLLM: UpstreamFlavour

class GatewayPolicy(_message.Message):
    __slots__ = ("models", "limits", "errors", "rerankers")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    RERANKERS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelPolicy]
    limits: Limits
    errors: Errors
    rerankers: _containers.RepeatedCompositeFieldContainer[RerankPolicy]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelPolicy, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., errors: _Optional[_Union[Errors, _Mapping]] = ..., rerankers: _Optional[_Iterable[_Union[RerankPolicy, _Mapping]]] = ...) -> None: ...

class RerankPolicy(_message.Message):
    __slots__ = ("name", "upstream_model", "dialect", "path", "scores", "top_n", "return_documents", "max_tokens", "truncation", "any_name", "tokenizer", "upstream", "errors")
    class Dialect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DIALECT_UNSPECIFIED: _ClassVar[RerankPolicy.Dialect]
        TEI: _ClassVar[RerankPolicy.Dialect]
        COHERE_V1: _ClassVar[RerankPolicy.Dialect]
        COHERE_V2: _ClassVar[RerankPolicy.Dialect]
        JINA: _ClassVar[RerankPolicy.Dialect]
    DIALECT_UNSPECIFIED: RerankPolicy.Dialect
    TEI: RerankPolicy.Dialect
    COHERE_V1: RerankPolicy.Dialect
    COHERE_V2: RerankPolicy.Dialect
    JINA: RerankPolicy.Dialect
    class Scores(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SCORES_UNSPECIFIED: _ClassVar[RerankPolicy.Scores]
        SIGMOID: _ClassVar[RerankPolicy.Scores]
        RAW: _ClassVar[RerankPolicy.Scores]
    SCORES_UNSPECIFIED: RerankPolicy.Scores
    SIGMOID: RerankPolicy.Scores
    RAW: RerankPolicy.Scores
    NAME_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_MODEL_FIELD_NUMBER: _ClassVar[int]
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    ANY_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    upstream_model: str
    dialect: RerankPolicy.Dialect
    path: str
    scores: RerankPolicy.Scores
    top_n: int
    return_documents: bool
    max_tokens: int
    truncation: Truncation
    any_name: bool
    tokenizer: Tokenizer
    upstream: Upstream
    errors: Errors
    def __init__(self, name: _Optional[str] = ..., upstream_model: _Optional[str] = ..., dialect: _Optional[_Union[RerankPolicy.Dialect, str]] = ..., path: _Optional[str] = ..., scores: _Optional[_Union[RerankPolicy.Scores, str]] = ..., top_n: _Optional[int] = ..., return_documents: _Optional[bool] = ..., max_tokens: _Optional[int] = ..., truncation: _Optional[_Union[Truncation, _Mapping]] = ..., any_name: _Optional[bool] = ..., tokenizer: _Optional[_Union[Tokenizer, _Mapping]] = ..., upstream: _Optional[_Union[Upstream, _Mapping]] = ..., errors: _Optional[_Union[Errors, _Mapping]] = ...) -> None: ...

class Errors(_message.Message):
    __slots__ = ("shape", "status", "body", "bodies", "status_by_reason")
    class Shape(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SHAPE_UNSPECIFIED: _ClassVar[Errors.Shape]
        OPENAI: _ClassVar[Errors.Shape]
        FASTAPI: _ClassVar[Errors.Shape]
        FLAT: _ClassVar[Errors.Shape]
        TEI: _ClassVar[Errors.Shape]
    SHAPE_UNSPECIFIED: Errors.Shape
    OPENAI: Errors.Shape
    FASTAPI: Errors.Shape
    FLAT: Errors.Shape
    TEI: Errors.Shape
    class BodiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    class StatusByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    STATUS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    shape: Errors.Shape
    status: ErrorStatuses
    body: _struct_pb2.Value
    bodies: _containers.MessageMap[str, _struct_pb2.Value]
    status_by_reason: _containers.ScalarMap[str, int]
    def __init__(self, shape: _Optional[_Union[Errors.Shape, str]] = ..., status: _Optional[_Union[ErrorStatuses, _Mapping]] = ..., body: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., bodies: _Optional[_Mapping[str, _struct_pb2.Value]] = ..., status_by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ErrorStatuses(_message.Message):
    __slots__ = ("malformed", "invalid", "unknown_model", "too_large", "dimensions", "too_long", "instruction", "too_many_inputs")
    MALFORMED_FIELD_NUMBER: _ClassVar[int]
    INVALID_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOO_LARGE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TOO_LONG_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    TOO_MANY_INPUTS_FIELD_NUMBER: _ClassVar[int]
    malformed: int
    invalid: int
    unknown_model: int
    too_large: int
    dimensions: int
    too_long: int
    instruction: int
    too_many_inputs: int
    def __init__(self, malformed: _Optional[int] = ..., invalid: _Optional[int] = ..., unknown_model: _Optional[int] = ..., too_large: _Optional[int] = ..., dimensions: _Optional[int] = ..., too_long: _Optional[int] = ..., instruction: _Optional[int] = ..., too_many_inputs: _Optional[int] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_request_bytes", "max_inputs", "max_input_chars", "max_total_chars", "max_tokenize_bytes", "max_tokenize_ms", "max_inflight_bytes", "admission_wait_ms", "retry_after_s", "admission_upload_bytes_per_s")
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENIZE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_INFLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_UPLOAD_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    max_request_bytes: int
    max_inputs: int
    max_input_chars: int
    max_total_chars: int
    max_tokenize_bytes: int
    max_tokenize_ms: int
    max_inflight_bytes: int
    admission_wait_ms: int
    retry_after_s: int
    admission_upload_bytes_per_s: int
    def __init__(self, max_request_bytes: _Optional[int] = ..., max_inputs: _Optional[int] = ..., max_input_chars: _Optional[int] = ..., max_total_chars: _Optional[int] = ..., max_tokenize_bytes: _Optional[int] = ..., max_tokenize_ms: _Optional[int] = ..., max_inflight_bytes: _Optional[int] = ..., admission_wait_ms: _Optional[int] = ..., retry_after_s: _Optional[int] = ..., admission_upload_bytes_per_s: _Optional[int] = ...) -> None: ...

class ModelPolicy(_message.Message):
    __slots__ = ("name", "preset", "upstream_model", "tokenizer", "max_tokens", "prompts", "native_dimensions", "matryoshka", "encoding_profile", "upstream_flavour", "check_responses", "upstream", "base64", "leniency", "truncation", "other_names", "any_name", "preprocess", "unnamed", "answer", "serves", "quantization")
    class Base64(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BASE64_UNSPECIFIED: _ClassVar[ModelPolicy.Base64]
        HONOURED: _ClassVar[ModelPolicy.Base64]
        IGNORED: _ClassVar[ModelPolicy.Base64]
    BASE64_UNSPECIFIED: ModelPolicy.Base64
    HONOURED: ModelPolicy.Base64
    IGNORED: ModelPolicy.Base64
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    MATRYOSHKA_FIELD_NUMBER: _ClassVar[int]
    ENCODING_PROFILE_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FLAVOUR_FIELD_NUMBER: _ClassVar[int]
    CHECK_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    BASE64_FIELD_NUMBER: _ClassVar[int]
    LENIENCY_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    OTHER_NAMES_FIELD_NUMBER: _ClassVar[int]
    ANY_NAME_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_FIELD_NUMBER: _ClassVar[int]
    UNNAMED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SERVES_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    preset: str
    upstream_model: str
    tokenizer: Tokenizer
    max_tokens: int
    prompts: Prompts
    native_dimensions: int
    matryoshka: Matryoshka
    encoding_profile: EncodingProfile
    upstream_flavour: UpstreamFlavour
    check_responses: bool
    upstream: Upstream
    base64: ModelPolicy.Base64
    leniency: Leniency
    truncation: Truncation
    other_names: _containers.RepeatedScalarFieldContainer[str]
    any_name: bool
    preprocess: Preprocess
    unnamed: bool
    answer: Answer
    serves: _containers.RepeatedCompositeFieldContainer[Served]
    quantization: Quantization
    def __init__(self, name: _Optional[str] = ..., preset: _Optional[str] = ..., upstream_model: _Optional[str] = ..., tokenizer: _Optional[_Union[Tokenizer, _Mapping]] = ..., max_tokens: _Optional[int] = ..., prompts: _Optional[_Union[Prompts, _Mapping]] = ..., native_dimensions: _Optional[int] = ..., matryoshka: _Optional[_Union[Matryoshka, _Mapping]] = ..., encoding_profile: _Optional[_Union[EncodingProfile, str]] = ..., upstream_flavour: _Optional[_Union[UpstreamFlavour, str]] = ..., check_responses: _Optional[bool] = ..., upstream: _Optional[_Union[Upstream, _Mapping]] = ..., base64: _Optional[_Union[ModelPolicy.Base64, str]] = ..., leniency: _Optional[_Union[Leniency, _Mapping]] = ..., truncation: _Optional[_Union[Truncation, _Mapping]] = ..., other_names: _Optional[_Iterable[str]] = ..., any_name: _Optional[bool] = ..., preprocess: _Optional[_Union[Preprocess, _Mapping]] = ..., unnamed: _Optional[bool] = ..., answer: _Optional[_Union[Answer, _Mapping]] = ..., serves: _Optional[_Iterable[_Union[Served, _Mapping]]] = ..., quantization: _Optional[_Union[Quantization, _Mapping]] = ...) -> None: ...

class Served(_message.Message):
    __slots__ = ("dialect", "path", "normalized", "errors")
    class Dialect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DIALECT_UNSPECIFIED: _ClassVar[Served.Dialect]
        OPENAI: _ClassVar[Served.Dialect]
        TEI: _ClassVar[Served.Dialect]
        COHERE_V1: _ClassVar[Served.Dialect]
        COHERE_V2: _ClassVar[Served.Dialect]
        OLLAMA: _ClassVar[Served.Dialect]
        OLLAMA_EMBEDDINGS: _ClassVar[Served.Dialect]
        JINA: _ClassVar[Served.Dialect]
    DIALECT_UNSPECIFIED: Served.Dialect
    OPENAI: Served.Dialect
    TEI: Served.Dialect
    COHERE_V1: Served.Dialect
    COHERE_V2: Served.Dialect
    OLLAMA: Served.Dialect
    OLLAMA_EMBEDDINGS: Served.Dialect
    JINA: Served.Dialect
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    dialect: Served.Dialect
    path: str
    normalized: bool
    errors: Errors
    def __init__(self, dialect: _Optional[_Union[Served.Dialect, str]] = ..., path: _Optional[str] = ..., normalized: _Optional[bool] = ..., errors: _Optional[_Union[Errors, _Mapping]] = ...) -> None: ...

class Quantization(_message.Message):
    __slots__ = ("scaling", "minimum", "maximum")
    class Scaling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SCALING_UNSPECIFIED: _ClassVar[Quantization.Scaling]
        SYMMETRIC: _ClassVar[Quantization.Scaling]
        CALIBRATED: _ClassVar[Quantization.Scaling]
    SCALING_UNSPECIFIED: Quantization.Scaling
    SYMMETRIC: Quantization.Scaling
    CALIBRATED: Quantization.Scaling
    SCALING_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_FIELD_NUMBER: _ClassVar[int]
    scaling: Quantization.Scaling
    minimum: _containers.RepeatedScalarFieldContainer[float]
    maximum: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, scaling: _Optional[_Union[Quantization.Scaling, str]] = ..., minimum: _Optional[_Iterable[float]] = ..., maximum: _Optional[_Iterable[float]] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("body", "item")
    BODY_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    body: _struct_pb2.Value
    item: _struct_pb2.Value
    def __init__(self, body: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., item: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class Leniency(_message.Message):
    __slots__ = ("integers", "bom", "integral_floats")
    INTEGERS_FIELD_NUMBER: _ClassVar[int]
    BOM_FIELD_NUMBER: _ClassVar[int]
    INTEGRAL_FLOATS_FIELD_NUMBER: _ClassVar[int]
    integers: bool
    bom: bool
    integral_floats: bool
    def __init__(self, integers: _Optional[bool] = ..., bom: _Optional[bool] = ..., integral_floats: _Optional[bool] = ...) -> None: ...

class Truncation(_message.Message):
    __slots__ = ("side", "keep_special_tokens", "refuse")
    class Side(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SIDE_UNSPECIFIED: _ClassVar[Truncation.Side]
        RIGHT: _ClassVar[Truncation.Side]
        LEFT: _ClassVar[Truncation.Side]
    SIDE_UNSPECIFIED: Truncation.Side
    RIGHT: Truncation.Side
    LEFT: Truncation.Side
    SIDE_FIELD_NUMBER: _ClassVar[int]
    KEEP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REFUSE_FIELD_NUMBER: _ClassVar[int]
    side: Truncation.Side
    keep_special_tokens: bool
    refuse: bool
    def __init__(self, side: _Optional[_Union[Truncation.Side, str]] = ..., keep_special_tokens: _Optional[bool] = ..., refuse: _Optional[bool] = ...) -> None: ...

class Upstream(_message.Message):
    __slots__ = ("kind", "native")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    native: NativeCapabilities
    def __init__(self, kind: _Optional[str] = ..., native: _Optional[_Union[NativeCapabilities, _Mapping]] = ...) -> None: ...

class NativeCapabilities(_message.Message):
    __slots__ = ("dimensions", "truncate_prompt_tokens")
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    dimensions: bool
    truncate_prompt_tokens: bool
    def __init__(self, dimensions: _Optional[bool] = ..., truncate_prompt_tokens: _Optional[bool] = ...) -> None: ...

class Tokenizer(_message.Message):
    __slots__ = ("hf_id", "path", "revision", "special_tokens")
    HF_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    hf_id: str
    path: str
    revision: str
    special_tokens: SpecialTokens
    def __init__(self, hf_id: _Optional[str] = ..., path: _Optional[str] = ..., revision: _Optional[str] = ..., special_tokens: _Optional[_Union[SpecialTokens, _Mapping]] = ...) -> None: ...

class SpecialTokens(_message.Message):
    __slots__ = ("from_tokenizer", "prepend_ids", "append_ids")
    FROM_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    PREPEND_IDS_FIELD_NUMBER: _ClassVar[int]
    APPEND_IDS_FIELD_NUMBER: _ClassVar[int]
    from_tokenizer: bool
    prepend_ids: _containers.RepeatedScalarFieldContainer[int]
    append_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, from_tokenizer: _Optional[bool] = ..., prepend_ids: _Optional[_Iterable[int]] = ..., append_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Prompts(_message.Message):
    __slots__ = ("query", "document", "default_instruction", "extra", "instruction", "aliases", "default_input_type", "input_types", "role_field", "document_instruction")
    class Instruction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INSTRUCTION_UNSPECIFIED: _ClassVar[Prompts.Instruction]
        TASK: _ClassVar[Prompts.Instruction]
        PROMPT: _ClassVar[Prompts.Instruction]
        IGNORED: _ClassVar[Prompts.Instruction]
        REFUSED: _ClassVar[Prompts.Instruction]
    INSTRUCTION_UNSPECIFIED: Prompts.Instruction
    TASK: Prompts.Instruction
    PROMPT: Prompts.Instruction
    IGNORED: Prompts.Instruction
    REFUSED: Prompts.Instruction
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AliasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    query: str
    document: str
    default_instruction: str
    extra: _containers.ScalarMap[str, str]
    instruction: Prompts.Instruction
    aliases: _containers.ScalarMap[str, str]
    default_input_type: str
    input_types: _containers.RepeatedScalarFieldContainer[str]
    role_field: str
    document_instruction: Prompts.Instruction
    def __init__(self, query: _Optional[str] = ..., document: _Optional[str] = ..., default_instruction: _Optional[str] = ..., extra: _Optional[_Mapping[str, str]] = ..., instruction: _Optional[_Union[Prompts.Instruction, str]] = ..., aliases: _Optional[_Mapping[str, str]] = ..., default_input_type: _Optional[str] = ..., input_types: _Optional[_Iterable[str]] = ..., role_field: _Optional[str] = ..., document_instruction: _Optional[_Union[Prompts.Instruction, str]] = ...) -> None: ...

class Preprocess(_message.Message):
    __slots__ = ("fold_newlines", "collapse_whitespace", "strip", "unicode_form")
    class UnicodeForm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNICODE_FORM_UNSPECIFIED: _ClassVar[Preprocess.UnicodeForm]
        NFC: _ClassVar[Preprocess.UnicodeForm]
        NFKC: _ClassVar[Preprocess.UnicodeForm]
        NFD: _ClassVar[Preprocess.UnicodeForm]
        NFKD: _ClassVar[Preprocess.UnicodeForm]
    UNICODE_FORM_UNSPECIFIED: Preprocess.UnicodeForm
    NFC: Preprocess.UnicodeForm
    NFKC: Preprocess.UnicodeForm
    NFD: Preprocess.UnicodeForm
    NFKD: Preprocess.UnicodeForm
    FOLD_NEWLINES_FIELD_NUMBER: _ClassVar[int]
    COLLAPSE_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    STRIP_FIELD_NUMBER: _ClassVar[int]
    UNICODE_FORM_FIELD_NUMBER: _ClassVar[int]
    fold_newlines: bool
    collapse_whitespace: bool
    strip: bool
    unicode_form: Preprocess.UnicodeForm
    def __init__(self, fold_newlines: _Optional[bool] = ..., collapse_whitespace: _Optional[bool] = ..., strip: _Optional[bool] = ..., unicode_form: _Optional[_Union[Preprocess.UnicodeForm, str]] = ...) -> None: ...

class Matryoshka(_message.Message):
    __slots__ = ("min_dimensions", "allowed", "max_dimensions", "accepts_native", "renormalise")
    MIN_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    MAX_DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_NATIVE_FIELD_NUMBER: _ClassVar[int]
    RENORMALISE_FIELD_NUMBER: _ClassVar[int]
    min_dimensions: int
    allowed: _containers.RepeatedScalarFieldContainer[int]
    max_dimensions: int
    accepts_native: bool
    renormalise: bool
    def __init__(self, min_dimensions: _Optional[int] = ..., allowed: _Optional[_Iterable[int]] = ..., max_dimensions: _Optional[int] = ..., accepts_native: _Optional[bool] = ..., renormalise: _Optional[bool] = ...) -> None: ...
