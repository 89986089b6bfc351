"""Every module imports on its own, the package's import graph has no cycle, and no module
imports another module's private (_underscore) names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# where each import package lives in the source tree (pyproject's package-dir)
PACKAGE_DIRS = {
    "draftsmith": "draftsmith",
    "draftsmith.kinds": "draftsmith/kinds",
    "draftsmith.kinds.independent": "draftsmith/kinds/independent",
    "draftsmith.kinds.eagle3": "draftsmith/kinds/eagle3",
    "draftsmith.data": "data",
    "draftsmith.distill": "distill",
    "draftsmith.evaluate": "evaluate",
}


def source_modules(root: Path = REPO) -> dict[str, Path]:
    """{module name: file} for every module of the draftsmith distribution under `root`."""
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((root / folder).glob("*.py")):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def type_only_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`: never run, so never in a cycle."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imported_names(path: Path) -> list[tuple[str, str | None]]:
    """(module, name or None) for every absolute import in the file that runs, nested (lazy)
    ones included, `if TYPE_CHECKING:` ones not."""
    out = []
    tree = ast.parse(path.read_text())
    skip = type_only_imports(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, alias.name) for alias in node.names]
    return out


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """{module: the draftsmith modules it imports}, function-level (lazy) imports included."""
    modules = source_modules(root)
    graph = {}
    for name, path in modules.items():
        edges = set()
        for module, attr in imported_names(path):
            if attr is not None and f"{module}.{attr}" in modules:
                edges.add(f"{module}.{attr}")  # `from draftsmith.evaluate import metrics`
            elif module in modules:
                edges.add(module)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": set(), "p": {"q"}, "q": {"p"}}) == ["p", "q", "p"]


def test_import_graph_sees_lazy_imports_and_submodule_imports(tmp_path):
    (tmp_path / "draftsmith").mkdir()
    for folder in ("data", "distill", "evaluate"):
        (tmp_path / folder).mkdir()
    (tmp_path / "draftsmith" / "cli.py").write_text(
        "def f():\n    from draftsmith.pipeline import run\n"
    )
    (tmp_path / "draftsmith" / "pipeline.py").write_text("from draftsmith import cli\n")
    (tmp_path / "evaluate" / "stage.py").write_text("from draftsmith.evaluate import metrics\n")
    (tmp_path / "evaluate" / "metrics.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from draftsmith import cli\n"
        "else:\n    from draftsmith.evaluate import stage\n"
    )
    graph = import_graph(tmp_path)
    # the type-only import is not an edge; the `else:` branch runs, so it is
    assert graph["draftsmith.evaluate.metrics"] == {"draftsmith.evaluate.stage"}
    assert graph["draftsmith.cli"] == {"draftsmith.pipeline"}
    assert graph["draftsmith.pipeline"] == {"draftsmith.cli"}
    assert graph["draftsmith.evaluate.stage"] == {"draftsmith.evaluate.metrics"}
    assert find_cycle(graph) == ["draftsmith.cli", "draftsmith.pipeline", "draftsmith.cli"]


def test_package_has_no_import_cycle():
    graph = import_graph()
    # the modules the cycle check must see, and the edges that once closed cycles
    assert {"draftsmith.cli", "draftsmith.pipeline", "draftsmith.evaluate.vllm_backend"} <= set(
        graph
    )
    assert "draftsmith.pipeline" in graph["draftsmith.cli"]
    assert "draftsmith.evaluate.vllm_backend" in graph["draftsmith.evaluate.stage"]
    assert find_cycle(graph) is None


def test_no_private_names_imported_across_modules():
    offenders = []
    files = list(source_modules().values()) + sorted((REPO / "scripts").glob("*.py"))
    for path in files:
        for module, attr in imported_names(path):
            private = attr and attr.startswith("_") and not attr.startswith("__")
            if module.startswith("draftsmith") and private:
                offenders.append(f"{path.relative_to(REPO)}: from {module} import {attr}")
    assert offenders == []


def test_every_module_imports_in_a_fresh_interpreter():
    """All modules in one new process, from a neutral directory: each one imports, and what
    lands in sys.modules under draftsmith is exactly the source tree's modules."""
    names = sorted(source_modules())
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'draftsmith'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == names


STAGE_ORDER = ("draftsmith.data", "draftsmith.distill", "draftsmith.evaluate")


def later_stage_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every module of a stage that imports a module of a later stage (data
    flows one way; what two stages share lives in draftsmith/)."""

    def stage(module: str) -> int | None:
        hits = [i for i, s in enumerate(STAGE_ORDER) if module == s or module.startswith(s + ".")]
        return hits[0] if hits else None

    out = []
    for module, edges in sorted(graph.items()):
        here = stage(module)
        for target in sorted(edges):
            there = stage(target)
            if here is not None and there is not None and there > here:
                out.append(f"{module} -> {target}")
    return out


def test_later_stage_imports_are_found_on_a_hand_made_graph():
    graph = {
        "draftsmith.data.generate": {"draftsmith.evaluate.timing", "draftsmith.clock"},
        "draftsmith.evaluate.stage": {"draftsmith.data.prepare"},
        "draftsmith.distill.train": {"draftsmith.distill.losses"},
    }
    assert later_stage_imports(graph) == ["draftsmith.data.generate -> draftsmith.evaluate.timing"]


def test_no_stage_imports_a_later_stage():
    """generate once imported evaluate's timing, cache and hardware helpers; they live in
    draftsmith/ (clock, fast_linear, io, models) now."""
    assert later_stage_imports(import_graph()) == []
