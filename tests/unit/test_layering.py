"""Layers only look down, placement talks to no node, and no import cycle, lazy imports included.

Every module under verl_cluster/ is parsed with `ast`; every `import` counts, at module level and inside
functions. The layers, lowest first (docs/architecture.md draws them):

    errors, enums     typed exceptions, StrEnum for every Python we support, the terminal sanitizer; vc_hooks
                      (run in Ray's workers: imports nothing of ours)
    config            cluster.yaml / job YAML -> frozen specs
    runners           the transports: a command run locally or over SSH
    slurm             the allocation, its job-step runner, the batch script
    launchers         the one launcher a cluster's config names: its runner, how Ray is started and held there
    facts             what a node has, as data (and the node-side NVML reader)
    nodes             the node agent: our Ray on a node (probe, kill, start, GCS), the cluster token and auth env
    diagnostics       what is wrong with the nodes; gathering their facts
    lifecycle         starting, healing and stopping Ray there
    placement         pure: facts in, plan out
    records, verl_scripts, testdata, reshard
                      what this machine remembers; verl scripts read as jobs; test data makers; checkpoints for
                      another world size
    jobs              the job launchers: Ray Jobs API and torchrun, the requests they take
    submit            the submit pipeline: preflight, plan, request
    verl_logs         reading verl's logs: steps, lengths, ETA, failures
    job_list          `jobs`: every cluster's jobs, each planned job's predicted vs measured
    watch             a long run's loop over attempts
    cli               parse, call the library, print

A module may import from its own layer or a lower one, and no two packages import each other (a package-level
cycle hides behind function-level imports even when every file-level import looks down). Imports under `if TYPE_CHECKING:` never run, so they
do not make a cycle; they still must look down (a type from a higher layer is a dependency on it).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "verl_cluster"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("verl_cluster", "verl_cluster.errors", "verl_cluster.enums", "verl_cluster.terminal_text",
                "verl_cluster.vc_hooks")),
    ("config", ("verl_cluster.config",)),
    ("runners", ("verl_cluster.runners",)),
    ("slurm", ("verl_cluster.slurm",)),
    ("launchers", ("verl_cluster.launchers",)),
    ("facts", ("verl_cluster.facts",)),
    ("nodes", ("verl_cluster.nodes",)),
    ("diagnostics", ("verl_cluster.diagnostics",)),
    ("lifecycle", ("verl_cluster.lifecycle",)),
    ("placement", ("verl_cluster.placement",)),
    ("records/verl_scripts/testdata/reshard", ("verl_cluster.records", "verl_cluster.verl_scripts",
                                               "verl_cluster.testdata", "verl_cluster.reshard")),
    ("jobs", ("verl_cluster.jobs",)),
    ("submit", ("verl_cluster.submit",)),
    ("verl_logs", ("verl_cluster.verl_logs",)),
    ("job_list", ("verl_cluster.job_list",)),
    ("watch", ("verl_cluster.watch",)),
    ("cli", ("verl_cluster.cli", "verl_cluster.__main__")),
]

PLACEMENT = [name for name, _ in LAYERS].index("placement")

# placement plans from facts it is given: nothing it imports, directly or through others, reaches a node
TALKS_TO_NODES = ("verl_cluster.runners", "verl_cluster.slurm", "verl_cluster.launchers", "verl_cluster.diagnostics",
                  "verl_cluster.lifecycle", "verl_cluster.diagnostics.cluster_facts")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool  # inside a function (runs when called, not when the module is imported)
    typing_only: bool  # under `if TYPE_CHECKING:`

    def where(self) -> str:
        kind = "type-only " if self.typing_only else ("function-level " if self.lazy else "")
        return f"{self.source} -> {self.target} ({kind}import, {module_path(self.source)}:{self.line})"


def module_names() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = module_names()


def module_path(name: str) -> str:
    return str(MODULES[name].relative_to(ROOT))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The verl_cluster modules an import statement loads (`from pkg import submodule` is the submodule)."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".")
            if MODULES[name].name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        wanted = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names]
    found = []
    for target in wanted:
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in MODULES and target != name and target not in found:
            found.append(target)
    return found


def imports_of(name: str) -> list[Edge]:
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    edges: list[Edge] = []

    def walk(node: ast.AST, lazy: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                edges.extend(Edge(name, t, child.lineno, lazy, typing_only) for t in _targets(name, child))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    walk(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]), lazy, typing_only)
            else:
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                walk(child, inner, typing_only)

    walk(tree, False, False)
    return edges


def all_edges() -> list[Edge]:
    return [edge for name in MODULES for edge in imports_of(name)]


def layer_of(name: str) -> int | None:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            hit = name == prefix or (prefix != "verl_cluster" and name.startswith(prefix + "."))
            if hit and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def upward_imports(edges: list[Edge]) -> list[str]:
    return [f"{e.where()}: layer {LAYERS[layer_of(e.source)][0]!r} imports layer {LAYERS[layer_of(e.target)][0]!r}"
            for e in edges if layer_of(e.target) > layer_of(e.source)]


def import_cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), runtime imports only, each as one cycle through it."""
    graph: dict[str, list[Edge]] = {name: [] for name in MODULES}
    for e in edges:
        if not e.typing_only:
            graph[e.source].append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.target not in index:
                visit(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for name in sorted(MODULES):
        if name not in index:
            visit(name)
    return [_one_cycle(sorted(g)[0], set(g), graph) for g in groups]


def _one_cycle(start: str, group: set[str], graph: dict[str, list[Edge]]) -> list[str]:
    """A shortest way from `start` back to itself inside its group, as the edges that make it."""
    paths = {start: []}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for e in graph[v]:
            if e.target == start:
                return [x.where() for x in paths[v] + [e]]
            if e.target in group and e.target not in paths:
                paths[e.target] = paths[v] + [e]
                todo.append(e.target)
    raise AssertionError(f"no cycle through {start}")


def package_of(name: str) -> str:
    """verl_cluster.X for a module of package X (a top-level module is its own: verl_cluster.errors)."""
    return ".".join(name.split(".")[:2])


def package_cycles(edges: list[Edge]) -> list[str]:
    """Pairs of packages that import each other at run time (directly or through a third), one line each."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        a, b = package_of(e.source), package_of(e.target)
        if a != b and not e.typing_only:
            graph.setdefault(a, {}).setdefault(b, e)

    def path(a: str, b: str) -> list[Edge] | None:
        seen, todo = {a: []}, [a]
        while todo:
            v = todo.pop(0)
            for w, e in graph.get(v, {}).items():
                if w not in seen:
                    seen[w] = seen[v] + [e]
                    todo.append(w)
        return seen.get(b)

    found = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            back = path(b, a)
            if back is not None and a < b:
                found.append(f"{a} <-> {b}: " + " / ".join(x.where() for x in [graph[a][b]] + back))
    return found


def reaches(start: str, edges: list[Edge]) -> dict[str, list[Edge]]:
    """Every module `start` loads at run time, directly or through others, with the chain of imports to it."""
    graph: dict[str, list[Edge]] = {}
    for e in edges:
        if not e.typing_only:
            graph.setdefault(e.source, []).append(e)
    chains: dict[str, list[Edge]] = {start: []}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for e in graph.get(v, []):
            if e.target not in chains:
                chains[e.target] = chains[v] + [e]
                todo.append(e.target)
    return chains


def test_every_module_has_a_layer():
    assert len(MODULES) > 50
    missing = [name for name in MODULES if layer_of(name) is None]
    assert not missing, f"modules in no layer (add them to LAYERS and docs/architecture.md): {missing}"


def test_imports_only_look_down():
    up = upward_imports(all_edges())
    assert not up, "imports from a higher layer:\n" + "\n".join(up)


def test_no_import_cycles():
    cycles = import_cycles(all_edges())
    assert not cycles, "import cycles:\n" + "\n\n".join("\n".join(c) for c in cycles)


def test_no_package_cycles():
    cycles = package_cycles(all_edges())
    assert not cycles, "packages that import each other:\n" + "\n".join(cycles)


def test_placement_reaches_no_node():
    edges = all_edges()
    bad = []
    for name in MODULES:
        if layer_of(name) != PLACEMENT:
            continue
        for target, chain in reaches(name, edges).items():  # nearest first: one line per placement module
            if any(target == p or target.startswith(p + ".") for p in TALKS_TO_NODES):
                bad.append(f"{name} reaches {target}: " + " / ".join(e.where() for e in chain))
                break
    assert not bad, "placement must plan from facts it is given:\n" + "\n".join(bad)


def test_the_checker_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The rules above pass only if the parser finds imports; a module tree with one of each kind proves it does."""
    pkg = tmp_path / "verl_cluster"
    for rel, text in {
        "__init__.py": "",
        "errors.py": "",
        "config/__init__.py": "",
        "config/a.py": "from verl_cluster.errors import X\n",
        "placement/__init__.py": "from .plan import plan\n",
        "placement/plan.py": "from verl_cluster.placement import memory as mem\ndef f():\n    from . import hw\n",
        "placement/memory.py": "",
        "placement/hw.py": "def g():\n    import verl_cluster.placement.plan\n",
        "watch/__init__.py": "",
        "watch/w.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verl_cluster.cli import c\n",
        "cli/__init__.py": "",
        "cli/c.py": "",
        "runners/__init__.py": "",
        "runners/r.py": "def h():\n    from verl_cluster.config import a\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ROOT", tmp_path)
    monkeypatch.setattr(here, "PACKAGE", pkg)
    monkeypatch.setattr(here, "MODULES", module_names())
    edges = all_edges()
    got = {(e.source, e.target, e.lazy, e.typing_only) for e in edges}
    assert got == {
        ("verl_cluster.config.a", "verl_cluster.errors", False, False),
        ("verl_cluster.placement", "verl_cluster.placement.plan", False, False),
        ("verl_cluster.placement.plan", "verl_cluster.placement.memory", False, False),
        ("verl_cluster.placement.plan", "verl_cluster.placement.hw", True, False),
        ("verl_cluster.placement.hw", "verl_cluster.placement.plan", True, False),
        ("verl_cluster.watch.w", "verl_cluster.cli.c", False, True),
        ("verl_cluster.runners.r", "verl_cluster.config.a", True, False),
    }
    # config.a -> errors and runners.r -> config.a look fine file by file; config <-> runners needs a way back:
    assert package_cycles(edges) == []
    (pkg / "config" / "a.py").write_text("from verl_cluster.errors import X\nfrom verl_cluster.runners import r\n")
    [both] = package_cycles(all_edges())
    assert both.startswith("verl_cluster.config <-> verl_cluster.runners: verl_cluster.config.a -> verl_cluster.runners.r")
    (pkg / "config" / "a.py").write_text("from verl_cluster.errors import X\n")
    edges = all_edges()
    [cycle] = import_cycles(edges)
    assert len(cycle) == 2 and "function-level" in cycle[0]
    [up] = upward_imports(edges)
    assert up.startswith("verl_cluster.watch.w -> verl_cluster.cli.c (type-only import")
