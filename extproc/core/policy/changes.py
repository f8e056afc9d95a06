"""What a reload changed: the effective settings of two policies, compared.

One phrase per setting that differs, named by its policy field, with both values
(``encoding_profile LEGACY -> OPENAI``). A prompt's text is shown only when short;
a long one is told by its length. Everything here comes from the policy file, never
from a request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from extproc.core.api_errors import ErrorClass
from extproc.core.error_dialect import ErrorDialect
from extproc.core.policy.model import GatewayPolicy, Limits, Matryoshka, ModelPolicy

# A prompt up to this many characters is shown as it is; a longer one by its length.
SHOWN_PROMPT_CHARS = 40


@dataclass(frozen=True)
class PolicyChanges:
    added: tuple[str, ...] = ()  # model names, in the new file's order
    removed: tuple[str, ...] = ()  # in the old file's order
    models: Mapping[str, tuple[str, ...]] | None = None  # per kept model, what changed
    limits: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.models or self.limits or self.errors)

    def lines(self) -> tuple[str, ...]:
        """One line per changed model, one for models added, one for removed, one for
        limits; none when nothing changed."""
        out = [f"{name}: {', '.join(changes)}" for name, changes in (self.models or {}).items()]
        if self.added:
            out.append(f"models added: {', '.join(self.added)}")
        if self.removed:
            out.append(f"models removed: {', '.join(self.removed)}")
        if self.limits:
            out.append(f"limits: {', '.join(self.limits)}")
        if self.errors:
            out.append(f"errors: {', '.join(self.errors)}")
        return tuple(out)


def policy_changes(old: GatewayPolicy, new: GatewayPolicy) -> PolicyChanges:
    models = {
        name: changes
        for name, model in new.models.items()
        if name in old.models and (changes := model_changes(old.models[name], model))
    }
    return PolicyChanges(
        added=tuple(name for name in new.models if name not in old.models),
        removed=tuple(name for name in old.models if name not in new.models),
        models=models,
        limits=limits_changes(old.limits, new.limits),
        errors=errors_changes(old.errors, new.errors),
    )


def model_changes(old: ModelPolicy, new: ModelPolicy) -> tuple[str, ...]:
    """Each effective setting of one model that differs, in the policy file's terms."""
    settings: tuple[tuple[str, Callable[[ModelPolicy], str]], ...] = (
        ("upstream_model", lambda m: m.upstream_model),
        ("encoding_profile", _encoding),
        ("truncation", _truncation),
        ("max_tokens", lambda m: str(m.max_tokens)),
        ("native_dimensions", lambda m: str(m.native_dimensions)),
        ("matryoshka", lambda m: _matryoshka(m.matryoshka)),
        ("upstream.kind", lambda m: m.upstream.kind),
        ("upstream.native.dimensions", lambda m: _flag(m.upstream.native.dimensions)),
        (
            "upstream.native.truncate_prompt_tokens",
            lambda m: _flag(m.upstream.native.truncate_prompt_tokens),
        ),
        ("check_responses", lambda m: _flag(m.check_responses)),
        ("tokenizer", _tokenizer),
        ("tokenizer.special_tokens", _special_tokens),
    )
    out = [
        f"{name} {before} -> {after}"
        for name, show in settings
        if (before := show(old)) != (after := show(new))
    ]
    out += _prompt_changes(old, new)
    return tuple(out)


def limits_changes(old: Limits, new: Limits) -> tuple[str, ...]:
    return tuple(
        f"{f.name} {getattr(old, f.name)} -> {getattr(new, f.name)}"
        for f in fields(Limits)
        if getattr(old, f.name) != getattr(new, f.name)
    )


def errors_changes(old: ErrorDialect, new: ErrorDialect) -> tuple[str, ...]:
    out = [] if old.shape is new.shape else [f"shape {old.shape.name} -> {new.shape.name}"]
    for kind in ErrorClass:
        before, after = old.statuses.get(kind), new.statuses.get(kind)
        if before != after:
            out.append(f"status.{kind.value} {before or 'default'} -> {after or 'default'}")
    return tuple(out)


def _prompt_changes(old: ModelPolicy, new: ModelPolicy) -> list[str]:
    before, after = _prompts(old), _prompts(new)
    out: list[str] = []
    for name in [*before, *(k for k in after if k not in before)]:
        if name not in after:
            out.append(f"{name} removed")
        elif name not in before:
            out.append(f"{name} added ({_prompt(after[name])})")
        elif before[name] != after[name]:
            out.append(f"{name} {_prompt(before[name])} -> {_prompt(after[name])}")
    return out


def _prompts(m: ModelPolicy) -> dict[str, str]:
    return {
        "prompts.query": m.prompts.query,
        "prompts.document": m.prompts.document,
        "prompts.default_instruction": m.prompts.default_instruction,
        "prompts.instruction": m.prompts.instruction.name,
        "prompts.default_input_type": m.prompts.default_input_type or "",
        "prompts.input_types": ",".join(sorted(m.prompts.input_types)),
        **{f"prompts.extra.{k}": v for k, v in m.prompts.extra.items()},
        **{f"prompts.aliases.{k}": v for k, v in m.prompts.aliases.items()},
    }


def _prompt(text: str) -> str:
    if len(text) <= SHOWN_PROMPT_CHARS:
        return repr(text)
    return f"{len(text):,} characters"


def _matryoshka(m: Matryoshka | None) -> str:
    if m is None:
        return "none"
    if m.allowed:
        rule = "allowed " + ",".join(str(size) for size in m.allowed)
    else:
        top = "" if m.max_dimensions is None else f" max_dimensions {m.max_dimensions}"
        rule = f"min_dimensions {m.min_dimensions}{top}"
    rule += "" if m.accepts_native else " accepts_native false"
    return rule + ("" if m.renormalise else " renormalise false")


def _encoding(m: ModelPolicy) -> str:
    if m.encoding_profile is not None:
        return m.encoding_profile.name
    lax = [name for name, on in (("integers", m.leniency.integers), ("bom", m.leniency.bom)) if on]
    base64 = "HONOURED" if m.honours_base64 else "IGNORED"
    return f"(base64 {base64}, leniency {'+'.join(lax) or 'none'})"


def _truncation(m: ModelPolicy) -> str:
    t = m.truncation
    if t.refuse:
        return "refuse"
    return f"{t.side.name}{'' if t.keep_special_tokens else ' dropping special tokens'}"


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _tokenizer(m: ModelPolicy) -> str:
    source = m.tokenizer.describe()
    return source if m.tokenizer.revision is None else f"{source}@{m.tokenizer.revision}"


def _special_tokens(m: ModelPolicy) -> str:
    special = m.special_tokens
    if special.from_tokenizer:
        return "from_tokenizer"
    return f"prepend {list(special.prepend_ids)} append {list(special.append_ids)}"
