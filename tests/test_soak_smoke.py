"""Smoke test of the soak tool: `python -m bench.soak` shortened to 12 s (3 windows of 4 s: the
warm-up, then the first and the last window the verdict compares).

Starts the real pieces (nginx or node upstream, `extproc run` with its Envoy, wrk with
the request mix) on loopback and checks that the verdict passes and that the JSON it
writes shows real measurements: requests and RSS samples in every window, the mix's
rewrite requests through the response path. p99 is judged loosely (5x instead of 1.5x):
this machine is shared and CI runs on it, and 4 s windows are short; the full soak
(`python -m bench.soak`, 10 minutes) is where p99 stability is judged.
Missing wrk is a failure (`bench/setup.sh` installs it), as in test_bench_smoke.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.alone  # the soak's p99 and RSS verdict

REPO = Path(__file__).resolve().parent.parent
WINDOWS = 3  # the fewest --duration allows: warm-up + 2 windows
WINDOW_S = 4
SAMPLE_EVERY_S = 1
BOUND_S = 200  # 12 s of load + ~15 s of start and checks; --max-runtime 150 bounds it


def test_short_soak_passes_and_writes_sane_json(tmp_path: Path) -> None:
    # scripts/test installs wrk and nginx (bench/setup.sh); missing tools are a failure.
    assert shutil.which("wrk") is not None, "wrk is missing: run bench/setup.sh"
    out = tmp_path / "soak"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--duration",
            str(WINDOWS * WINDOW_S),
            "--window",
            str(WINDOW_S),
            "--sample-interval",
            str(SAMPLE_EVERY_S),
            "--p99-ratio",
            "5",
            "--out",
            str(out),
            "--max-runtime",
            "150",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    result = json.loads((out / "soak.json").read_text())
    assert (out / "soak.md").read_text().startswith("| window |")

    assert result["complete"], output
    assert result["settings"]["windows"] == WINDOWS and result["settings"]["window_s"] == WINDOW_S
    assert result["settings"]["connections"] == 16
    verdict = result["verdict"]
    assert verdict["pass"], verdict
    checks = {c["name"]: c for c in verdict["checks"]}
    assert set(checks) == {"errors", "rss_flat", "rss_ceiling", "p99_stable"}
    assert checks["errors"]["value"] == 0
    assert checks["rss_flat"]["late_windows"] == [WINDOWS]
    assert 0 < checks["rss_flat"]["baseline_mb"] < 2048
    assert 0 < checks["rss_ceiling"]["value"] <= 300
    assert checks["p99_stable"]["first_ms"] > 0 and checks["p99_stable"]["last_ms"] > 0

    for when in ("before", "after"):
        kinds = result["check_requests"][when]
        assert set(kinds) == {"seed", "rewrite", "base64", "float"}
        assert all(c["ok"] and c["status"] == 200 for c in kinds.values()), kinds
        assert kinds["rewrite"]["dimensions"] == [256]
        # A rewrite goes through the response path: more messages than the seed's one.
        assert kinds["rewrite"]["ext_proc_msgs"] > kinds["seed"]["ext_proc_msgs"] >= 1

    windows = result["windows"]
    assert [w["window"] for w in windows] == list(range(1, WINDOWS + 1))
    assert windows[0]["phase"] == "warm-up"
    for w in windows:
        assert w["requests"] > 0 and w["req_per_s"] > 0
        assert 0 < w["p50_ms"] <= w["p99_ms"] <= w["max_ms"]
        assert w["errors"] == 0 and w["non_2xx_3xx"] == 0 and w["socket_errors"] == 0
        assert set(w["envoy_codes"]) == {"2xx"}
        assert w["rss_samples"] > 0
        assert w["extproc_rss_mb_end"] > 0 and w["envoy_rss_mb_end"] > 0
        assert w["cores"]["extproc"] > 0 and w["cores"]["envoy"] > 0
        # The mix really rotates: 10% rewrites lift the average above the seed's 1.
        assert w["ext_proc_msgs_per_req"] > 1.0
    samples = result["samples"]
    # every SAMPLE_EVERY_S during the load, plus the window ends
    assert len(samples) >= WINDOWS * WINDOW_S // SAMPLE_EVERY_S
    assert all(s["extproc_rss_mb"] and s["envoy_rss_mb"] for s in samples)
    assert result["ext_proc_msgs_per_req_expected"] > 1.0
    assert "verdict: PASS" in run.stdout
