"""A model's tokenizer, loaded from its ``tokenizer.json``: in a directory the policy
names, or from the Hugging Face hub (its local cache first); and the check that each
directory a policy names holds one (:func:`check_tokenizer_dirs`).

The file is read here, by the rules of :mod:`extproc.service.regular_file`, never by
the tokenizers library from the path: a FIFO or a device put where the file was must
be refused, not block the loading thread forever. The text is then parsed into a
:class:`~extproc.core.tokens.ModelTokenizer`.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.model import GatewayPolicy, SpecialTokens, TokenizerSource
from extproc.core.tokens import ModelTokenizer, TokenizerLoadError
from extproc.service.regular_file import FileRefusedError, read_regular_file

# Far above any real vocabulary's tokenizer.json (a few to a few tens of MB).
MAX_TOKENIZER_JSON_BYTES = 256 * 1024 * 1024
_WHAT = "a tokenizer.json"


def check_tokenizer_dirs(policy: GatewayPolicy) -> None:
    """Raise PolicyError naming the file and the field (``models[0].tokenizer.path``,
    ``rerankers[0].tokenizer.path``) of the first tokenizer directory, as the policy and
    its overrides name it, that holds no tokenizer.json. Only looks: nothing is read."""
    named: list[tuple[str, TokenizerSource | None]]
    named = [(f"models[{i}]", m.tokenizer) for i, m in enumerate(policy.models.values())]
    named += [(f"rerankers[{i}]", r.tokenizer) for i, r in enumerate(policy.rerankers)]
    for where, source in named:
        path = None if source is None else source.path
        if path is not None and not (path / "tokenizer.json").is_file():
            raise PolicyError(
                policy.source, f"{where}.tokenizer.path", f"{path} has no tokenizer.json"
            )


def load_tokenizer(source: TokenizerSource, special: SpecialTokens) -> ModelTokenizer:
    """The tokenizer ``source`` names, framing inputs with ``special``; raises
    TokenizerLoadError saying which file and why."""
    path = _tokenizer_json(source)
    data = tokenizer_json_bytes(path)
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # the Rust library raises a bare Exception for a bad file
        raise TokenizerLoadError(f"{path} cannot be loaded: {exc}") from exc
    return ModelTokenizer(tokenizer, special)


def tokenizer_json_bytes(path: Path) -> bytes:
    """A tokenizer.json's bytes (also for tools that hash or parse it themselves)."""
    try:
        return read_regular_file(path, max_bytes=MAX_TOKENIZER_JSON_BYTES, what=_WHAT).data
    except FileRefusedError as exc:
        raise TokenizerLoadError(f"{path} {exc.reason}") from None


def _tokenizer_json(source: TokenizerSource) -> Path:
    if source.path is not None:
        return source.path / "tokenizer.json"
    assert source.hf_id is not None
    # Imported lazily: only HF-id sources need it. hf_hub_download honours
    # HF_HUB_OFFLINE and the shared HF cache, so a pre-downloaded model works air-gapped.
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source.hf_id, "tokenizer.json", revision=source.revision))
    except Exception as exc:  # the hub client raises many types; all mean "not available"
        raise TokenizerLoadError(
            f"cannot load tokenizer {source.hf_id!r} ({type(exc).__name__}); pre-download it, "
            "or point the policy (or EXTPROC_TOKENIZER_OVERRIDES / --tokenizer) at a directory"
        ) from exc
