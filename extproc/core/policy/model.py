"""Typed, validated policy: what the gateway knows about each served model.

These frozen dataclasses are what the sans-I/O core reads. They are built from the
policy file by :mod:`extproc.core.policy.loader`; nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from extproc.core.answer_layout import AnswerLayout
from extproc.core.error_dialect import OPENAI_ERRORS, ErrorDialect
from extproc.core.quantize import Scaling
from extproc.core.upstreams import Capabilities

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_INPUTS = 2048
# Tokenization budget per request. By default the byte budget is the body limit
# (Limits.max_tokenize_bytes, set by the loader from max_request_bytes): it refuses
# no batch the body limit admits, so bulk batches of long documents (512 x 4,000
# characters, which must all be counted since each is over max_tokens in bytes) are
# served. What bounds the work is the wall-clock deadline, checked between tokenizer
# calls of ~64 KiB: the default admits such a batch of English with room for a loaded
# machine, and ends a hostile body after at most one more call, well before Envoy's
# ext_proc message timeout (15 s in envoy/*.yaml).
DEFAULT_MAX_TOKENIZE_MS = 5000
# Admission control (per ext_proc process). 48 MiB of work in flight is two of the
# largest rewrites (2,048 inputs, a 1,024-d answer cut to `dimensions`) plus room for
# ordinary requests. The process's memory follows the work in flight, so bounding it
# bounds the memory: a burst past it waits (bounded) for room, then gets a 503.
DEFAULT_MAX_INFLIGHT_BYTES = 48 * 1024 * 1024
DEFAULT_ADMISSION_WAIT_MS = 250
DEFAULT_RETRY_AFTER_S = 1
# A body announced by its request headers keeps its room in the budget for as long
# as it takes to arrive at this rate (8 MiB: 0.5 s): longer than the server takes
# to get the bodies it let through in a burst of large uploads (so the rest of the
# burst is refused unread), short enough that an upload that stalls holds no room
# for long. Requests of under 4 MiB (a hold under the default wait) get past such
# reservations after their own hold.
DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S = 16 * 1024 * 1024


class EncodingProfile(enum.Enum):
    """A named bundle of :attr:`ModelPolicy.honours_base64` and :class:`Leniency`."""

    LEGACY = "legacy"  # the old server: float arrays always, lax JSON types
    OPENAI = "openai"  # float or base64 (little-endian float32), strict JSON types


@dataclass(frozen=True)
class Leniency:
    """Lax spellings of JSON types the legacy server took (pydantic's lax mode)."""

    integers: bool = False  # "256", 256.0, true for an integer field, token ids too
    bom: bool = False  # a UTF-8 byte order mark before the body
    integral_floats: bool = False  # 256.0 alone (pydantic's lax Literal of integers)


PROFILE_BUNDLES: Final[Mapping[EncodingProfile, tuple[bool, Leniency]]] = {
    EncodingProfile.LEGACY: (False, Leniency(integers=True, bom=True)),
    EncodingProfile.OPENAI: (True, Leniency()),
}


class InstructionUse(enum.Enum):
    """What a client's ``instruction`` does (policy.proto's ``Prompts.Instruction``)."""

    TASK = "task"  # a query; the task fills the template's {instruction}
    PROMPT = "prompt"  # a query; the instruction is the whole prompt
    IGNORED = "ignored"  # dropped: the input_type alone decides
    REFUSED = "refused"  # a 4xx (errors.status.instruction)


class CutSide(enum.Enum):
    RIGHT = "right"  # keep the start
    LEFT = "left"  # keep the end


@dataclass(frozen=True)
class Truncation:
    """What happens to an input over ``max_tokens``."""

    side: CutSide = CutSide.RIGHT
    # True: the special tokens frame the kept content; False: the framed ids are cut,
    # losing the special tokens on the cut side.
    keep_special_tokens: bool = True
    refuse: bool = False  # a 4xx (errors.status.too_long) instead of a cut

    @property
    def is_default(self) -> bool:
        return self == _DEFAULT_TRUNCATION


@dataclass(frozen=True)
class UpstreamPolicy:
    """What serves a model: the adapter's name (``extproc.core.upstreams``) and what
    this deployment does itself (the kind's defaults plus what the policy declares)."""

    kind: str
    native: Capabilities = field(default_factory=Capabilities)


@dataclass(frozen=True)
class TokenizerSource:
    """Where the tokenizer comes from: a Hugging Face id or a local directory."""

    hf_id: str | None = None
    path: Path | None = None
    revision: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else f"hf:{self.hf_id}"


@dataclass(frozen=True)
class SpecialTokens:
    """Token ids the model's tokenizer puts around every text input."""

    from_tokenizer: bool = False
    prepend_ids: tuple[int, ...] = ()
    append_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PromptTemplates:
    """Prompt formats; ``{text}`` is the input, ``{instruction}`` the query task."""

    query: str = "{text}"
    document: str = "{text}"
    default_instruction: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    instruction: InstructionUse = InstructionUse.TASK
    # input_type value -> its own template, in place of its role's
    aliases: Mapping[str, str] = field(default_factory=dict)
    default_input_type: str | None = None  # the role of inputs sent without one
    # the input_type values taken (empty: every alias and extra name)
    input_types: frozenset[str] = frozenset()
    role_field: str = "input_type"  # the request field that carries the role
    # What an instruction sent with a document role does (REFUSED: a 4xx).
    document_instruction: InstructionUse = InstructionUse.REFUSED


class UnicodeForm(enum.Enum):
    NFC = "NFC"
    NFKC = "NFKC"
    NFD = "NFD"
    NFKD = "NFKD"


@dataclass(frozen=True)
class Preprocess:
    """What the legacy server did to each text before embedding it, in this order."""

    fold_newlines: bool = False  # each line break becomes a space
    collapse_whitespace: bool = False  # each run of white space becomes one space
    strip: bool = False  # white space at both ends removed
    unicode_form: UnicodeForm | None = None

    @property
    def changes_text(self) -> bool:
        return self != _AS_SENT


@dataclass(frozen=True)
class Matryoshka:
    """``dimensions`` accepted: ``min_dimensions..max_dimensions`` (None: native) or
    ``allowed``; the native size by ``accepts_native`` alone."""

    min_dimensions: int
    allowed: tuple[int, ...] = ()
    max_dimensions: int | None = None
    accepts_native: bool = True
    renormalise: bool = True  # a cut is scaled back to unit length


# The dialects whose answers may carry a vector in several types at once.
_SEVERAL_TYPES: Final = frozenset({"cohere_v1", "cohere_v2", "jina"})


@dataclass(frozen=True)
class Served:
    """One dialect at one path (a dialect's name: extproc.core.dialects)."""

    dialect: str
    path: str
    normalized: bool = True  # the vectors it answers are unit length
    errors: ErrorDialect | None = None  # None: the dialect's own


@dataclass(frozen=True)
class ModelPolicy:
    name: str
    upstream_model: str
    tokenizer: TokenizerSource
    special_tokens: SpecialTokens
    max_tokens: int
    prompts: PromptTemplates
    native_dimensions: int
    matryoshka: Matryoshka | None
    honours_base64: bool  # false: float arrays always, `encoding_format` ignored
    leniency: Leniency
    upstream: UpstreamPolicy
    check_responses: bool = False  # validate every 2xx, not only rewritten ones
    truncation: Truncation = field(default_factory=Truncation)
    other_names: frozenset[str] = frozenset()  # more `model` names clients send for it
    any_name: bool = False  # any `model` no entry names is this one
    preprocess: Preprocess = field(default_factory=Preprocess)
    unnamed: bool = False  # a request naming no `model` is for this one
    # The legacy server's success body, where the upstream's differs (None: the upstream's).
    answer: AnswerLayout | None = None
    # The dialects and paths it is served at besides OpenAI's, which serve every model.
    serves: tuple[Served, ...] = ()
    quantization: Scaling | None = None  # how int8 and uint8 are made (None: refused)

    @property
    def encoding_profile(self) -> EncodingProfile | None:
        """The named bundle the encoding and leniency settings make, if any."""
        settings = (self.honours_base64, self.leniency)
        return next((p for p, bundle in PROFILE_BUNDLES.items() if bundle == settings), None)

    def accepts_dimensions(self, dimensions: int) -> bool:
        m = self.matryoshka
        if dimensions == self.native_dimensions:
            return m is None or m.accepts_native
        if m is None:
            return False
        if m.allowed:
            return dimensions in m.allowed
        return m.min_dimensions <= dimensions <= (m.max_dimensions or self.native_dimensions)

    def dimensions_refusal(self, dimensions: int) -> str:
        """What is wrong with a size the model refuses, as a bounded range says it:
        "below" its smallest, "above" its largest; else (a set) "value"."""
        m = self.matryoshka
        if m is None or m.allowed:
            return "value" if m is not None or dimensions < self.native_dimensions else "above"
        if dimensions < m.min_dimensions:
            return "below"
        return "above"

    @property
    def emulates_dimensions(self) -> bool:
        """The gateway cuts this model's vectors itself (Matryoshka emulation): a
        ``dimensions`` below native is stripped and the answer rewritten. False for
        an upstream that cuts them (``upstream.native.dimensions``), and for a model
        that is not Matryoshka (only its native size is accepted: nothing to cut)."""
        return self.matryoshka is not None and not self.upstream.native.dimensions

    def dimensions_rule(self) -> str:
        """Human-readable statement of the accepted ``dimensions`` values."""
        m = self.matryoshka
        native = self.native_dimensions
        if m is None:
            return f"{native} (its native size; the model is not Matryoshka)"
        if m.allowed:
            sizes = sorted({*m.allowed, *((native,) if m.accepts_native else ())})
            return "one of " + ", ".join(str(s) for s in sizes)
        top = m.max_dimensions or native
        if top == native and not m.accepts_native:
            top -= 1
        rule = f"an integer from {m.min_dimensions} to {top}"
        return rule + (f" or {native}" if m.accepts_native and top < native else "")


_DEFAULT_TRUNCATION: Final = Truncation()
_AS_SENT: Final = Preprocess()


class ScoreScale(enum.Enum):
    SIGMOID = "sigmoid"  # the logit's sigmoid, in (0, 1)
    RAW = "raw"  # the logit itself


@dataclass(frozen=True)
class RerankPolicy:
    """One rerank model on one legacy rerank path (policy.proto's ``RerankPolicy``)."""

    name: str
    upstream_model: str
    dialect: str  # a rerank dialect's name (extproc.core.dialects.RERANK_DIALECTS)
    path: str
    scores: ScoreScale  # what the legacy server answered by default
    top_n: int | None  # results when the client sends no top_n (None: all)
    return_documents: bool  # when the client does not say
    max_tokens: int | None  # per (query, document) pair, special tokens included
    # A pair over max_tokens: cut (the upstream's right cut) or refused (413).
    truncation: Truncation
    tokenizer: TokenizerSource | None  # counts pairs (needed with max_tokens)
    special_tokens: SpecialTokens
    upstream_kind: str  # an upstream adapter's name (extproc.core.upstreams)
    errors: ErrorDialect | None = None  # None: the file's
    any_name: bool = False  # any other `model` on its path, or none, is this one

    @property
    def key(self) -> str:
        """How a contract names this reranker's tokenizer."""
        return f"rerank {self.path} {self.name}"


@dataclass(frozen=True)
class Limits:
    """Request-wide caps (policy.proto's ``Limits``). The character caps default to
    the body size, where they never bind on their own (a body holds at most as many
    characters as bytes) except through prompt prefixes."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_inputs: int = DEFAULT_MAX_INPUTS
    max_input_chars: int = DEFAULT_MAX_REQUEST_BYTES  # one text input, as sent
    max_total_chars: int = DEFAULT_MAX_REQUEST_BYTES  # all text inputs, prompts included
    max_tokenize_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # default: max_request_bytes
    max_tokenize_ms: int = DEFAULT_MAX_TOKENIZE_MS
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES  # admission budget, per host
    admission_wait_ms: int = DEFAULT_ADMISSION_WAIT_MS  # bounded wait for room
    retry_after_s: int = DEFAULT_RETRY_AFTER_S  # Retry-After of the 503 `overloaded`
    # Floor upload rate: a reservation made at the request headers lapses after
    # declared bytes / this (extproc/service/admission.py).
    admission_upload_bytes_per_s: int = DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S


@dataclass(frozen=True)
class OlderSpelling:
    """A field the file says in an older way: it loads, and ``replacement`` says how to
    write it now (``extproc check-config`` shows it)."""

    field: str  # its path in the file, e.g. models[0].upstream_flavour
    replacement: str


@dataclass(frozen=True)
class GatewayPolicy:
    models: Mapping[str, ModelPolicy]
    limits: Limits = Limits()
    source: str = "<memory>"
    errors: ErrorDialect = OPENAI_ERRORS  # how the gateway's own error answers read
    rerankers: tuple[RerankPolicy, ...] = ()
    older_spellings: tuple[OlderSpelling, ...] = ()

    def served_paths(self) -> frozenset[str]:
        """The paths the models' ``serves`` name."""
        return frozenset(s.path for m in self.models.values() for s in m.serves)

    def rerank_paths(self) -> frozenset[str]:
        return frozenset(r.path for r in self.rerankers)

    def rerankers_at(self, path: str) -> tuple[RerankPolicy, ...]:
        return tuple(r for r in self.rerankers if r.path == path)

    def model(self, name: str | None) -> ModelPolicy | None:
        """The model a request naming ``name`` (None: naming none) is for: the entry of
        that name or one of its other names, else the entry taking any name; for a
        request naming none, the entry taking those."""
        if name is None:
            return next((m for m in self.models.values() if m.unnamed), None)
        found = self.models.get(name)
        if found is not None:
            return found
        found = next((m for m in self.models.values() if name in m.other_names), None)
        if found is not None:
            return found
        return next((m for m in self.models.values() if m.any_name), None)

    def response_markers(self) -> tuple[str, ...]:
        """Field names whose presence in a request body may mean that its answer must
        be rewritten under this policy (what envoy/standalone.yaml's ``precheck``
        searches for): ``dimensions`` when some model emulates it; none when every
        model's upstream cuts it itself. The encoding alone never does: an answer is
        re-encoded only when the gateway cuts it. A body holding none still needs its
        answer when a model checks every answer (``check_responses``): no field tells,
        so those take the second stream (envoy/standalone.yaml, step 3)."""
        if any(model.emulates_dimensions for model in self.models.values()):
            return ("dimensions",)
        return ()

    def max_response_bytes(self) -> int:
        """Largest embeddings answer for the largest allowed batch, as float JSON.

        Sizes Envoy's buffer limit and the gRPC message limits: up to 16 bytes per
        float32 written as JSON, plus per-item keys, plus room for usage and model.
        (A rerank answer carries at most the request's own documents: the request
        limit bounds it.)
        """
        widest = max((m.native_dimensions for m in self.models.values()), default=1)
        # A dialect that answers several types at once writes a value up to six ways
        # (float JSON, base64, int8, uint8, binary, ubinary): 34 bytes.
        several = any(s.dialect in _SEVERAL_TYPES for m in self.models.values() for s in m.serves)
        per_value = 34 if several else 16
        return self.limits.max_inputs * (widest * per_value + 256) + 64 * 1024

    def max_message_bytes(self) -> int:
        """gRPC message size limit: the larger body plus room for headers and attributes."""
        return max(self.limits.max_request_bytes, self.max_response_bytes()) + 1024 * 1024
