"""`extproc run --workers N` (extproc/runtime/worker_pool.py): how N is chosen, how the
workers are started, rendered into Envoy's ext_proc cluster, counted on /metrics,
asked for their health, stopped, and what happens when one cannot start or the
launcher dies.

Live tests drive `extproc run` (tests/harness.py) with a real Envoy in front of the
fake Dynamo; every process is stopped by its PID. The worker faults under load (a
worker SIGKILLed, one SIGTERMed) are in tests/test_faults_extproc.py, the reload
reaching every worker in tests/test_reload.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extproc.core.policy import GatewayPolicy
from extproc.runtime.cpu_count import CgroupCpu, quota_cpus, read_cgroup_cpu, usable_cpus
from extproc.runtime.envoy_config import (
    EnvoySettings,
    Upstream,
    dump,
    load_template,
    render,
    template_path,
    with_extproc_workers,
)
from extproc.runtime.worker_pool import (
    FIRST_RESTART_DELAY_S,
    MAX_RESTART_DELAY_S,
    STABLE_S,
    WorkerPool,
    WorkerSettings,
    WorkerStartError,
    catches_sighup,
    restart_delay,
    worker_argv,
    worker_env,
)
from extproc.service.net import free_port
from extproc.service.tls import TlsSettings
from testing_support.envoy import envoy_validate
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import metric_value
from testing_support.processes import wait_until
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways

# -- how many -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("affinity", "files", "expected"),
    [
        (2, CgroupCpu(), 2),  # no cgroup files: the CPUs the scheduler allows
        (8, CgroupCpu(cpu_max="max 100000\n"), 8),  # v2 without a quota
        (8, CgroupCpu(cpu_max="200000 100000\n"), 2),  # v2: 2 CPUs
        (8, CgroupCpu(cpu_max="150000 100000"), 1),  # 1.5 CPUs: rounded down
        (8, CgroupCpu(cpu_max="50000 100000"), 1),  # half a CPU: at least 1
        (2, CgroupCpu(cpu_max="400000 100000"), 2),  # a quota above the affinity
        (16, CgroupCpu(cfs_quota_us="-1\n", cfs_period_us="100000\n"), 16),  # v1, no quota
        (16, CgroupCpu(cfs_quota_us="300000", cfs_period_us="100000"), 3),  # v1: 3 CPUs
        (1, CgroupCpu(), 1),  # a 1-CPU box
        (0, CgroupCpu(), 1),  # nothing known: 1
        (4, CgroupCpu(cpu_max="garbage"), 4),  # unreadable: no limit assumed
        (4, CgroupCpu(cfs_quota_us="100000", cfs_period_us="0"), 4),
    ],
)
def test_the_default_worker_count_is_the_usable_cpus(
    affinity: int, files: CgroupCpu, expected: int
) -> None:
    assert usable_cpus(affinity, files) == expected


def test_a_v2_quota_wins_over_v1_files() -> None:
    both = CgroupCpu(cpu_max="100000 100000", cfs_quota_us="400000", cfs_period_us="100000")
    assert quota_cpus(both) == 1.0


def test_the_cgroup_files_are_found_under_the_process_cgroup_then_the_root(
    tmp_path: Path,
) -> None:
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("300000 100000\n")
    (v2 / "cpu.max").write_text("max 100000\n")
    assert read_cgroup_cpu(v2, "0::/kubepods/pod1\n").cpu_max == "300000 100000\n"
    # A host path that does not exist in the container's view: the root's file.
    assert read_cgroup_cpu(v2, "0::/docker/abc\n").cpu_max == "max 100000\n"
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    found = read_cgroup_cpu(v1, "4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert usable_cpus(8, found) == 2
    assert read_cgroup_cpu(tmp_path / "none", "0::/\n") == CgroupCpu()


# -- how they are started and restarted -------------------------------------------------


def test_a_worker_is_extproc_serve_with_the_launchers_policy_and_tls(tmp_path: Path) -> None:
    tls = TlsSettings(tmp_path / "s.pem", tmp_path / "s.key", tmp_path / "ca.pem")
    settings = WorkerSettings(
        count=2,
        config=tmp_path / "policy.yaml",
        tokenizer_overrides={QWEN_MODEL: tmp_path / "tok"},
        grace_seconds=7.5,
        watch=False,
        tls=tls,
        log_level="debug",
        metrics_dir=tmp_path / "metrics",
    )
    argv = worker_argv(settings, 40123)
    assert argv[:3] == [sys.executable, "-m", "extproc.runtime.worker_process"]
    flags = " ".join(argv[3:])
    assert flags == (
        f"--listen 127.0.0.1:40123 --config {tmp_path}/policy.yaml "
        f"--tokenizer {QWEN_MODEL}={tmp_path}/tok --grace 7.5 --no-watch "
        f"--tls-cert {tmp_path}/s.pem --tls-key {tmp_path}/s.key --tls-client-ca {tmp_path}/ca.pem"
    )
    base = {"PATH": "/bin", "EXTPROC_METRICS": "0.0.0.0:9090", "EXTPROC_LISTEN": ":50051"}
    env = worker_env(settings, 2, base, 4242)
    # The launcher serves every worker's metrics on its address: no worker serves its own.
    assert "EXTPROC_METRICS" not in env and "EXTPROC_LISTEN" not in env
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "metrics")
    assert env["EXTPROC_WORKER_INDEX"] == "2" and env["EXTPROC_WORKER_LAUNCHER_PID"] == "4242"
    assert env["EXTPROC_LOG_LEVEL"] == "debug" and env["PATH"] == "/bin"
    without_metrics = worker_env(WorkerSettings(1, tmp_path), 1, base, 1)
    assert "PROMETHEUS_MULTIPROC_DIR" not in without_metrics


def test_a_worker_that_keeps_dying_waits_longer_each_time_up_to_a_bound() -> None:
    delays = []
    delay = None
    for _ in range(10):
        delay = restart_delay(delay, ran_s=1.0)
        delays.append(delay)
    assert delays[0] == FIRST_RESTART_DELAY_S
    assert delays == sorted(delays) and delays[-1] == MAX_RESTART_DELAY_S
    # One that ran long enough is restarted at once again.
    assert restart_delay(MAX_RESTART_DELAY_S, ran_s=STABLE_S) == FIRST_RESTART_DELAY_S


def test_a_worker_is_ready_once_it_catches_sighup() -> None:
    """`extproc serve` installs its SIGHUP handler right after SERVING: the launcher
    reads that in /proc/PID/status (SigCgt, bit 0 is SIGHUP), whatever TLS it speaks."""
    starting = "Name:\tpython\nSigIgn:\t0000000001001001\nSigCgt:\t0000000180000002\n"
    serving = "Name:\tpython\nSigIgn:\t0000000001001000\nSigCgt:\t0000000180004003\n"
    assert not catches_sighup(starting)
    assert catches_sighup(serving)
    assert not catches_sighup("")  # gone


# -- Envoy's side ---------------------------------------------------------------------


def _settings() -> EnvoySettings:
    return EnvoySettings("127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://x.test:80"))


@pytest.mark.parametrize("template", ["standalone.yaml", "single-filter.yaml"])
def test_envoy_lists_every_worker_checks_their_health_and_validates(
    template: str, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    rendered = render(load_template(template_path(template)), _settings(), qwen_policy)
    config = with_extproc_workers(rendered, [15051, 15052, 15053])
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "extproc"]
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for group in cluster["load_assignment"]["endpoints"]
        for e in group["lb_endpoints"]
    ]
    assert ports == [15051, 15052, 15053]
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    (check,) = cluster["health_checks"]
    assert "grpc_health_check" in check and check["unhealthy_threshold"] == 1
    assert cluster["outlier_detection"]["consecutive_local_origin_failure"] == 1
    # Never to a worker known to be down, however many are.
    assert cluster["common_lb_config"]["healthy_panic_threshold"] == {"value": 0.0}
    assert rendered != config and "health_checks" not in str(rendered)  # a copy
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shadow_configs_gateway_cluster_takes_workers_too() -> None:
    for name in ("shadow.yaml", "shadow-reverse.yaml"):
        config = with_extproc_workers(load_template(template_path(name)), [1, 2])
        (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "extproc"]
        assert len(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2


def test_workers_need_ports_and_the_cluster() -> None:
    with pytest.raises(ValueError, match="at least one"):
        with_extproc_workers(load_template(), [])
    with pytest.raises(ValueError, match="no 'nope' cluster"):
        with_extproc_workers(load_template(), [1], cluster="nope")


# -- live: `extproc run --workers N` ------------------------------------------------------


def _health(*addresses: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extproc", "health", "--address", ",".join(addresses)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def gateway(request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways) -> Gateway:
    return gateways.shared(GatewaySpec(upstream.url, workers=request.param))


def test_metrics_count_the_requests_of_every_worker(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    workers = len(gateway.extproc_addresses)
    before = gateway.metrics()

    def counted(name: str, **labels: str) -> float:
        return metric_value(gateway.metrics(), name, **labels) - metric_value(
            before, name, **labels
        )

    shares_before = gateway.streams_per_worker()
    sent = 24
    for i in range(sent):
        body = {"model": QWEN_MODEL, "input": f"doc {i}"}
        if i % 2:
            body["dimensions"] = 256  # a response rewrite too
        assert gateway.embeddings(body).status == 200
    bad = gateway.embeddings({"model": QWEN_MODEL, "input": "x", "dimensions": 0})
    assert bad.status == 400
    text = gateway.metrics()
    assert counted("extproc_requests_total") == sent + 1
    assert counted("extproc_requests_total", outcome="rejected") == 1
    assert counted("extproc_responses_rewritten_total", kind="vectors") == sent // 2
    assert counted("extproc_processing_seconds_count", phase="request") == sent + 1
    # A stream ends when Envoy closes it, which can come just after the client's answer.
    wait_until(
        lambda: metric_value(gateway.metrics(), "extproc_active_streams") == 0,
        5,
        "every stream ended",
    )
    after = gateway.streams_per_worker()
    shares = {address: after[address] - shares_before.get(address, 0) for address in after}
    assert len(shares) == workers
    if workers > 1:
        # Each worker served a share, and the one endpoint counted them all.
        assert min(shares.values()) >= 3, shares
        assert metric_value(text, "extproc_workers_serving") == workers
        assert metric_value(text, "extproc_worker_restarts_total") == 0
        pids = gateway.worker_pids()
        assert sorted(pids) == list(range(1, workers + 1))
    health = _health(*gateway.extproc_addresses)
    assert health.returncode == 0, health
    assert health.stdout.split() == (
        ["SERVING"]
        if workers == 1
        else [part for a in gateway.extproc_addresses for part in (a, "SERVING")]
    )


def test_health_is_unhealthy_when_one_worker_address_is(gateway: Gateway) -> None:
    from extproc.service.net import free_port

    nobody = f"127.0.0.1:{free_port()}"
    health = _health(*gateway.extproc_addresses, nobody)
    assert health.returncode == 1
    assert f"{nobody} unhealthy: UNAVAILABLE" in health.stderr
    assert health.stdout.count("SERVING") == len(gateway.extproc_addresses)


@pytest.mark.alone  # drains within bounds after SIGTERM
def test_sigterm_stops_envoy_then_drains_every_worker(
    upstream: FakeUpstream, gateways: Gateways
) -> None:
    with gateways.own(GatewaySpec(upstream.url, workers=2)) as gw:
        assert gw.embeddings({"model": QWEN_MODEL, "input": "hello"}).status == 200
        pids = list(gw.worker_pids().values())
        assert len(pids) == 2 and all(_pid_alive(p) for p in pids)
    # Stopped by SIGTERM, status 0 (Gateways.own).
    assert _wait_gone(pids, 5) == []
    log = gw.log()
    assert log.index("caught ENVOY_SIGTERM") < log.index(
        "worker 1: extproc.service.server: stopping"
    )
    for index in (1, 2):
        assert f"worker {index}: extproc.service.server: stopped" in log
    assert "restarting" not in log and "Traceback" not in log


def test_a_policy_that_cannot_be_served_stops_the_command_before_any_worker(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A tokenizer that does not load: the launcher checks the whole contract first,
    so one line says why, no worker and no Envoy start, status 2."""
    broken = tmp_path / "tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{bad", encoding="utf-8")
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        run = subprocess.run(
            [sys.executable, "-m", "extproc", "run", "--upstream", upstream.url]
            + ["--workers", "2", "--tokenizer", f"{QWEN_MODEL}={broken}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
    text = log_path.read_text()
    assert run.returncode == 2, text
    (line,) = text.splitlines()
    assert line.startswith("error: ") and f"{broken}/tokenizer.json cannot be loaded" in line
    assert "worker" not in text and "extproc ready" not in text, text


async def test_a_worker_that_cannot_start_stops_the_pool(tmp_path: Path) -> None:
    """A worker that exits before it serves (here: its policy file is gone by the time
    it reads it): start() says which and why, and no worker is left running."""
    settings = WorkerSettings(2, tmp_path / "gone.yaml", grace_seconds=2)
    pool = WorkerPool(settings, [free_port(), free_port()])
    with pytest.raises(WorkerStartError, match="before it served") as caught:
        await asyncio.wait_for(pool.start(), 120)
    assert "worker 1" in str(caught.value) and "worker 2" in str(caught.value)
    for pid in pool.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.alone  # SIGKILL: the workers gone within a bound
def test_the_workers_go_when_the_launcher_is_killed(
    upstream: FakeUpstream, gateways: Gateways
) -> None:
    with gateways.own(GatewaySpec(upstream.url, workers=2), clean_exit=False) as gw:
        envoy_pid = int(gw.ready_line.split("envoy pid ")[1].split(",")[0])
        try:
            pids = list(gw.worker_pids().values())
            gw.process.signal(signal.SIGKILL)
            gw.process.popen.wait(10)
            # Each worker gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and drains.
            assert _wait_gone(pids, 15) == []
        finally:
            if _pid_alive(envoy_pid):  # Envoy is the launcher's child: no such tie
                os.kill(envoy_pid, signal.SIGTERM)
                _wait_gone([envoy_pid], 10)


def test_a_launcher_of_workers_loads_no_grpc() -> None:
    """The launcher of `extproc run --workers N` never serves gRPC itself; without grpc
    and Envoy's protos it idles at ~16 MB less RSS (docs/operations.md, idle footprint).
    Checked in a fresh interpreter: the command line and the launcher's whole path."""
    modules = (
        "extproc.commands.cli",
        "extproc.runtime.gateway_launcher",
        "extproc.runtime.extproc_servers",
        "extproc.service.tls",
        "extproc.service.stop_signals",
    )
    script = (
        f"import sys; import {', '.join(modules)}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'envoy', 'xds'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
