"""The package's layering, checked from the source: dependencies point one way (model, hardware →
plan → engine → run → the rest; the command line → the use cases → the core), there are no import
cycles, and the planning core stays pure."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "moetune"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str], tree: ast.Module | None = None) -> set[str]:
    """Everything `name` imports (module level, in functions, under TYPE_CHECKING): internal modules
    by their dotted name (``from pkg import mod`` counts as ``pkg.mod``), external ones by their top name."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree or ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(mod)
    return {i if i.startswith("moetune") else i.split(".")[0] for i in out}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for i in _imports(name, path, known):
            while i.startswith("moetune") and i not in known:  # moetune.x.y.Thing -> moetune.x.y
                i = i.rsplit(".", 1)[0]
            if i in known and i != name:
                deps.add(i)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member, each as one cycle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []

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
                sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_through(graph, set(c)) for c in sccs]


def _path_through(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle inside a strongly connected component, for the failure message: a -> b -> a."""
    start = min(comp)
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start] if v != start else [start, start]
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return sorted(comp)


def _package(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2])


def _package_graph(graph: dict[str, set[str]], packages: Iterable[str]) -> dict[str, set[str]]:
    keep = {f"moetune.{p}" for p in packages}
    out: dict[str, set[str]] = {p: set() for p in keep}
    for mod, deps in graph.items():
        a = _package(mod)
        if a in keep:
            out[a].update(b for b in map(_package, deps) if b in keep and b != a)
    return out


def _under(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    return {m: d for m, d in graph.items() if m == package or m.startswith(package + ".")}


GRAPH = _graph()


def test_the_graph_sees_every_kind_of_import() -> None:
    assert "moetune.plan.ledger" in GRAPH["moetune.plan.plan"]  # from moetune.plan.ledger import ...
    assert "moetune.plan.placement" in GRAPH["moetune.plan.plan"]  # from moetune.plan import placement
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# every package but the command line and the use cases (app), which sit above them all
CORE_PACKAGES = (
    "kinds",
    "errors",
    "paths",
    "procfs",
    "model",
    "hardware",
    "plan",
    "engine",
    "run",
    "store",
    "monitor",
    "bench",
    "report",
    "cluster",
    "planfiles",
    "tune",
)


def test_no_cycles_between_core_packages() -> None:
    cycles = _cycles(_package_graph(GRAPH, CORE_PACKAGES))
    assert not cycles, "package cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["engine", "run", "bench", "cli", "store", "report", "cluster"])
def test_plan_does_not_import_the_layers_above_it(package: str) -> None:
    bad = {
        f"{m} imports {d}"
        for m, deps in _under(GRAPH, "moetune.plan").items()
        for d in deps
        if d == f"moetune.{package}" or d.startswith(f"moetune.{package}.")
    }
    assert not bad, "\n".join(sorted(bad))


@pytest.mark.parametrize("package", ["plan", "model"])
def test_core_imports_no_presentation_or_network_libraries(package: str) -> None:
    banned = {"click", "rich", "httpx", "aiohttp", "matplotlib"}
    bad = []
    for name, path in _modules().items():
        if name == f"moetune.{package}" or name.startswith(f"moetune.{package}."):
            bad += [f"{name} imports {i}" for i in _imports(name, path, set()) & banned]
    assert not bad, "\n".join(bad)


# the layers above the core: the command line calls the use cases, which call the core
SHELL = ("moetune.cli", "moetune.app")
ENTRY = {"moetune", "moetune.__main__"}  # `python -m moetune` and the package start the command line


def _in(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def test_the_core_imports_neither_the_use_cases_nor_the_command_line() -> None:
    bad = {
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if m not in ENTRY and not any(_in(m, s) for s in SHELL)
        for d in deps
        if any(_in(d, s) for s in SHELL)
    }
    assert not bad, "\n".join(sorted(bad))


def test_the_use_cases_do_not_import_the_command_line() -> None:
    bad = {
        f"{m} imports {d}" for m, deps in _under(GRAPH, "moetune.app").items() for d in deps if _in(d, "moetune.cli")
    }
    assert not bad, "\n".join(sorted(bad))


def test_the_use_cases_print_nothing() -> None:
    """No click or rich in app/: it returns results (and reports progress through callbacks); the
    command line renders them."""
    bad = []
    for name, path in _modules().items():
        if _in(name, "moetune.app"):
            bad += [f"{name} imports {i}" for i in _imports(name, path, set()) & {"click", "rich"}]
            bad += [f"{name}: print()" for n in ast.walk(ast.parse(path.read_text())) if _is_print(n)]
    assert not bad, "\n".join(bad)


def _is_print(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"


IMPURE = {
    "file I/O": r"\bopen\(|\.read_text\(|\.write_text\(|\.read_bytes\(|\.write_bytes\(",
    "processes": r"\bsubprocess\b",
    "sockets": r"\bsocket\b",
    "clocks": r"\btime\.(time|perf_counter|monotonic)\b|\bdatetime\.now\b",
}


@pytest.mark.parametrize("what", IMPURE)
def test_plan_does_no_io(what: str) -> None:
    rx = re.compile(IMPURE[what])
    bad = [
        f"{p.relative_to(SRC)}:{i}: {line.strip()}"
        for p in sorted((PKG / "plan").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if rx.search(line)
    ]
    assert not bad, f"{what} in the planning core:\n" + "\n".join(bad)


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """What a module imports when it is imported: its body, not function bodies or TYPE_CHECKING blocks."""

    def executed(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
        for n in nodes:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                yield from executed(n.orelse)
                continue
            yield n
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(n, field, None)
                if isinstance(inner, list):
                    yield from executed(inner)

    tree = ast.parse(path.read_text(), str(path))
    imports: list[ast.stmt] = [n for n in executed(tree.body) if isinstance(n, ast.Import | ast.ImportFrom)]
    return _imports(_module_name(path), path, known, ast.Module(body=imports, type_ignores=[]))


# the command modules that import little at module level (their options' defaults from
# moetune.option_defaults); cluster and model commands are not checked yet
THIN_COMMANDS = (
    "plan_cmds",
    "run_cmds",
    "engine_cmds",
    "doctor_cmds",
    "metrics_cmds",
    "record_cmds",
    "calibrate_cmds",
    "quant_cmds",
    "report_cmds",
    "quality_cmds",
    "bench_cmds",
    "results_cmds",
    "tune_cmds",
    "serve_cmds",
)
LIGHT = {
    "moetune.cli.common",
    "moetune.cli.progress",
    "moetune.cli.session_opts",
    "moetune.errors",
    "moetune.kinds",
    "moetune.engine.install",
    "moetune.option_defaults",
}


@pytest.mark.parametrize("name", THIN_COMMANDS)
def test_command_modules_import_the_core_where_they_use_it(name: str) -> None:
    """Importing a command module (to build `--help`) loads no heavy library and little of moetune."""
    mods = _modules()
    top = _top_level_imports(mods[f"moetune.cli.{name}"], set(mods))
    heavy = top & {"rich", "pydantic", "numpy", "yaml", "httpx", "aiohttp", "matplotlib", "gguf"}
    assert not heavy, f"moetune.cli.{name} imports {sorted(heavy)} at module level"
    internal = {i for i in top if i.startswith("moetune")} - LIGHT
    assert not internal, f"moetune.cli.{name} imports {sorted(internal)} at module level"


@pytest.mark.parametrize("name", THIN_COMMANDS)
def test_command_modules_do_not_import_each_other(name: str) -> None:
    """What commands share lives in a shared module (common, progress, session_opts), not in a command."""
    others = {d for d in GRAPH[f"moetune.cli.{name}"] if re.fullmatch(r"moetune\.cli\.\w+_cmds", d)}
    assert not others, f"moetune.cli.{name} imports {sorted(others)}"


def test_every_use_case_is_called_by_a_command() -> None:
    """app/ is the command line's: each use case module is imported by a cli module."""
    cli = {d for m, deps in _under(GRAPH, "moetune.cli").items() for d in deps}
    cases = {m for m in _under(GRAPH, "moetune.app") if m not in ("moetune.app", "moetune.app.progress")}
    assert cases and not cases - cli, f"use cases no command calls: {sorted(cases - cli)}"
