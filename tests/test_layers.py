"""The package's layers, read from its imports (static: every `import` in every module).

The layers, lowest first: core -> service -> runtime -> tools -> commands. A module
imports from its own layer and the layers below it, never from one above.

- core: the sans-I/O contract; it also imports no grpc, no prometheus_client and no
  Envoy protos. It opens no file, reads no environment and no clock, and imports
  nothing that does (os, time, the network clients); one module reads package data,
  the shipped presets (``extproc/core/policy/presets``), through importlib.resources,
  as an import reads the package.
- service: the ext_proc shell around the core. Its metrics are Protocols it is given;
  only extproc/service/metrics.py, their Prometheus implementation, imports
  prometheus_client; only extproc/service/tracing.py imports OpenTelemetry.
- runtime: what runs the gateway: Envoy and ext_proc processes, the Envoy configs.
- tools: probe, shadow, learn, and what they share: toolkit and parity. A tool imports
  only its own package and the shared ones, never another tool; the toolkit imports
  parity, and parity no other tools package.
- commands: the command line.

A module's layer is the package under ``extproc`` it sits in, with no exception: the
command line is ``extproc`` (``python -m extproc``) alone. The root modules
(``extproc/__init__.py``, ``extproc/__main__.py``) are in no layer, and no layer imports
them.

No module imports itself back through a cycle, and none below commands names a
commands module in a string (``python -m extproc.commands.X``: a dependency no import
shows).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing_support.qwen import REPO

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


LAYERS = ("core", "service", "runtime", "tools", "commands")  # lowest first


def layer(name: str) -> str:
    """The layer of an ``extproc`` module, or "root" for the package's own modules."""
    parts = name.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] == "__main__"):
        return "root"
    return parts[1]


LAYERED = [name for name in MODULES if layer(name) != "root"]


@pytest.mark.parametrize("name", LAYERED)
def test_every_module_is_in_a_layer(name: str) -> None:
    assert layer(name) in LAYERS, f"{name} is in no layer of {LAYERS}"


@pytest.mark.parametrize("name", LAYERED)
def test_imports_come_from_the_layers_below(name: str) -> None:
    rank = LAYERS.index(layer(name))
    bad = sorted(
        target
        for target in internal_imports(name)
        if layer(target) not in LAYERS or LAYERS.index(layer(target)) > rank
    )
    assert not bad, f"{name} ({layer(name)}) imports {bad}, from no layer at or below its own"


@pytest.mark.parametrize("name", [n for n in MODULES if layer(n) == "core"])
def test_core_does_no_io_imports(name: str) -> None:
    bad = sorted(target for target in imports_of(name) if target.split(".")[0] in IO_PREFIXES)
    assert not bad, f"{name} is in the sans-I/O core but imports {bad}"


# What a core module never imports: files, processes, the environment, clocks, the network.
CORE_IO_MODULES = (
    "os",
    "time",
    "io",
    "shutil",
    "subprocess",
    "urllib",
    "http",
    "socket",
    "huggingface_hub",
    "requests",
    "httpx",
)
# ...and never calls: opening or looking at files, sleeping, the environment.
CORE_IO_CALLS = frozenset(
    {
        "open",
        "read_text",
        "read_bytes",
        "write_text",
        "write_bytes",
        "is_file",
        "is_dir",
        "exists",
        "stat",
        "lstat",
        "iterdir",
        "glob",
        "rglob",
        "sleep",
        "getenv",
    }
)
# The one package-data read of the core: the shipped presets, read as an import reads
# the package (importlib.resources), with the calls that read them.
PACKAGE_DATA_READER = "extproc.core.policy.presets"
PACKAGE_DATA_IMPORT = "importlib.resources"
PACKAGE_DATA_CALLS = frozenset({"iterdir", "read_text"})
CORE = [n for n in MODULES if layer(n) == "core"]


