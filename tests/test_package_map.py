"""The package's map, read from the files: every package's docstring names exactly its
modules and subpackages, and a class name is defined once across the package.

A package docstring is where a newcomer starts: each of its modules and subpackages is
named there as ``name`` (double backticks), and a double-backticked bare lowercase
identifier names nothing else (other code is quoted with single backticks or by its
qualified name). Generated code is no one's map: the ``*_pb2*`` modules and the ``v1``
package of the generated policy protos are left out.

A top-level class name means one thing across ``extproc``: two classes of one name
would be two concepts under one word (the names a reader greps for, and imports).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from testing_support.qwen import REPO

PACKAGE = REPO / "extproc"
NAMED = re.compile(r"``([a-z_][a-z0-9_]*)``")
GENERATED_PACKAGES = frozenset({"v1"})


def is_generated(path: Path) -> bool:
    return "_pb2" in path.name or any(part in GENERATED_PACKAGES for part in path.parts)


def packages() -> list[Path]:
    """Every package below ``extproc`` (not the root, not generated code)."""
    return sorted(
        init.parent
        for init in PACKAGE.rglob("__init__.py")
        if init.parent != PACKAGE and not is_generated(init.parent.relative_to(PACKAGE))
    )


def members(package: Path) -> set[str]:
    """The package's modules and subpackages, by name."""
    modules = {
        path.stem
        for path in package.glob("*.py")
        if path.stem not in ("__init__", "__main__") and "_pb2" not in path.name
    }
    subpackages = {
        path.name
        for path in package.iterdir()
        if (path / "__init__.py").is_file() and path.name not in GENERATED_PACKAGES
    }
    return modules | subpackages


def named(package: Path) -> set[str]:
    """The bare lowercase identifiers the package docstring double-backticks."""
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    return set(NAMED.findall(ast.get_docstring(tree) or ""))


def _param(package: Path) -> object:
    return pytest.param(package, id=package.relative_to(PACKAGE).as_posix())


def test_every_package_is_listed() -> None:
    """The packages the maps are checked for include each layer (a package added later
    is checked, not skipped)."""
    found = {p.relative_to(PACKAGE).as_posix() for p in packages()}
    assert {"core", "service", "runtime", "tools", "commands", "tools/toolkit"} <= found
    assert not any("v1" in name.split("/") for name in found)


@pytest.mark.parametrize("package", [_param(p) for p in packages()])
def test_a_package_docstring_names_exactly_its_modules(package: Path) -> None:
    have, said = members(package), named(package)
    assert said == have, (
        f"{package.relative_to(REPO)}: not named {sorted(have - said)}, "
        f"named but not there {sorted(said - have)}"
    )


def classes_defined_twice(root: Path) -> dict[str, list[str]]:
    """Class name -> the modules below ``root`` that define it at top level, for each
    name defined in more than one."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if is_generated(path.relative_to(root)):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found[node.name].append(path.relative_to(root).as_posix())
    return {name: where for name, where in found.items() if len(where) > 1}


def test_a_class_name_is_defined_once() -> None:
    assert classes_defined_twice(PACKAGE) == {}


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A package whose docstring misses a module, or names another, is told apart; a
    class name defined twice is found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""``alpha`` and ``gamma``."""\n', encoding="utf-8")
    (package / "alpha.py").write_text("class A:\n    pass\n", encoding="utf-8")
    (package / "beta.py").write_text("class A:\n    pass\n", encoding="utf-8")
    assert members(package) == {"alpha", "beta"} and named(package) == {"alpha", "gamma"}
    assert classes_defined_twice(tmp_path) == {"A": ["pkg/alpha.py", "pkg/beta.py"]}
