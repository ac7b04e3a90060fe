"""The package's floors: transport imports nothing of ours; common imports only transport;
the scheduler and the server never load the worker (byteps.core); common, the launcher and
Ray's launcher never import the worker or the server, not even inside a function; no
module-level import circle; old import paths work."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from conftest import ROOT, job_env

# (what to import, prefixes of our modules it may load)
LAYERS = [
    ("byteps.transport, byteps.transport.wire, byteps.transport.shm",
     ("byteps.transport",)),
    ("byteps.common, byteps.common.errors, byteps.common.config, byteps.common.logs, "
     "byteps.common.node, byteps.common.metrics", ("byteps.transport", "byteps.common")),
    ("byteps.compression", ("byteps.compression",)),
    ("byteps.scheduler", ("byteps.scheduler", "byteps.common", "byteps.transport")),
    ("byteps.server", ("byteps.server", "byteps.common", "byteps.transport",
                       "byteps.compression")),
]


def _loaded(modules: str) -> list[str]:
    """Our modules (other than ``byteps`` itself) that importing ``modules`` loads, in a
    fresh interpreter."""
    code = (f"import sys, {modules}\nimport json\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('byteps.'))))")
    out = subprocess.run([sys.executable, "-c", code], env=job_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("modules,allowed", LAYERS, ids=[m.split(",")[0] for m, _ in LAYERS])
def test_layer_imports_only_what_is_below(modules, allowed):
    loaded = _loaded(modules)
    for want in modules.split(", "):
        assert want in loaded or want == "byteps", (want, loaded)
    above = [m for m in loaded if not m.startswith(allowed)]
    assert not above, (f"importing {modules} loads {above}; only modules under {allowed} "
                       f"may be imported at module level (import others inside functions)")


def test_scheduler_and_server_do_not_load_the_worker():
    loaded = _loaded("byteps.scheduler, byteps.server")
    assert "byteps.core.engine" not in loaded and "byteps.core.api" not in loaded, loaded
    assert not [m for m in loaded if m.startswith("byteps.core")], loaded


def test_old_import_paths():
    """byteps.core.config/node/logs/metrics are the byteps.common modules themselves;
    importing byteps.core loads no worker module, and its api names resolve on use."""
    code = """
import sys
import byteps.core as core
import byteps.common.config, byteps.common.node, byteps.common.logs, byteps.common.metrics
from byteps.core import config, node, logs, metrics
from byteps.core.config import Config, ConfigError
from byteps.core.node import BytePSError, SchedulerLink, PEER_FAILED_EXIT
from byteps.common import errors
assert config is byteps.common.config and node is byteps.common.node
assert logs is byteps.common.logs and metrics is byteps.common.metrics
assert ConfigError is errors.ConfigError and BytePSError is errors.BytePSError
assert "byteps.core.api" not in sys.modules and "byteps.core.engine" not in sys.modules
assert core.BytePSError is BytePSError and callable(core.push_pull)
assert "byteps.core.api" in sys.modules
try:
    core.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("byteps.core.no_such_name resolved")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], env=job_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---------------------------------------------------------------- no upward imports
# Floors that must never reach the worker (byteps.core) or the server (byteps.server), even
# inside a function: every role's floor (common), the launcher, and Ray's launcher.
LOW_FLOORS = ("byteps.common", "byteps.launcher", "byteps.ray", "byteps.runner")
ABOVE = ("byteps.core", "byteps.server")
PKG = ROOT / "byteps"


def _module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str) -> list[str]:
    """Every module of ``package`` (from its files: nothing is imported), ``__main__``s
    left out (importing one runs it)."""
    base = ROOT.joinpath(*package.split("."))
    return sorted(_module_name(p) for p in base.rglob("*.py") if p.stem != "__main__")


def _ray_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("ray") is not None


@pytest.mark.parametrize("package", LOW_FLOORS)
def test_low_floors_load_no_worker_and_no_server(package):
    """(a) Importing every module of the floor, in a fresh interpreter, loads no module of
    byteps.core or byteps.server."""
    if package == "byteps.ray" and not _ray_importable():
        pytest.skip("ray is not installed")
    loaded = _loaded(", ".join(_modules(package)))
    above = [m for m in loaded if m.startswith(ABOVE)]
    assert not above, f"importing the modules of {package} loads {above}"


def _imported_names(tree, module: str, is_package: bool):
    """(line, absolute module name) of every import in ``tree``, at any depth (inside
    functions too), relative ones resolved, plus importlib.import_module("...") /
    __import__("...") calls with a constant name."""
    pkg = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod
            for a in node.names:                   # from byteps import core
                yield node.lineno, f"{mod}.{a.name}"
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def _is_under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_low_floors_never_import_upward_even_inside_functions():
    """(b) No file of byteps/common, byteps/launcher or byteps/ray imports byteps.core or
    byteps.server anywhere (module level, functions, importlib calls)."""
    bad = []
    for floor in LOW_FLOORS:
        for path in sorted(ROOT.joinpath(*floor.split(".")).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            mod = _module_name(path)
            for line, name in _imported_names(tree, mod, path.stem == "__init__"):
                if _is_under(name, ABOVE):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


# ---------------------------------------------------------------- no import circles
def _module_level_imports(tree):
    """Import statements that run when the module is imported: module level, inside
    if/try/with/class bodies, not inside functions nor ``if TYPE_CHECKING:``."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, None) or [])


def import_graph() -> dict[str, set[str]]:
    """Our module -> our modules it imports at module level.  ``from a import b`` is an
    edge to ``a.b`` when that is a module, else to ``a``; the implicit import of a parent
    package is not an edge (a package that imports its own submodules is no circle)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in files.items():
        is_pkg = path.stem == "__init__"
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        edges = graph.setdefault(mod, set())
        for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in files else src
                           for a in node.names]
            for t in targets:
                if t.split(".")[0] == "byteps" and (k := known(t)) and k != mod:
                    edges.add(k)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest circle through the first module of ``comp`` (for the message)."""
    start, inside = comp[0], set(comp)
    prev: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start] if v != start else [start, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def test_the_import_graph_checker_finds_a_circle():
    """The checker itself: a two-module circle and a longer one are found, a chain is not."""
    g = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}, "x": set()}
    assert import_cycles(g) == [["a", "b"], ["c", "d", "e"]]
    assert _one_cycle(g, ["c", "d", "e"]) == ["c", "d", "e", "c"]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()              # module level only, submodules resolved
    assert "byteps.common.errors" in graph["byteps.common.node"]            # from x import y
    assert "byteps.transport.shm" in graph["byteps.common.shm_cleanup"]
    assert "byteps.core.local.reducer" not in graph["byteps.core.local"]     # in a function


def test_no_import_cycles():
    """(c) No module-level import circle anywhere in byteps/."""
    graph = import_graph()
    cycles = import_cycles(graph)
    text = "\n".join(f"{len(c)} modules: {' -> '.join(_one_cycle(graph, c))}\n  all: {c}"
                     for c in cycles)
    assert not cycles, f"{len(cycles)} import circle(s):\n{text}"
