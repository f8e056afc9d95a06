"""Smoke test of the benchmark harness: `python -m bench.run --quick` end to end, with
two repetitions of each cell instead of three (~1 min).

Starts the real pieces (nginx or node upstream, `extproc serve`, the floor processor,
one Envoy per configuration, wrk) on loopback and checks that the JSON it writes covers
every configuration with sane numbers. It does not judge performance: this machine is shared and CI runs on it.
Missing wrk is a failure (`bench/setup.sh` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.alone  # the benchmark's load: no socket errors, no timeouts

REPO = Path(__file__).resolve().parent.parent
CASES = {"A", "B", "N-a", "N-b", "S-a", "S-b", "S-b2", "S-n"}
QUICK_WORKLOADS = {"seed-c1", "sat-c16"}
REPETITIONS = 2  # alternating repetitions of each cell: two show the alternation


def run_bench(
    results: Path, *args: str, max_runtime_s: int
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`python -m bench.run ARGS` bounded by --max-runtime (and 40 s more); the run
    and the JSON it wrote."""
    # scripts/test installs wrk and nginx (bench/setup.sh); missing tools are a failure.
    assert shutil.which("wrk") is not None, "wrk is missing: run bench/setup.sh"
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", *args, "--results-dir", str(results)]
        + ["--max-runtime", str(max_runtime_s)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=max_runtime_s + 40,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (result_file,) = results.glob("*.json")
    result: dict[str, Any] = json.loads(result_file.read_text())
    return run, result


def test_quick_benchmark_writes_sane_json(tmp_path: Path) -> None:
    run, result = run_bench(
        # No warm-up load: this run judges no figure, and a cold first cell must be sane too.
        tmp_path,
        "--quick",
        "--repetitions",
        str(REPETITIONS),
        "--warmup",
        "0",
        max_runtime_s=125,
    )
    output = run.stdout + run.stderr

    assert result["complete"], output
    assert result["machine"]["cores"] == os.cpu_count()
    assert all(p["ok"] for p in result["probes"].values()), result["probes"]
    assert result["error_captures"] == []

    rows = {(r["case"], r["workload"]): r for r in result["summary"]}
    assert set(rows) == {(c, w) for c in CASES for w in QUICK_WORKLOADS}
    for (case, _), row in rows.items():
        assert row["repetitions"] == REPETITIONS
        assert row["requests"] > 0 and row["req_per_s"] > 0 and row["docs_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["non_2xx_3xx"] == 0 and row["socket_errors"] == 0
        if case != "B":
            assert row["added_p50_vs_B_ms"] is not None
        if case == "A":
            continue
        assert row["envoy_cpu_ms_per_req"] > 0
        if case == "B":
            assert row["ext_proc_msgs_per_req"] == 0
        else:
            assert row["extproc_cpu_ms_per_req"] > 0
            assert 0 < row["extproc_rss_mb"] < 2048
    (workers_target,) = result["workers_targets"]
    assert workers_target["case"] == "S-b2" and workers_target["against"] == "S-b"
    assert workers_target["ratio"] > 0 and "target >= 1.25" in output
    for workload in QUICK_WORKLOADS:
        # Naive is all four phases by construction; shipped never sends more.
        assert rows[("N-a", workload)]["ext_proc_msgs_per_req"] == 4
        assert rows[("N-b", workload)]["ext_proc_msgs_per_req"] == 4
        assert rows[("S-a", workload)]["ext_proc_msgs_per_req"] <= 4
        assert rows[("S-b", workload)]["ext_proc_msgs_per_req"] <= 4
        # Two workers: the same messages, whichever worker gets them.
        assert (
            rows[("S-b2", workload)]["ext_proc_msgs_per_req"]
            == rows[("S-b", workload)]["ext_proc_msgs_per_req"]
        )
        # The upstream cuts `dimensions` itself: no response phase.
        assert rows[("S-n", workload)]["ext_proc_msgs_per_req"] == 1
    assert "S shipped, full rewrite" in run.stdout
    assert "issue" not in run.stdout.lower()  # the output names no tracker entries


def test_run_py_still_runs_as_a_file() -> None:
    # `python bench/run.py` from anywhere: the shim imports the checkout's package.
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--help"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "--quick" in run.stdout and "--workloads" in run.stdout


@pytest.fixture(scope="module")
def floors_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short run of the cases the floors' tests read: the native pair (S-n, F-n) and
    the library floor beside the shipped gateway (B, S-b, L-a, L-b)."""
    _, result = run_bench(
        tmp_path_factory.mktemp("floors"),
        *("--cases", "S-n,F-n,B,S-b,L-a,L-b", "--workloads", "seed-c1"),
        *("--duration", "1", "--repetitions", "1", "--warmup", "0"),
        max_runtime_s=100,
    )
    return result


def test_native_cases_forward_dimensions(floors_run: dict[str, Any]) -> None:
    """S-n and F-n: the upstream's native port answers the 256-d vectors itself, so the
    shipped gateway and its floor each take one ext_proc message per request. Exactly
    one: their config is rendered from the native policy, which needs no precheck
    marker, so the request takes the plain route, where no response phase exists. (On
    the one-stream route the server's end of the stream raced the upstream's answer:
    Envoy sent the response body too when it already had it, docs/envoy-facts.md.)"""
    probes = floors_run["probes"]
    for probe in (probes["S-n/8"], probes["F-n/8"]):
        assert probe["ok"] and probe["dimensions"] == [256], probe
        assert probe["ext_proc_msgs"] == 1, probe
    rows = {r["case"]: r for r in floors_run["summary"]}
    assert rows["S-n"]["requests"] > 0 and rows["S-n"]["extproc_cpu_ms_per_req"] > 0


def test_library_floor_cuts_as_the_gateway(floors_run: dict[str, Any]) -> None:
    """L, the library floor, answers what the gateway answers (256-d vectors) on the
    shipped gateway's message pattern: two messages for the full rewrite, one for a
    plain request."""
    probes = floors_run["probes"]
    assert probes["L-b/8"]["ok"] and probes["L-b/8"]["dimensions"] == [256], probes
    assert probes["L-b/8"]["ext_proc_msgs"] == probes["S-b/8"]["ext_proc_msgs"] == 2, probes
    assert probes["L-a/8"]["ok"] and probes["L-a/8"]["ext_proc_msgs"] == 1, probes
    rows = {r["case"]: r for r in floors_run["summary"]}
    assert rows["L-b"]["requests"] > 0 and rows["L-b"]["extproc_cpu_ms_per_req"] > 0
