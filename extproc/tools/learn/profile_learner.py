"""Encoding and leniency, apart, and how each server answers bad requests.

``encoding_format: "base64"`` answered with base64 strings means the baseline honours
it (``base64: HONOURED``); float arrays mean it ignores it (``IGNORED``). Leniency is
asked on its own: ``"N"`` and ``N.0`` for an integer field (``leniency.integers``; a
server taking the string and refusing the float is one no policy says), and a UTF-8 byte
order mark before the body (``leniency.bom``); ``N.0`` alone is the lax reading of a
``Literal`` of integers (``leniency.integral_floats``). Malformed JSON, an empty input list,
an unknown model and a missing input go to both servers, for the errors' statuses
and shape (:mod:`extproc.tools.learn.errors_learner`), the side-by-side table of the
report and the candidate's kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Request, Session
from extproc.tools.toolkit.contract_table import UNKNOWN_MODEL

BOM = b"\xef\xbb\xbf"
BASE64 = 'encoding_format "base64"'
BOM_LABEL = "UTF-8 BOM before the body"
MALFORMED = "malformed JSON"
EMPTY_INPUT = "input: []"
UNKNOWN = "unknown model"
NO_INPUT = "no input"
BAD_REQUESTS = "bad requests"  # the finding that shows both servers side by side


def requests(model: str, dimensions: int) -> dict[str, dict[str, Any] | bytes]:
    """Label -> body, for one server (``model`` is the name it serves)."""
    plain = {"model": model, "input": [TEXT]}
    return {
        BASE64: {**plain, "encoding_format": "base64"},
        f'dimensions "{dimensions}"': {**plain, "dimensions": str(dimensions)},
        f"dimensions {dimensions}.0": {**plain, "dimensions": float(dimensions)},
        BOM_LABEL: BOM + orjson.dumps(plain),
        MALFORMED: b'{"model": "' + model.encode() + b'", "input": ',
        EMPTY_INPUT: {"model": model, "input": []},
        UNKNOWN: {"model": UNKNOWN_MODEL, "input": [TEXT]},
        NO_INPUT: {"model": model},
    }


LAX = (1, 2)  # positions of the lax integer spellings in requests()


@dataclass(frozen=True)
class LearnedEncoding:
    """What the policy's ``base64`` and ``leniency`` say."""

    base64: str = "HONOURED"  # or IGNORED
    integers: bool = False
    bom: bool = False
    integral_floats: bool = False  # N.0 but not "N" (pydantic's lax Literal)

    def policy(self) -> dict[str, Any]:
        """The entry's fields: the profile when they make one, else each of them."""
        settings = (self.base64, self.integers, self.bom, self.integral_floats)
        if settings == ("IGNORED", True, True, False):
            return {"encoding_profile": "LEGACY"}
        if settings == ("HONOURED", False, False, False):
            return {"encoding_profile": "OPENAI"}
        leniency: dict[str, bool] = {"integers": self.integers, "bom": self.bom}
        if self.integral_floats:
            leniency["integral_floats"] = True
        return {"base64": self.base64, "leniency": leniency}


def learn_profile(
    session: Session, basics: Basics, dimensions: int
) -> tuple[LearnedEncoding, list[Finding], list[Exchange], list[Exchange]]:
    """(encoding and leniency, findings, the baseline's answers, the candidate's)."""
    session.note("learn: encoding, leniency and errors (both servers)")
    sent: list[Request] = [
        ("baseline", label, body) for label, body in requests(basics.model, dimensions).items()
    ]
    sent += [
        ("candidate", label, body)
        for label, body in requests(basics.upstream_model, dimensions).items()
    ]
    answers = session.send_all(sent)
    half = len(answers) // 2
    base, cand = answers[:half], answers[half:]
    encoding, bom = base[0], base[3]
    lax = [base[i] for i in LAX]
    # a size the baseline accepts, so only the spelling decides
    taken = [a.ok and a.dims == dimensions for a in lax]
    found: list[Finding] = []
    if encoding.ok:
        value = "HONOURED" if encoding.encoding == "base64" else "IGNORED"
        why = f"base64 {'answered' if value == 'HONOURED' else 'ignored (float arrays)'}"
        found.append(finding("base64", value, "verified", why, shown=[encoding]))
    else:
        value = "IGNORED"
        warning = "the gateway answers float arrays where the baseline refuses base64"
        why = f"base64 refused ({encoding.status})"
        found.append(finding("base64", value, "measured", why, shown=[encoding], warning=warning))
    notes = [f"{a.label}: {a.brief()}" for a in lax]
    problem = ""
    as_string, as_float = taken
    if as_string and not as_float:
        problem = (
            f"the baseline takes {lax[0].label} but not {lax[1].label}: no leniency "
            "takes integer strings without integral floats"
        )
    integers = as_string and as_float
    floats_only = as_float and not as_string
    if integers:
        summary = "integers read leniently"
    elif floats_only:
        summary = "integral floats taken, strings refused (a lax Literal)"
    else:
        summary = "integers read strictly"
    found.append(
        finding(
            "leniency.integers",
            integers,
            "verified",
            summary,
            shown=lax,
            notes=notes,
            problem=problem,
        )
    )
    if floats_only:
        found.append(
            finding("leniency.integral_floats", True, "verified", summary, shown=lax, notes=notes)
        )
    summary = f"a byte order mark {'taken' if bom.ok else 'refused'}: {bom.brief()}"
    found.append(finding("leniency.bom", bom.ok, "verified", summary, shown=[bom]))
    found.append(
        finding(BAD_REQUESTS, None, "measured", "both servers, side by side", shown=[*base, *cand])
    )
    return LearnedEncoding(value, integers, bom.ok, floats_only), found, base, cand
