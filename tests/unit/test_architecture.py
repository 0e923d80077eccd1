"""The layout rules of docs/architecture.md, checked from the source so they stay true.

* Roles talk over the wire only: ``router/`` imports neither ``shard/`` nor ``configsvr/``;
  ``shard/`` imports neither ``router/`` nor ``configsvr/``; ``configsvr/`` may build on the shard's
  node (a config server is a mongod) but never imports ``router/``.
* The shared core ``shardsim/`` imports no role, except the tools that start roles inside the
  calling process (the in-process test kit, ``shardsim/testing``).
* Small pieces: no production function longer than 150 lines, no production module longer than
  800 lines.

Every import counts, also one inside a function (that is where cross-role imports used to hide).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = ("router", "shard", "configsvr")
PACKAGES = ROLES + ("shardsim",)
# package -> top-level packages it must not import
FORBIDDEN = {
    "router": {"shard", "configsvr"},
    "shard": {"router", "configsvr"},
    "configsvr": {"router"},
    "shardsim": {"router", "shard", "configsvr"},
}
# Core modules allowed to import roles: they run roles in the caller's process.
CORE_MAY_IMPORT_ROLES = ("shardsim/testing/",)
MAX_FUNCTION_LINES = 150
MAX_MODULE_LINES = 800


def _sources(package: str) -> list[pathlib.Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported_top_levels(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_crosses_roles(package):
    bad = []
    for path in _sources(package):
        rel = _rel(path)
        if package == "shardsim" and rel.startswith(CORE_MAY_IMPORT_ROLES):
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        bad += [f"{rel}:{line} imports {top}" for line, top in _imported_top_levels(tree)
                if top in FORBIDDEN[package]]
    assert not bad, "imports across roles (see docs/architecture.md):\n" + "\n".join(bad)


def test_the_rule_checker_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from shard.storage import id_key\n    import router.node\n")
    assert [top for _, top in _imported_top_levels(tree)] == ["shard", "router"]


@pytest.mark.parametrize("package", PACKAGES)
def test_functions_and_modules_are_small(package):
    long_funcs, long_mods = [], []
    for path in _sources(package):
        rel = _rel(path)
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_mods.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_funcs.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not long_mods, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long_mods)
    assert not long_funcs, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long_funcs)
