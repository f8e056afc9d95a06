"""No request text in logs, metrics or other fields' error messages.

A real gateway (`extproc run`: Envoy at info, the Python log at debug) gets requests
carrying a secret marker in every place a client controls: model, input (valid,
invalid, over a limit), input_type, instruction, encoding_format, dimensions, user,
unknown and repeated keys, malformed JSON, headers. Then:

- the marker never appears in the gateway's log output or in /metrics;
- an error message may quote a client's value only in that value's own field (the
  unknown model, input_type, encoding_format, content type, a repeated or too-deep
  key's name - as OpenAI echoes the model name), and then at most 100 characters,
  with control characters escaped;
- after 200 requests with random model names, input_types and so on, /metrics has no
  label value it did not have before: labels come from fixed sets.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Iterator
from typing import Any

import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import Reply
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways

MARKER = "SeCrEtMaRkEr"
# A field value that also tries to break a log line and hide behind a bidi control.
HOSTILE = f"{MARKER}\n\x1b[31m\u202e" + "A" * 300 + MARKER
ENGLISH = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, gateways: Gateways) -> Iterator[Gateway]:
    spec = GatewaySpec(
        upstream.url,
        args=("--envoy-log-level", "info"),
        env=(("EXTPROC_LOG_LEVEL", "debug"),),  # the most the Python side logs
    )
    with gateways.own(spec) as gw:
        yield gw


def body(**fields: Any) -> dict[str, Any]:
    return {"model": QWEN_MODEL, "input": "hello", **fields}


# (name, body, headers, the field whose own value the message may quote, or None)
CASES: list[tuple[str, bytes | dict[str, Any], dict[str, str], str | None]] = [
    ("unknown-model", body(model=HOSTILE), {}, "model"),
    ("model-not-string", body(model=[HOSTILE]), {}, None),
    ("input-ok", body(input=[HOSTILE, "b"]), {}, None),
    ("input-long-ok", body(input=(MARKER + " " + ENGLISH) * 400), {}, None),
    ("input-mixed-types", body(input=[HOSTILE, 1]), {}, None),
    # The byte budget defaults to the body limit: only prompt copies can pass it (here
    # 2,048 x a ~4 KB Korean instruction, under the character caps).
    (
        "input-over-budget",
        body(input=[MARKER] * 2048, instruction=MARKER + "대한" * 700),
        {},
        None,
    ),
    ("input-no-cut", body(input=[MARKER * 30000]), {}, None),
    ("input-type-unknown", body(input_type=HOSTILE), {}, "input_type"),
    ("input-type-not-string", body(input_type={"x": HOSTILE}), {}, None),
    ("instruction-ok", body(instruction=HOSTILE), {}, None),
    ("instruction-with-document", body(input_type="document", instruction=HOSTILE), {}, None),
    ("instruction-blank", body(instruction=" \n"), {}, None),
    ("instruction-times-inputs", body(input=["a"] * 2048, instruction=MARKER * 400), {}, None),
    ("encoding-unknown", body(encoding_format=HOSTILE), {}, "encoding_format"),
    ("dimensions-string", body(dimensions=HOSTILE), {}, None),
    ("truncate-string", body(truncate_prompt_tokens=HOSTILE), {}, None),
    ("user-not-string", body(user=[HOSTILE]), {}, None),
    ("unknown-field", body(**{f"x_{MARKER}": HOSTILE}), {}, None),
    (
        "repeated-unknown-key",
        f'{{"model": "{QWEN_MODEL}", "input": "x", "k{MARKER}": 1, "k{MARKER}": 2}}'.encode(),
        {},
        "key",
    ),
    (
        "repeated-input",
        f'{{"model": "{QWEN_MODEL}", "input": "{MARKER}", "input": "{MARKER}2"}}'.encode(),
        {},
        None,
    ),
    ("malformed-json", f'{{"model": "{MARKER}", "input": [{MARKER}'.encode(), {}, None),
    ("not-an-object", json.dumps([MARKER]).encode(), {}, None),
    ("content-type", body(), {"content-type": f"text/{MARKER}"}, "content-type"),
    # (a control character in a header is refused by Envoy itself: connection reset)
    ("request-id", body(), {"x-request-id": f"{MARKER} <id> %s"}, None),
    ("user-agent", body(), {"user-agent": MARKER}, None),
]


@pytest.fixture(scope="module")
def replies(gateway: Gateway) -> dict[str, Reply]:
    out = {}
    for name, payload, headers, _ in CASES:
        out[name] = gateway.embeddings(payload, headers=headers, timeout=60)
    return out


def test_every_case_was_answered(replies: dict[str, Reply]) -> None:
    statuses = {name: reply.status for name, reply in replies.items()}
    assert statuses["input-ok"] == statuses["instruction-ok"] == 200
    assert statuses["unknown-model"] == 404
    assert statuses["input-over-budget"] == statuses["input-no-cut"] == 413
    assert statuses["content-type"] == 415
    assert all(status in (200, 400, 404, 413, 415) for status in statuses.values()), statuses


@pytest.mark.parametrize(
    ("name", "field"), [(c[0], c[3]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_error_messages_quote_only_their_own_field(
    name: str, field: str | None, replies: dict[str, Reply]
) -> None:
    reply = replies[name]
    if reply.status == 200:
        return
    message = reply.json()["error"]["message"]
    if field is None:
        assert MARKER not in message, message
        return
    # Quoted once, cut to 100 characters, control and bidi characters escaped.
    at = message.lower().find(MARKER.lower())  # content types are compared lower-cased
    assert message.lower().count(MARKER.lower()) <= 1, message
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message
    if at >= 0:
        quoted = re.search(r"'([^']*)'", message[max(0, at - 10) :])
        assert quoted is not None and len(quoted.group(1)) <= 100 + 20, message  # + escapes


def test_marker_never_in_logs_or_metrics(gateway: Gateway, replies: dict[str, Reply]) -> None:
    log = gateway.log()
    assert "extproc ready:" in log  # the log really is this gateway's output
    assert MARKER not in log
    assert MARKER.lower() not in log.lower()
    metrics = gateway.metrics()
    assert "extproc_requests_total" in metrics
    assert MARKER.lower() not in metrics.lower()


def label_sets(metrics_text: str) -> set[str]:
    """Every sample's name and labels (values dropped): what cardinality is made of."""
    keys = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            keys.add(line.rpartition(" ")[0])
    return keys


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "-_/.") for _ in range(n))


def test_metric_labels_stay_bounded(gateway: Gateway, upstream: FakeUpstream) -> None:
    rng = random.Random(6)

    def round_of_requests(i: int) -> None:
        name = random_text(rng, rng.randint(1, 60))
        assert gateway.embeddings(body(model=name)).status == 404
        assert gateway.embeddings(body(input_type=random_text(rng, 12))).status == 400
        assert gateway.embeddings(body(encoding_format=random_text(rng, 8))).status == 400
        extra = {random_text(rng, 10): random_text(rng, 10)}
        assert gateway.embeddings(body(**extra, dimensions=32 + i % 900)).status == 200
        ct = {"content-type": f"text/{random_text(rng, 6)}"}
        assert gateway.embeddings(body(), headers=ct).status == 415

    round_of_requests(0)  # every outcome once, so each of its label sets exists
    before = label_sets(gateway.metrics())
    for i in range(1, 201):
        round_of_requests(i)
    after = label_sets(gateway.metrics())
    assert after == before, sorted(after - before)[:20]
