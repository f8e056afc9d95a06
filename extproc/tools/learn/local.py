"""What is known without asking a server: the model's tokenizer and files, the
prompt templates and special-token layouts worth testing, and the probing texts.

Prompt candidates come from every shipped preset (its query, document and extra
templates with its default instruction), from the prompts the model's own
``config_sentence_transformers.json`` declares, and from those prompts read as a
preset's template with another instruction (Qwen3's "Instruct: <task>\\nQuery:" with
the task the file names). Special-token layouts: the tokenizer's post-processor, each
preset's explicit ids, and the tokens ``tokenizer_config.json`` names.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from extproc.core.policy.model import SpecialTokens, TokenizerSource
from extproc.core.policy.presets import presets
from extproc.core.prompts import DOCUMENT_TYPES, QUERY_TYPES
from extproc.core.tokens import ModelTokenizer, TokenizerLoadError
from extproc.service.regular_file import FileRefusedError, read_regular_file
from extproc.service.tokenizer_files import tokenizer_json_bytes

# A model's JSON configuration files (prompts, tokenizer options) are a few KiB.
_CONFIG_BYTES = 1024 * 1024
TEXT = "How do I reset a forgotten password on my account?"
INSTRUCTION = "Given a customer question, retrieve the help-center passage that answers it"


@dataclass(frozen=True)
class Template:
    """A prompt template (policy syntax) and the instruction it is filled with."""

    text: str
    instruction: str
    source: str

    @property
    def takes_instruction(self) -> bool:
        return "{instruction}" in self.text

    def prefix(self, instruction: str | None = None) -> str:
        head = self.text.partition("{text}")[0]
        return head.replace(
            "{instruction}", self.instruction if instruction is None else instruction
        )


@dataclass(frozen=True)
class Layout:
    """Special tokens put around every text input."""

    prepend: tuple[int, ...]
    append: tuple[int, ...]
    from_tokenizer: bool
    source: str

    @property
    def count(self) -> int:
        return len(self.prepend) + len(self.append)

    def frame(self, content: list[int]) -> list[int]:
        return [*self.prepend, *content, *self.append]

    def policy(self) -> dict[str, Any]:
        if self.from_tokenizer:
            return {"from_tokenizer": True}
        out: dict[str, Any] = {}
        if self.prepend:
            out["prepend_ids"] = list(self.prepend)
        if self.append:
            out["append_ids"] = list(self.append)
        return out


class LocalModel:
    """The model's tokenizer (``tokenizer.json``) and the files next to it."""

    def __init__(self, source: TokenizerSource) -> None:
        self.source = source
        path = _model_file(source, "tokenizer.json")
        if path is None:
            raise TokenizerLoadError(f"no tokenizer.json for {source.describe()}")
        self.tokenizer = Tokenizer.from_str(tokenizer_json_bytes(path).decode("utf-8"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        prompts = _json(source, "config_sentence_transformers.json").get("prompts")
        self.file_prompts: dict[str, str] = {
            str(k): v for k, v in (prompts or {}).items() if isinstance(v, str)
        }
        self.tokenizer_config = _json(source, "tokenizer_config.json")

    def ids(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self.ids(text))

    def layouts(self) -> list[Layout]:
        """Every special-token layout worth testing, most likely first."""
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        post = ModelTokenizer(Tokenizer.from_str(self.tokenizer.to_str()), SpecialTokens(True))
        found = [Layout(post.prepend_ids, post.append_ids, True, "the tokenizer's post-processor")]
        for name, preset in sorted(presets().items()):
            special = preset.tokenizer.special_tokens
            before, after = tuple(special.prepend_ids), tuple(special.append_ids)
            if (before or after) and all(0 <= i < vocab for i in (*before, *after)):
                found.append(Layout(before, after, False, f"preset {name}"))
        for key, where in (
            ("eos_token", "append"),
            ("pad_token", "append"),
            ("bos_token", "prepend"),
        ):
            token = self.tokenizer_config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            token_id = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
            if token_id is not None:
                one = (token_id,)
                before, after = (one, ()) if where == "prepend" else ((), one)
                found.append(Layout(before, after, False, f"tokenizer_config.json {key} {token!r}"))
        found.append(Layout((), (), False, "none"))
        unique: dict[tuple[tuple[int, ...], tuple[int, ...]], Layout] = {}
        for layout in found:
            unique.setdefault((layout.prepend, layout.append), layout)
        return list(unique.values())

    def head(self, text: str, tokens: int) -> tuple[str, int]:
        """The longest start of ``text`` with at most ``tokens`` tokens, cut where a token
        ends, and its token count (the same ids as the text's first ones)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        end = encoding.offsets[tokens - 1][1] if 0 < tokens <= len(encoding.ids) else 0
        while end > 0:
            start = text[:end]
            ids = self.ids(start)
            if len(ids) <= tokens and ids == list(encoding.ids[: len(ids)]):
                return start, len(ids)
            end = text.rfind(" ", 0, end)
        return "", 0

    def tail(self, text: str, tokens: int) -> tuple[str, int]:
        """The longest end of ``text`` with at most ``tokens`` tokens, cut where a token
        starts, and its token count (the same ids as the text's last ones)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        if tokens >= len(ids):
            return text, len(ids)
        start = encoding.offsets[len(ids) - tokens][0] if tokens > 0 else len(text)
        while 0 <= start < len(text):
            end = text[start:]
            got = self.ids(end)
            if len(got) <= tokens and got == ids[len(ids) - len(got) :]:
                return end, len(got)
            start = text.find(" ", start + 1)
        return "", 0


def templates(role: str, hint: str | None, file_prompts: dict[str, str]) -> list[Template]:
    """Candidate templates for ``role`` ("query", "document" or an extra input_type),
    most likely first: the hinted preset's, the model files', every other preset's
    for this role, every other template known (also with every other default
    instruction), and no prompt at all."""
    shipped = presets()
    known: list[tuple[str, str, Template]] = []  # (role, preset name or "", template)
    for name, preset in sorted(shipped.items()):
        p = preset.prompts
        for kind, text in {"query": p.query, "document": p.document, **dict(p.extra)}.items():
            if text:
                known.append((kind, name, Template(text, p.default_instruction, f"preset {name}")))
    for kind, prefix in file_prompts.items():
        source = f"config_sentence_transformers.json ({kind})"
        known.append((_role_of(kind), "", Template(prefix + "{text}", "", source)))
        known += [(_role_of(kind), "", t) for t in _as_preset_templates(shipped, prefix, source)]

    def rank(entry: tuple[str, str, Template]) -> int:
        kind, name, _ = entry
        if kind != role:
            return 3
        return 0 if name and name == hint else (1 if not name else 2)

    ranked = [(rank(entry), entry[2]) for entry in known]
    instructions = sorted({t.instruction for _, t in ranked if t.takes_instruction})
    for (_, template), instruction in itertools.product(list(ranked), instructions):
        if template.takes_instruction and instruction != template.instruction:
            ranked.append((4, Template(template.text, instruction, template.source)))
    ranked.append((5, Template("{text}", "", "no prompt")))
    unique: dict[str, Template] = {}
    for _, template in sorted(ranked, key=lambda pair: pair[0]):
        unique.setdefault(template.text + "\0" + template.prefix(), template)
    return list(unique.values())


def _as_preset_templates(shipped: Any, prefix: str, source: str) -> list[Template]:
    """A model file's prompt read as a preset's {instruction} template: that template
    with the instruction the file's prompt carries."""
    found = []
    for name, preset in sorted(shipped.items()):
        text = preset.prompts.query
        head = text.partition("{text}")[0]
        if "{instruction}" not in head:
            continue
        pattern = re.escape(head).replace(re.escape("{instruction}"), "(.+)")
        match = re.fullmatch(pattern, prefix, re.S)
        if match:
            found.append(Template(text, match.group(1), f"preset {name}, task from {source}"))
    return found


def _role_of(input_type: str) -> str:
    if input_type in QUERY_TYPES:
        return "query"
    return "document" if input_type in DOCUMENT_TYPES else input_type


def _model_file(source: TokenizerSource, name: str) -> Path | None:
    """A file of the model's: next to its tokenizer.json, or from the Hugging Face
    cache (HF_HUB_OFFLINE honoured); None when there is none."""
    if source.path is not None:
        path = source.path / name
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(str(source.hf_id), name, revision=source.revision))
    except Exception:  # the hub client raises many types; all mean "not available"
        return None


def _json(source: TokenizerSource, name: str) -> dict[str, Any]:
    path = _model_file(source, name)
    try:
        data = read_regular_file(path, max_bytes=_CONFIG_BYTES).data if path else b"{}"
        doc = json.loads(data)
    except (FileRefusedError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