def tree_of(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def io_of(name: str) -> list[str]:
    """What in this module's code touches files, the environment or a clock: each
    call of CORE_IO_CALLS (``open``, ``.is_file()``, ``time.sleep``) and each
    ``environ`` it reads, by name and line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree_of(name)):
        called = node.func if isinstance(node, ast.Call) else None
        what = (
            called.attr
            if isinstance(called, ast.Attribute)
            else called.id
            if isinstance(called, ast.Name)
            else None
        )
        if what in CORE_IO_CALLS:
            found.append((node.lineno, f"{what}() at line {node.lineno}"))
        elif isinstance(node, ast.Attribute | ast.Name) and "environ" in (
            getattr(node, "attr", None),
            getattr(node, "id", None),
        ):
            found.append((node.lineno, f"environ at line {node.lineno}"))
    return [what for _, what in sorted(found)]


@pytest.mark.parametrize("name", CORE)
def test_core_imports_nothing_that_does_io(name: str) -> None:
    bad = sorted(t for t in imports_of(name) if t.split(".")[0] in CORE_IO_MODULES)
    if name != PACKAGE_DATA_READER:
        bad += sorted(t for t in imports_of(name) if t.startswith(PACKAGE_DATA_IMPORT))
    assert not bad, f"{name} is in the sans-I/O core but imports {bad}: the service does I/O"


@pytest.mark.parametrize("name", CORE)
def test_core_opens_no_file_and_reads_no_environment_or_clock(name: str) -> None:
    found = io_of(name)
    if name == PACKAGE_DATA_READER:
        found = [f for f in found if f.split("()")[0] not in PACKAGE_DATA_CALLS]
    assert not found, f"{name} is in the sans-I/O core but calls {found}"


def test_the_one_package_data_reader_reads_package_data() -> None:
    """The exemption above names a module that still needs it."""
    assert PACKAGE_DATA_READER in CORE
    assert any(t.startswith(PACKAGE_DATA_IMPORT) for t in imports_of(PACKAGE_DATA_READER))
    assert {f.split("()")[0] for f in io_of(PACKAGE_DATA_READER)} == PACKAGE_DATA_CALLS


def test_io_of_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The AST checks above can fail: each kind of I/O is found in a module's code."""
    path = tmp_path / "m.py"
    path.write_text(
        "import os, time\n"
        "from os import environ\n"
        "open('f')\n"
        "p.is_file()\n"
        "time.sleep(1)\n"
        "os.environ.get('X')\n"
        "environ['X']\n"
    )
    MODULES["probe_module"] = path
    try:
        assert io_of("probe_module") == [
            "open() at line 3",
            "is_file() at line 4",
            "sleep() at line 5",
            "environ at line 6",
            "environ at line 7",
        ]
        assert {"os", "time"} <= set(imports_of("probe_module"))
    finally:
        del MODULES["probe_module"]


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


TRACING_MODULE = "extproc.service.tracing"


@pytest.mark.parametrize("name", MODULES)
def test_only_the_tracing_module_imports_opentelemetry(name: str) -> None:
    otel = sorted(t for t in imports_of(name) if t.split(".")[0] == "opentelemetry")
    assert name == TRACING_MODULE or not otel, (
        f"{name} imports {otel}: OpenTelemetry is optional (the tracing extra) and loaded "
        f"only with --tracing, through {TRACING_MODULE}"
    )


def test_the_tracing_module_exists() -> None:
    assert TRACING_MODULE in MODULES


# What the tools share, each package allowed to import those after it (and itself).
SHARED_TOOL_PACKAGES = ("toolkit", "parity")


def tool_package(name: str) -> str | None:
    """The package under ``extproc.tools`` a module is in (None outside one)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tools" else None


def tool_packages_allowed(package: str) -> set[str]:
    if package in SHARED_TOOL_PACKAGES:
        return set(SHARED_TOOL_PACKAGES[SHARED_TOOL_PACKAGES.index(package) :])
    return {package, *SHARED_TOOL_PACKAGES}


def test_the_shared_tool_packages_exist() -> None:
    assert {tool_package(name) for name in MODULES} >= set(SHARED_TOOL_PACKAGES)


@pytest.mark.parametrize("name", [n for n in MODULES if tool_package(n) is not None])
def test_a_tool_imports_only_itself_and_what_the_tools_share(name: str) -> None:
    package = tool_package(name)
    assert package is not None
    allowed = tool_packages_allowed(package)
    bad = sorted(
        target
        for target in internal_imports(name)
        if tool_package(target) is not None and tool_package(target) not in allowed
    )
    assert not bad, (
        f"{name} imports {bad}: a tool package imports only itself and "
        f"{', '.join(SHARED_TOOL_PACKAGES)} (move what two tools use into the toolkit)"
    )


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


COMMANDS_MODULE = re.compile(r"\bextproc[./]commands\b")


def strings_of(name: str) -> list[str]:
    """The string constants of a module's code, docstrings left out (a docstring may
    point a reader at the command line; only code can run it)."""
    tree = tree_of(name)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


@pytest.mark.parametrize("name", [n for n in LAYERED if layer(n) != "commands"])
def test_no_module_below_commands_names_a_commands_module(name: str) -> None:
    named = [s for s in strings_of(name) if COMMANDS_MODULE.search(s)]
    assert not named, (
        f"{name} ({layer(name)}) names {named}: running a commands module is importing "
        "it; what a lower layer starts must live in its own layer"
    )


def test_strings_of_finds_a_commands_module_in_code_not_in_docstrings(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        '"""Run by extproc.commands.cli."""\n'
        'ARGV = ["python", "-m", "extproc.commands.worker"]\n'
        'def f():\n    """See extproc/commands/cli.py."""\n    return "extproc/commands/x.py"\n'
    )
    MODULES["probe_module"] = path
    try:
        named = [s for s in strings_of("probe_module") if COMMANDS_MODULE.search(s)]
        assert named == ["extproc.commands.worker", "extproc/commands/x.py"]
    finally:
        del MODULES["probe_module"]
