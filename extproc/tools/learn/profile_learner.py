"""The encoding profile, and how each server answers odd and bad requests.

``encoding_format: "base64"`` answered with base64 strings means the baseline honours
it (the ``openai`` profile); float arrays mean it ignores it (``legacy``). The
leniency the ``legacy`` profile adds (``"256"``, ``256.0``, a UTF-8 BOM) is checked
against the choice: the gateway refusing what the baseline accepts is a problem
(clients relying on it break), accepting what it refuses a warning. Malformed JSON,
an empty input list, an unknown model and a missing input go to both servers, for
the side-by-side table of the report (and the candidate's kind).
"""

from __future__ import annotations

from typing import Any

import orjson

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Request, Session

UNKNOWN_MODEL = "no-such-model-extproc-learn"
BOM = b"\xef\xbb\xbf"


def requests(model: str, dimensions: int) -> dict[str, dict[str, Any] | bytes]:
    """Label -> body, for one server (``model`` is the name it serves)."""
    plain = {"model": model, "input": [TEXT]}
    return {
        'encoding_format "base64"': {**plain, "encoding_format": "base64"},
        f'dimensions "{dimensions}"': {**plain, "dimensions": str(dimensions)},
        f"dimensions {dimensions}.0": {**plain, "dimensions": float(dimensions)},
        "UTF-8 BOM before the body": BOM + orjson.dumps(plain),
        "malformed JSON": b'{"model": "' + model.encode() + b'", "input": ',
        "input: []": {"model": model, "input": []},
        "unknown model": {"model": UNKNOWN_MODEL, "input": [TEXT]},
        "no input": {"model": model},
    }


LAX = (1, 2, 3)  # positions of the lenient spellings in requests()


def learn_profile(
    session: Session, basics: Basics, dimensions: int
) -> tuple[str, list[Finding], list[Exchange], list[Exchange]]:
    """(LEGACY or OPENAI, findings, the baseline's answers, the candidate's)."""
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
    encoding = base[0]
    lax = [base[i] for i in LAX]
    # the BOM asks for no size: its answer is native
    lenient = [a for a in lax if a.ok and (a.dims == dimensions or a.label.startswith("UTF-8"))]
    if encoding.ok:
        honoured = encoding.encoding == "base64"
        profile = "OPENAI" if honoured else "LEGACY"
        why = f"base64 {'honoured' if honoured else 'ignored (float arrays)'}"
    else:
        profile = "LEGACY" if lenient else "OPENAI"
        how = "leniently" if lenient else "strictly"
        why = f"base64 refused ({encoding.status}); integers read {how}"
    problem = warning = ""
    if profile == "OPENAI" and lenient:
        problem = (
            f"the baseline honours base64 yet accepts {', '.join(a.label for a in lenient)}: "
            "no profile does both (openai refuses them)"
        )
    elif profile == "LEGACY" and len(lenient) < len(lax):
        refused = [a.label for a in lax if a not in lenient]
        warning = f"the legacy profile accepts {', '.join(refused)}, which the baseline refuses"
    notes = [f"{a.label}: {a.brief()}" for a in lax]
    found = [
        finding(
            "encoding_profile",
            profile,
            "verified" if not warning else "measured",
            why,
            shown=[encoding, *lax],
            notes=notes,
            problem=problem,
            warning=warning,
        ),
        finding("errors", None, "measured", "bad requests, side by side", shown=[*base, *cand]),
    ]
    return profile, found, base, cand
