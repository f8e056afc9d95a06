"""The package's layers, read from its imports (static: every `import` in every module).

- core: the sans-I/O contract. It imports no grpc, no prometheus_client, no Envoy protos,
  and nothing from the layers above it.
- service: the ext_proc shell around the core; it does not reach up into commands or tools.
  Its metrics are Protocols it is given; only extproc/service/metrics.py, their
  Prometheus implementation, imports prometheus_client.
- tools: probe, shadow, learn and parity; they may use core, service and the shared
  command helpers (the launcher, the Envoy config rendering, the workers), never a
  command-line module: those run the tools, so they sit above them. The command-line
  modules are listed here (COMMAND_LINE): cli, and each tool's command and launcher, which
  live in extproc/commands/ beside the other commands; a commands module that imports a
  tool must be one of them. A package's ``__main__`` is a command line of its own
  (``python -m extproc.tools.shadow``) and may use one.
- No module imports itself back through a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "extproc"
IO_PREFIXES = ("grpc", "grpc_health", "prometheus_client", "envoy", "xds", "udpa")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_generated(path: Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py"))


MODULES = {
    module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if not is_generated(path)
}


def imports_of(name: str) -> Iterator[str]:
    """Absolute names this module imports, at any depth of its body (lazy imports too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def internal_imports(name: str) -> set[str]:
    """The project modules this module depends on (a package's name stands for its __init__)."""
    return {target for target in imports_of(name) if target in MODULES and target != name}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "root"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n) == "core"])
def test_core_does_no_io_imports(name: str) -> None:
    bad = sorted(
        target
        for target in imports_of(name)
        if target.split(".")[0] in IO_PREFIXES
        or (target.startswith("extproc.") and layer(target) not in ("core", "root"))
    )
    assert not bad, f"{name} is in the sans-I/O core but imports {bad}"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n) == "service"])
def test_service_does_not_reach_up(name: str) -> None:
    bad = sorted(t for t in internal_imports(name) if layer(t) in ("commands", "tools"))
    assert not bad, f"{name} (service) imports {bad}"


PROMETHEUS_MODULE = "extproc.service.metrics"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n) == "service"])
def test_only_the_metrics_module_of_service_imports_prometheus(name: str) -> None:
    prometheus = sorted(t for t in imports_of(name) if t.split(".")[0] == "prometheus_client")
    assert name == PROMETHEUS_MODULE or not prometheus, (
        f"{name} (service) imports {prometheus}: it reports to the metrics it is given; "
        f"{PROMETHEUS_MODULE} implements them in Prometheus"
    )


def test_the_prometheus_module_exists() -> None:
    assert PROMETHEUS_MODULE in MODULES


COMMAND_LINE = frozenset(
    f"extproc.commands.{name}" for name in ("cli", "probe", "learn", "shadow", "shadow_launcher")
)


@pytest.mark.parametrize(
    "name", [n for n in MODULES if layer(n) == "tools" and not n.endswith(".__main__")]
)
def test_tools_do_not_import_the_command_line(name: str) -> None:
    bad = sorted(internal_imports(name) & COMMAND_LINE)
    assert not bad, f"{name} (tools) imports the command-line modules {bad}"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n) == "commands"])
def test_only_command_line_modules_import_tools(name: str) -> None:
    tools = sorted(t for t in internal_imports(name) if layer(t) == "tools")
    assert name in COMMAND_LINE or not tools, (
        f"{name} imports the tools {tools}: only the command-line modules (COMMAND_LINE) "
        "run the tools; the other commands modules are helpers the tools may use"
    )


def test_command_line_modules_exist() -> None:
    assert not COMMAND_LINE - MODULES.keys(), sorted(COMMAND_LINE - MODULES.keys())


def test_no_import_cycles() -> None:
    graph = {name: internal_imports(name) for name in MODULES}
    # A package's __init__ that only re-exports its own modules is not a dependency back
    # onto them: drop edges from a module to the packages that contain it.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
