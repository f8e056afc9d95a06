"""The first learner: do both servers embed one plain text alike, how wide are the
vectors, and which special tokens frame every input?

The same text goes to both servers without any field. Their vectors must agree
(else nothing else can be learned: another model, revision or pooling). The special
tokens are counted (``usage.prompt_tokens`` minus the local count) and then named:
each layout with that many tokens is sent to the candidate as token ids, which it
embeds as they are; the layout whose vector equals the candidate's own for the text
is the one it adds, and the one the gateway must add when it cuts an input.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.tools.learn.findings import Finding, cos, finding, unknown
from extproc.tools.learn.local import TEXT, Layout, LocalModel
from extproc.tools.learn.session import Exchange, Session
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS

# Two engines running the same model agree to about the fourth decimal (transformers
# against vLLM: min cosine 0.9996); the probe's threshold.
EQUIVALENT = PROBE_THRESHOLDS.min_cosine


@dataclass(frozen=True)
class Basics:
    model: str  # the name the baseline's clients send
    upstream_model: str  # the name the candidate serves
    plain: Exchange  # the baseline's answer to TEXT, no field
    plain_candidate: Exchange
    native: int
    layout: Layout
    # The baseline embeds a text without input_type as sent (its vector is the
    # candidate's for the same text); else it gives such inputs a prompt.
    plain_as_sent: bool = True

    def framed(self, content: list[int]) -> list[int]:
        return self.layout.frame(content)


def learn_basics(
    session: Session, local: LocalModel, model: str, upstream_model: str
) -> tuple[Basics | None, list[Finding]]:
    session.note("learn: one plain text to both servers")
    base, cand = session.send_all(
        [
            ("baseline", "plain text, no field", {"model": model, "input": [TEXT]}),
            ("candidate", "plain text", {"model": upstream_model, "input": [TEXT]}),
        ]
    )
    shown = [base, cand]
    for side, answer in (("baseline", base), ("candidate", cand)):
        if not answer.ok:
            return None, [unknown("model", f"the {side} does not embed a text: {answer.brief()}")]
    value = base.cosine_to(cand)
    notes = [f"cosine baseline/candidate {cos(value)}"]
    if base.dims != cand.dims:
        problem = f"the baseline answers {base.dims}-d vectors, the candidate {cand.dims}-d"
        found = [unknown("native_dimensions", problem, shown)]
    else:
        summary = f"{base.dims}-d on both servers"
        found = [finding("native_dimensions", base.dims, "verified", summary, shown=shown)]
    as_sent = value is not None and value >= EQUIVALENT
    if not as_sent:
        problem = (
            f"the two servers' vectors for the same plain text differ (cosine {cos(value)}): "
            "another model or revision, another pooling, or a prompt on inputs without "
            "input_type that no role explains (see prompts.default_input_type)"
        )
        found.append(unknown("model", problem, shown))
    else:
        summary = "the same vectors for a plain text"
        found.append(finding("model", None, "verified", summary, shown=shown, notes=notes))
    layout, layout_finding = _learn_layout(session, local, upstream_model, cand)
    found.append(layout_finding)
    if layout is None or base.dims is None:
        return None, found
    return Basics(model, upstream_model, base, cand, base.dims, layout, as_sent), found


def _learn_layout(
    session: Session, local: LocalModel, upstream_model: str, cand: Exchange
) -> tuple[Layout | None, Finding]:
    field = "tokenizer.special_tokens"
    bare = local.ids(TEXT)
    if cand.prompt_tokens is None:
        return None, unknown(field, "the candidate reports no usage.prompt_tokens", [cand])
    count = cand.prompt_tokens - len(bare)
    layouts = [layout for layout in local.layouts() if layout.count == count]
    if not layouts:
        problem = f"the candidate adds {count} tokens to a text; no known layout has {count}"
        return None, unknown(field, problem, [cand])
    tries = session.send_all(
        [
            (
                "candidate",
                f"ids framed as {t.source}",
                {"model": upstream_model, "input": t.frame(bare)},
            )
            for t in layouts
        ]
    )
    scores = [(cand.cosine_to(t) or -1.0, i) for i, t in enumerate(tries)]
    best, index = max(scores)
    notes = [f"{layouts[i].source}: cosine {cos(s)} to its text answer" for s, i in scores]
    if best < EQUIVALENT:
        problem = f"no layout of {count} special tokens gives the candidate's vector"
        return None, unknown(field, problem, [cand, *tries])
    layout = layouts[index]
    summary = f"{count} special tokens ({layout.source})"
    shown = [cand, tries[index]]
    return layout, finding(field, layout.policy(), "verified", summary, shown=shown, notes=notes)
