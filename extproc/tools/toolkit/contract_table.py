"""The contract table (the requests of the README's first table, plus bad ones):
section 2 of the probe's report and the rows of learn's verification.

Each probe is one request sent unchanged to both servers. For valid requests the
candidate must answer in the same status class, with the same number, length and
encoding of vectors, and (where vectors come back) the same vectors (cosine >=
``--min-cosine``): a query whose instruction is silently dropped answers 200 but
fails here. For invalid requests a different status class is a warning (a 5xx for a
client mistake invites retries), not a failure.

``exact`` compares what a client sees, for a gateway meant to imitate the baseline
(`extproc learn`'s verification): the same status and error body shape, vectors of
the same norm, the same token counts; only the candidate accepting a request the
baseline refuses stays a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from extproc.core.status import status_class
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.runtime.blocking_http import HttpResult
from extproc.tools.parity import Answer, compare_answers
from extproc.tools.parity.json_shape import skeleton, skeleton_difference
from extproc.tools.toolkit.corpus import Item
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient, say

Severity = Literal["ok", "warn", "fail"]

CUSTOM_INSTRUCTION = "Given a customer question, retrieve the help-center passage that answers it"
# A model no server serves: every tool sends this name for "unknown model", whatever
# the task.
UNKNOWN_MODEL = "no-such-model-extproc"
ERROR_TEXT_LIMIT = 70
# How the table names each encoding the core's parser reports.
ENCODING_LABELS = {"float": "array", "base64": "base64 string", "mixed": "mixed"}


@dataclass(frozen=True)
class Probe:
    key: str
    title: str  # Markdown, as shown in the table
    body: bytes
    valid: bool
    hint: str = ""  # what a vector mismatch on this probe usually means


@dataclass(frozen=True)
class Cell:
    """One server's answer to one probe, reduced to what the table shows."""

    status: int
    result: str
    kind: str | None = None
    count: int | None = None
    dimensions: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    shape: str | None = None  # an error body's shape (extproc.core.upstream_errors.Shape)
    # What a client's code reads of the body (parity.json_shape.skeleton; None: not JSON).
    skeleton: Any = None

    @property
    def status_class(self) -> str:
        return status_class(self.status)

    @property
    def text(self) -> str:
        return f"{self.status}, {self.result}" if self.status else self.result


@dataclass(frozen=True)
class ContractRow:
    key: str
    title: str
    valid: bool
    baseline: Cell
    candidate: Cell
    cosine_min: float | None
    cosines: tuple[float, ...]  # per input, when both answered comparable vectors
    severity: Severity
    notes: tuple[str, ...]


def _dumps(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc)


def default_probes(
    model: str,
    documents: Sequence[Item],
    queries: Sequence[Item],
    long_input: str,
    long_tokens: int,
) -> list[Probe]:
    """The four contract probes of the README's first table, the legacy ``instruction``
    field, and four bad requests. ``long_tokens`` is the estimated size of
    ``long_input`` (for the title)."""
    doc_pair = [d.text for d in documents[:2]]
    first_doc = documents[0].text
    about = max(100, round(long_tokens, -2))
    return [
        Probe(
            "dimensions_256",
            "`dimensions: 256`",
            _dumps({"model": model, "input": doc_pair, "dimensions": 256}),
            valid=True,
            hint="Matryoshka cut or re-normalisation differs",
        ),
        Probe(
            "input_type_query",
            f'`input_type: "query"` ({len(queries)} queries)',
            _dumps({"model": model, "input": [q.text for q in queries], "input_type": "query"}),
            valid=True,
            hint="the query instruction is dropped or applied differently",
        ),
        Probe(
            "instruction",
            "`instruction: <custom task>` (1 query)",
            _dumps({"model": model, "input": [queries[0].text], "instruction": CUSTOM_INSTRUCTION}),
            valid=True,
            hint="the custom instruction is dropped or applied differently",
        ),
        Probe(
            "long_input",
            f"input over the limit (~{about:,} tokens)",
            _dumps({"model": model, "input": [long_input]}),
            valid=True,
            hint="long inputs are cut at a different place",
        ),
        Probe(
            "base64",
            '`encoding_format: "base64"`',
            _dumps({"model": model, "input": [first_doc], "encoding_format": "base64"}),
            valid=True,
        ),
        Probe(
            "malformed_json",
            "malformed JSON",
            b'{"model": ' + orjson.dumps(model) + b', "input": ',
            valid=False,
        ),
        Probe("empty_input", "`input: []`", _dumps({"model": model, "input": []}), valid=False),
        Probe(
            "unknown_model",
            "unknown model",
            _dumps({"model": UNKNOWN_MODEL, "input": [first_doc]}),
            valid=False,
        ),
        Probe(
            "dimensions_0",
            "`dimensions: 0`",
            _dumps({"model": model, "input": [first_doc], "dimensions": 0}),
            valid=False,
        ),
    ]


def said_probes(probes: Sequence[Probe], dialect: EmbeddingsDialect | None) -> list[Probe]:
    """The probes ``dialect``'s clients can say (every one for OpenAI's), each named
    for the dialect: a field it has no words for is no row (not two unanswered ones)."""
    if dialect is None:
        return list(probes)
    return [
        replace(p, key=f"{dialect.name}:{p.key}", title=f"{dialect.name}: {p.title}")
        for p in probes
        if say(dialect, p.body) is not None
    ]


