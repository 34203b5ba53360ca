"""The architecture's rules, checked on the source (issue 14): the folders are the layers, imports point down,
no import cycle, benchmark code stays out of the product, and the decision path stays readable.

Every import counts -- module level, inside functions and under ``TYPE_CHECKING`` -- because each is a dependency
a reader has to follow, and a lazy import is how a cycle hides.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("autoscaler", "sharing", "forecasting")

# What each layer of autoscaler/ may import (besides itself, the standard library and third-party packages).
# ``sharing`` and ``forecasting`` are below every layer of autoscaler/ and may be imported by all of them.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "api": frozenset(),
    "accounting": frozenset({"api"}),
    "estimation": frozenset({"api"}),
    "policies": frozenset({"api", "estimation"}),
    "decision": frozenset({"api", "estimation", "policies"}),
    "sim": frozenset({"api", "accounting", "estimation", "policies", "decision"}),
    "report": frozenset({"api", "accounting", "estimation", "policies", "decision", "sim"}),
    "live": frozenset({"api", "accounting", "estimation", "policies", "decision", "report"}),
    "cli": frozenset({"api", "accounting", "estimation", "policies", "decision", "sim", "live", "report",
                      "benchmarks"}),
    "benchmarks": frozenset({"api", "accounting", "estimation", "policies", "decision", "sim", "report"}),
}
# Third-party clients of real systems: only the live adapters (and the CLI that loads their configuration).
IO_CLIENTS = ("kubernetes_asyncio", "aiohttp", "prometheus_client")
IO_LAYERS = frozenset({"live", "cli"})
# The decision path: pure code a newcomer reads to change a decision.
DECISION_PATH = ("autoscaler/api", "autoscaler/decision", "autoscaler/policies", "autoscaler/estimation", "sharing")
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 600
# A module over MAX_MODULE_LINES says why at the top of its docstring with this phrase.
WHY_ONE_MODULE = "one module"


def _modules() -> dict[str, Path]:
    out = {}
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(name: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in module ``name``, resolved to the longest known module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), node.lineno


def _graph() -> dict[str, set[str]]:
    return {name: {m for m, _ in _imports(name) if m in MODULES and m != name} for name in MODULES}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "autoscaler" and len(parts) > 1 and parts[1] in MAY_IMPORT else None


def test_every_layer_has_a_package_docstring() -> None:
    missing = [name for name, path in MODULES.items()
               if path.name == "__init__.py" and ast.get_docstring(_tree(path)) is None]
    assert not missing, f"packages without a docstring saying what they own: {missing}"


def test_no_import_cycle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongly_connected(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongly_connected(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongly_connected(v)
    # A package's __init__ re-exporting its own submodules is not a cycle a reader has to untangle.
    real = [c for c in cycles if not all(m.startswith(min(c, key=len) + ".") or m == min(c, key=len) for m in c)]
    assert not real, f"import cycles: {real}"


def test_sharing_and_forecasting_never_import_autoscaler() -> None:
    bad = [(name, m, line) for name in MODULES if name.split(".")[0] in ("sharing", "forecasting")
           for m, line in _imports(name) if m.split(".")[0] == "autoscaler"]
    assert not bad, bad


def test_layers_import_only_what_lies_below() -> None:
    bad = []
    for name in MODULES:
        layer = _layer(name)
        if layer is None:
            continue
        for m, line in _imports(name):
            target = _layer(m)
            if target is not None and target != layer and target not in MAY_IMPORT[layer]:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} ({layer}) imports {m} ({target})")
    assert not bad, "\n".join(bad)


def test_io_clients_only_in_the_live_adapters() -> None:
    bad = []
    for name in MODULES:
        layer = _layer(name)
        if layer in IO_LAYERS:
            continue
        for m, line in _imports(name):
            if m.split(".")[0] in IO_CLIENTS:
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {m}")
    assert not bad, "\n".join(bad)


def test_bench_scripts_do_not_import_the_cli() -> None:
    bad = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoscaler.cli"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert not bad, "\n".join(bad)


def _in_decision_path(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel.startswith(p + "/") for p in DECISION_PATH)


@pytest.mark.parametrize("name", sorted(n for n, p in MODULES.items() if _in_decision_path(p)))
def test_no_long_function_in_the_decision_path(name: str) -> None:
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(_tree(MODULES[name]))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_long_modules_say_why() -> None:
    silent = []
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        doc = ast.get_docstring(_tree(path)) or ""
        if lines > MAX_MODULE_LINES and WHY_ONE_MODULE not in doc.lower():
            silent.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not silent, f"modules over {MAX_MODULE_LINES} lines whose docstring does not say why: {silent}"


def test_tests_mirror_the_layout() -> None:
    """Each test folder is named after the package (or layer) it tests."""
    known = set(MAY_IMPORT) | {"sharing", "forecasting", "chart", "realparts"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= known, f"test folders that match no package: {sorted(folders - known)}"
    stray = [p.name for p in (ROOT / "tests").glob("test_*.py") if p.name != Path(__file__).name]
    assert not stray, f"tests outside a layer's folder: {stray}"
