"""The layout rules of docs/architecture.md, checked from the source so they stay true.

The floors, bottom up, each a folder (no exception list):

* ``shardsim/core/`` imports nothing of shardsim outside itself;
* the roles talk over the wire only: ``router/`` (``shardsim.router``) and ``shard/``
  (``shardsim.shard``) import the core and themselves; ``configsvr/`` may also build on the
  shard's node (a config server is a mongod);
* ``shardsim/testing/`` (the in-process test kit) is the one place that runs roles in-process:
  core, roles and itself;
* ``shardsim/tools/`` starts roles as processes and never imports them: core, testing, itself.

Installed, the roles are ``shardsim.router`` etc.; a bare ``import router`` would be a bug.
Small pieces: no production function longer than 150 lines, no module longer than 800 lines.
Every import counts, also one inside a function (that is where cross-role imports used to hide).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# floor folder -> the shardsim packages (second dotted component) it may import
FLOORS = {
    "shardsim/core": {"core"},
    "shard": {"core", "shard"},
    "router": {"core", "router"},
    "configsvr": {"core", "shard", "configsvr"},
    "shardsim/testing": {"core", "shard", "router", "configsvr", "testing"},
    "shardsim/tools": {"core", "testing", "tools"},
}
ROLES = ("router", "shard", "configsvr")
MAX_FUNCTION_LINES = 150
MAX_MODULE_LINES = 800


def _sources(folder: str) -> list[pathlib.Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import, inside functions too."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "shardsim":
                found += [(node.lineno, f"shardsim.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def _violations(folder: str, tree: ast.AST, rel: str) -> list[str]:
    bad = []
    for line, module in _imports(tree):
        parts = module.split(".")
        if parts[0] in ROLES:
            bad.append(f"{rel}:{line} imports {module} (roles are shardsim.{parts[0]})")
        elif parts[0] == "shardsim" and len(parts) > 1 and parts[1] not in FLOORS[folder]:
            bad.append(f"{rel}:{line} imports {module}")
    return bad


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_package_file_is_on_a_floor():
    """Nothing of shardsim lives outside the floors (a new top-level module would escape the rules)."""
    loose = [_rel(p) for p in (ROOT / "shardsim").glob("*.py") if p.name != "__init__.py"]
    folders = {_rel(p) for p in (ROOT / "shardsim").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not loose, f"modules outside a floor: {loose}"
    assert folders <= set(FLOORS), f"unknown folders: {folders - set(FLOORS)}"


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_each_floor_imports_only_what_it_may(folder):
    bad = []
    for path in _sources(folder):
        rel = _rel(path)
        bad += _violations(folder, ast.parse(path.read_text(), filename=rel), rel)
    assert not bad, "imports across floors (see docs/architecture.md):\n" + "\n".join(bad)


def test_the_rule_checker_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from shardsim.shard.storage import id_key\n    import shardsim.router.node\n"
                     "    from shardsim import tools\n    import router\n")
    assert [m for _, m in _imports(tree)] == ["shardsim.shard.storage", "shardsim.router.node",
                                                "shardsim.tools", "router"]
    assert len(_violations("shardsim/core", tree, "x.py")) == 4
    assert len(_violations("configsvr", tree, "x.py")) == 3


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_functions_and_modules_are_small(folder):
    long_funcs, long_mods = [], []
    for path in _sources(folder):
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


def test_production_code_reads_node_attributes_directly():
    """No ``getattr(node, "x", None)`` in production code: a node declares every attribute it
    has (role code, and the protocols naming what a part uses of a node, e.g.
    ``shard/change_stream/host.py``), so a missing one is a bug, not a default."""
    bad = []
    for folder in FLOORS:
        if folder == "shardsim/testing":
            continue
        for path in _sources(folder):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if "getattr(node," in line or "getattr(self.node," in line or \
                        "hasattr(node," in line or "hasattr(self.node," in line:
                    bad.append(f"{_rel(path)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