def error_text(body: bytes, limit: int = ERROR_TEXT_LIMIT) -> str:
    """An error body's message (every upstream's envelope, or the text), on one line."""
    if not body.strip():
        return "(empty body)"
    message = parse_upstream_error(body).message or body.decode("utf-8", errors="replace")
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def observe(
    result: HttpResult, dialect: EmbeddingsDialect | None = None
) -> tuple[Cell, Answer | None]:
    """Reduce an exchange to a table cell (and the read answer of a usable 2xx, as
    ``dialect``'s clients read it)."""
    if result.status == 0:
        return Cell(status=0, result=f"no answer ({result.error})"), None
    answer = Answer.read(result.status, result.body, dialect)
    try:
        body = skeleton(orjson.loads(result.body))
    except orjson.JSONDecodeError:
        body = None
    if answer.vectors is None:
        if answer.problem:
            said = f"unreadable answer: {answer.problem}"
            return Cell(status=result.status, result=said, skeleton=body), None
        shape = parse_upstream_error(result.body).shape
        cell = Cell(result.status, error_text(result.body), shape=shape, skeleton=body)
        return cell, None
    kind = ENCODING_LABELS.get(str(answer.encoding), str(answer.encoding))
    text = f"{answer.count}×{answer.dims} {kind}"
    if answer.prompt_tokens is not None:
        text += f", {answer.prompt_tokens:,} tokens"
    cell = Cell(
        status=result.status,
        result=text,
        kind=kind,
        count=answer.count,
        dimensions=(int(answer.vectors.shape[1]),),
        prompt_tokens=answer.prompt_tokens,
        skeleton=body,
    )
    return cell, answer


def compare_row(
    probe: Probe,
    *,
    base: Cell,
    base_answer: Answer | None,
    cand: Cell,
    cand_answer: Answer | None,
    min_cosine: float,
    exact: bool = False,
) -> ContractRow:
    """Judge one probe (pure)."""
    fails: list[str] = []
    warns: list[str] = []
    notes: list[str] = []
    cosines: tuple[float, ...] = ()
    same_class = base.status_class == cand.status_class
    if same_class and base.status and base.status != cand.status:
        (fails if exact else notes).append(f"status {base.status} vs {cand.status}")
    if exact and same_class and base.status:
        differ = skeleton_difference(base.skeleton, cand.skeleton)
        if differ is not None:
            fails.append(f"the body differs at {differ}")
    if not same_class:
        message = f"status class {base.status_class} vs {cand.status_class}"
        if probe.valid or (exact and not 200 <= cand.status < 300):
            fails.append(message)
        else:
            if cand.status >= 500:
                message += " (a 5xx for a client mistake: clients may retry it)"
            elif 200 <= cand.status < 300:
                message += " (the candidate accepts a request the baseline rejects)"
            warns.append(message)
    elif probe.valid and base.status_class == "2xx":
        if base_answer is None or cand_answer is None:
            who = "baseline" if base_answer is None else "candidate"
            fails.append(f"the {who}'s 2xx answer is not an embeddings list")
        else:
            if base.count != cand.count:
                fails.append(f"{base.count} vs {cand.count} vectors")
            elif base.dimensions != cand.dimensions:
                fails.append(f"dimensions {_dims(base)} vs {_dims(cand)}")
            else:
                comparison = compare_answers(base_answer, cand_answer)
                cosines = comparison.cosines
                cos = min(cosines) if cosines else None
                if cos is not None and cos < min_cosine:
                    why = f"; {probe.hint}" if probe.hint else ""
                    fails.append(f"vectors differ: min cosine {cos:.4f} < {min_cosine}{why}")
                off = [i for i in comparison.inputs if not i.norm_match]
                if exact and off:
                    fails.append(f"norms {off[0].baseline_norm:.4f} vs {off[0].candidate_norm:.4f}")
            if base.kind != cand.kind:
                fails.append(f"encoding {base.kind} vs {cand.kind}")
            if base.prompt_tokens != cand.prompt_tokens:
                message = f"prompt tokens {_num(base.prompt_tokens)} vs {_num(cand.prompt_tokens)}"
                (fails if fails or exact else warns).append(message)
    elif probe.valid:
        warns.append(f"both fail ({base.status_class}): the baseline does not accept this probe")
    severity: Severity = "fail" if fails else ("warn" if warns else "ok")
    return ContractRow(
        key=probe.key,
        title=probe.title,
        valid=probe.valid,
        baseline=base,
        candidate=cand,
        cosine_min=min(cosines) if cosines else None,
        cosines=cosines,
        severity=severity,
        notes=tuple(fails + warns + notes),
    )


def _dims(cell: Cell) -> str:
    return "/".join(str(d) for d in cell.dimensions) or "-"


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def run_contract(
    baseline: EmbeddingsClient,
    candidate: EmbeddingsClient,
    probes: Sequence[Probe],
    min_cosine: float,
    *,
    exact: bool = False,
) -> list[ContractRow]:
    rows: list[ContractRow] = []
    for probe in probes:
        base_cell, base_answer = observe(baseline.post(probe.body), baseline.dialect)
        cand_cell, cand_answer = observe(candidate.post(probe.body), candidate.dialect)
        rows.append(
            compare_row(
                probe,
                base=base_cell,
                base_answer=base_answer,
                cand=cand_cell,
                cand_answer=cand_answer,
                min_cosine=min_cosine,
                exact=exact,
            )
        )
    return rows
