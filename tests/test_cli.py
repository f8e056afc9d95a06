"""The command line's own checks, before it starts anything: a command that needs
Envoy stops at once without one, the shipped Envoy configs are where the package
looks for them, and the one HOST:PORT parser."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import orjson
import pytest

from extproc.commands.cli import main
from extproc.runtime.envoy_config import DEFAULT_TEMPLATE, template_path
from extproc.service.net import free_port, split_host_port
from testing_support.qwen import REPO


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--upstream", "http://127.0.0.1:9"],
        ["shadow", "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9"],
    ],
    ids=["run", "shadow"],
)
def test_a_command_that_starts_envoy_stops_at_once_without_one(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    not_executable = tmp_path / "envoy"
    not_executable.write_text("")
    monkeypatch.setenv("ENVOY_BIN", str(not_executable))
    started = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - started < 5  # no policy, tokenizer or server loaded first
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: extproc {argv[0]} needs an Envoy binary: "
        f"ENVOY_BIN={not_executable} is not an executable file\n"
    )


def test_envoy_bin_may_name_a_command_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found on PATH, it passes the check; the run then stops at the next one."""
    envoy = tmp_path / "my-envoy"
    envoy.write_text("#!/bin/sh\n")
    envoy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("ENVOY_BIN", "my-envoy")
    missing = tmp_path / "nope.yaml"
    argv = ["run", "--upstream", "http://127.0.0.1:9", "--envoy-template", str(missing)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --envoy-template: no such file {missing}\n"


@pytest.mark.parametrize(
    "name", ["standalone.yaml", "single-filter.yaml", "shadow.yaml", "shadow-reverse.yaml"]
)
def test_the_shipped_templates_are_the_envoy_folder(name: str) -> None:
    """extproc/envoy_templates is a link to envoy/, not a copy that could drift."""
    assert template_path(name).read_bytes() == (REPO / "envoy" / name).read_bytes()
    assert template_path(name).resolve() == (REPO / "envoy" / name).resolve()
    assert template_path("standalone.yaml") == DEFAULT_TEMPLATE


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        (":50051", ("0.0.0.0", 50051)),
        ("[::1]:9090", ("::1", 9090)),
        ("extproc.svc:50051", ("extproc.svc", 50051)),
    ],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["localhost", "host:", "host:http", ""])
def test_split_host_port_refuses_anything_else(address: str) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_host_port(address)


def test_free_port_is_free() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    """Ports for the processes `extproc run` starts: never one the OS may give an
    outgoing connection meanwhile, never the same one twice."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < low for port in ports), ports
    for port in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_demo_line_says_the_input_was_cut_only_when_it_was() -> None:
    from extproc.runtime.default_upstream import MAX_MODEL_LEN, _summary

    def answer(tokens: int) -> bytes:
        return orjson.dumps(
            {"data": [{"embedding": [0.0] * 384}], "usage": {"prompt_tokens": tokens}}
        )

    assert _summary(answer(MAX_MODEL_LEN)).endswith("(the input cut to the model's limit)")
    assert _summary(answer(12)) == "384-d vector, 12 tokens"
