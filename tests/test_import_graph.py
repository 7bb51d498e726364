"""primekit's imports point one way: down the layers below, with no cycles anywhere: neither
among units (packages and top-level modules) nor among the modules inside one unit (the
trainer's rl.py and live.py once imported each other).

Every `import` and `from ... import` under primekit/ counts, wherever it sits (module level,
inside a function, under TYPE_CHECKING): a lazy import is still a dependency, it only moves the
failure from import time to the first call.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import primekit

# Each unit (a module, or a package with everything under it) and its layer. A unit may import
# its own layer and the layers below, never a higher one.
LAYERS: dict[str, int] = {
    # L0, base modules: anything may import them; they import only each other.
    "primekit": 0,  # the package root, __version__ only (matched exactly, not as a prefix)
    "primekit.config": 0,
    "primekit.distributed": 0,
    "primekit.logging": 0,
    "primekit.runtime": 0,
    # L1, bottom packages: L0 and each other, without package-level cycles.
    "primekit.algorithms": 1,
    "primekit.models": 1,
    "primekit.data": 1,
    "primekit.verifiers": 1,
    "primekit.rollout": 1,
    # L2: the trainer and the explicit reward models, neither of which imports the other.
    "primekit.trainer": 2,
    "primekit.reward_models": 2,
    # Checks of a run's inputs (model directories, data, device) before any model is loaded.
    "primekit.validate": 2,
    # L3, top: entry points, and the factory that hands the trainer its collaborators.
    "primekit.cli": 3,
    "primekit.demo": 3,
    "primekit.factory": 3,
    "primekit.plan": 3,
    # Experiments (arms x seeds of ordinary `primekit train` runs) sit beside the CLI.
    "primekit.experiment": 3,
    # The pages and plots (sim, dashboard, heatmap, rerank): may use anything below; nothing
    # below imports them.
    "primekit.viz": 3,
}

# Units held to less than their layer allows: the algorithms are pure tensor math on batches.
ONLY_IMPORTS: dict[str, tuple[str, ...]] = {
    "primekit.algorithms": ("primekit.algorithms", "primekit.rollout.base"),
}

# Pairs of units that must not import each other in either direction.
SEPARATE: list[tuple[str, str]] = [("primekit.trainer", "primekit.reward_models")]

ROOT = Path(primekit.__file__).parent


class Edge(NamedTuple):
    src: str  # importing module, e.g. "primekit.trainer.eval"
    dst: str  # imported module, e.g. "primekit.verifiers"
    where: str  # "primekit/trainer/eval.py:99"


def unit_of(module: str) -> str | None:
    """The LAYERS key that owns `module`: the root exactly, anything else by longest prefix."""
    if module == "primekit":
        return "primekit"
    owners = [u for u in LAYERS if u != "primekit" and (module == u or module.startswith(u + "."))]
    return max(owners, key=len) if owners else None


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, source: str, is_package: bool, known: Iterable[str],
               filename: str = "<string>") -> list[Edge]:
    """The primekit modules `source` (the text of `module`) imports, anywhere in the file.

    `from pkg import name` is an edge to pkg.name when that is a module (`from primekit import
    distributed`), else to pkg. Relative imports resolve against `module`'s package.
    """
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    edges = []
    nodes = (n for n in ast.walk(ast.parse(source, filename))
             if isinstance(n, ast.Import | ast.ImportFrom))
    # In file order, not ast.walk's breadth-first order, so messages read top to bottom.
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else base)
        # dict.fromkeys: `from m import a, b` is one edge to m, not two.
        for target in dict.fromkeys(targets):
            if target == "primekit" or target.startswith("primekit."):
                edges.append(Edge(module, target, f"{filename}:{node.lineno}"))
    return edges


def package_edges() -> list[Edge]:
    modules = package_modules()
    edges = []
    for name, path in modules.items():
        rel = str(path.relative_to(ROOT.parent))
        edges += imports_of(name, path.read_text(), path.name == "__init__.py", modules, rel)
    return edges


def _cycles(nodes: set[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def violations(edges: Iterable[Edge]) -> list[str]:
    """One line per offending edge (or cycle); empty when the imports point one way."""
    edges = list(edges)  # read twice: units, then modules
    problems = []
    unit_edges: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        src, dst = unit_of(e.src), unit_of(e.dst)
        if src is None or dst is None:
            missing = e.src if src is None else e.dst
            problems.append(f"unclassified module {missing} (add it to LAYERS): "
                            f"{e.src} -> {e.dst} at {e.where}")
            continue
        if src == dst:
            continue
        if LAYERS[src] < LAYERS[dst]:
            problems.append(f"upward import L{LAYERS[src]} -> L{LAYERS[dst]}: "
                            f"{e.src} -> {e.dst} at {e.where}")
        allowed = ONLY_IMPORTS.get(src)
        if allowed and not any(e.dst == a or e.dst.startswith(a + ".") for a in allowed):
            problems.append(f"{src} may import only {', '.join(allowed)}: "
                            f"{e.src} -> {e.dst} at {e.where}")
        if (src, dst) in SEPARATE or (dst, src) in SEPARATE:
            problems.append(f"{src} and {dst} must not import each other: "
                            f"{e.src} -> {e.dst} at {e.where}")
        unit_edges.setdefault((src, dst), []).append(e)
    for layer in sorted(set(LAYERS.values())):
        nodes = {u for u, lvl in LAYERS.items() if lvl == layer}
        for component in _cycles(nodes, _graph(unit_edges, nodes)):
            problems.append(f"import cycle among L{layer} units {', '.join(component)}: "
                            f"{_detail(unit_edges, set(component))}")
    # Module by module inside each unit (a package's __init__ is the module of its name). A cycle
    # through two units is already named above: as their cycle, or as an upward import.
    module_edges: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        if e.src != e.dst and unit_of(e.src) == unit_of(e.dst) is not None:
            module_edges.setdefault((e.src, e.dst), []).append(e)
    nodes = {m for pair in module_edges for m in pair}
    for component in _cycles(nodes, _graph(module_edges, nodes)):
        problems.append(f"import cycle among modules {', '.join(component)}: "
                        f"{_detail(module_edges, set(component))}")
    return problems


def _graph(pairs: Iterable[tuple[str, str]], nodes: set[str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst in pairs:
        if src in nodes and dst in nodes:
            graph.setdefault(src, set()).add(dst)
    return graph


def _detail(pair_edges: dict[tuple[str, str], list[Edge]], members: set[str]) -> str:
    """The edges of one cycle, sorted: "a -> b at file:line; ..."."""
    return "; ".join(f"{e.src} -> {e.dst} at {e.where}"
                     for (src, dst), es in sorted(pair_edges.items())
                     if src in members and dst in members for e in es)


# --- the package itself -------------------------------------------------------------------------


def test_every_module_has_a_layer():
    unclassified = [m for m in package_modules() if unit_of(m) is None]
    assert unclassified == [], f"add these modules to LAYERS in {__file__}: {unclassified}"


def test_imports_point_one_way():
    problems = violations(package_edges())
    assert problems == [], "imports that break the layering:\n  " + "\n  ".join(problems)


def test_parser_sees_lazy_imports_in_the_real_package():
    # evaluate_checkpoint imports the verifiers inside the function: it must still be an edge.
    edges = {(e.src, e.dst) for e in package_edges()}
    assert ("primekit.trainer.eval", "primekit.verifiers") in edges
    # `from primekit import distributed as dist` is an edge to the module, not the root.
    assert ("primekit.trainer.eval", "primekit.distributed") in edges
    assert ("primekit.trainer.eval", "primekit") not in edges


# --- the checker, on made-up code and graphs, so that it cannot pass by seeing nothing ----------


def test_imports_of_resolves_every_form():
    source = (
        "import primekit.models.hf\n"
        "import torch\n"
        "from primekit import config, runtime as rt\n"
        "from primekit.data import problem, Problem, load_splits\n"
        "from . import prompts\n"
        "from .problem import Problem\n"
        "from ..verifiers import build_verifier\n"
        "def f():\n"
        "    from primekit.trainer.rl import RLTrainer\n"
        "    if True:\n"
        "        import primekit.cli\n"
    )
    known = ["primekit", "primekit.config", "primekit.runtime", "primekit.data",
             "primekit.data.prompts", "primekit.data.problem", "primekit.models.hf",
             "primekit.verifiers", "primekit.trainer.rl", "primekit.cli"]
    edges = imports_of("primekit.data.splits", source, False, known, "splits.py")
    assert [(e.dst, e.where) for e in edges] == [
        ("primekit.models.hf", "splits.py:1"),
        ("primekit.config", "splits.py:3"),
        ("primekit.runtime", "splits.py:3"),
        ("primekit.data.problem", "splits.py:4"),  # a submodule by name...
        ("primekit.data", "splits.py:4"),  # ...and two names of the package: one edge
        ("primekit.data.prompts", "splits.py:5"),
        ("primekit.data.problem", "splits.py:6"),
        ("primekit.verifiers", "splits.py:7"),
        ("primekit.trainer.rl", "splits.py:9"),
        ("primekit.cli", "splits.py:11"),
    ]
    # In a package's __init__, "." is the package itself.
    init = imports_of("primekit.data", "from .problem import Problem\n", True, known)
    assert [e.dst for e in init] == ["primekit.data.problem"]


def test_checker_flags_an_upward_import():
    edges = [
        Edge("primekit.trainer.sft", "primekit.data.splits", "sft.py:1"),  # down: fine
        Edge("primekit.data.splits", "primekit.trainer.sft", "splits.py:7"),  # L1 -> L2
        Edge("primekit.runtime", "primekit.cli", "runtime.py:3"),  # L0 -> L3
    ]
    assert violations(edges) == [
        "upward import L1 -> L2: primekit.data.splits -> primekit.trainer.sft at splits.py:7",
        "upward import L0 -> L3: primekit.runtime -> primekit.cli at runtime.py:3",
    ]


def test_checker_flags_trainer_and_reward_models_both_ways():
    edges = [
        Edge("primekit.trainer.rl", "primekit.reward_models.dense", "rl.py:9"),
        Edge("primekit.reward_models.heads", "primekit.trainer.experience", "heads.py:18"),
    ]
    assert violations(edges) == [
        "primekit.trainer and primekit.reward_models must not import each other: "
        "primekit.trainer.rl -> primekit.reward_models.dense at rl.py:9",
        "primekit.reward_models and primekit.trainer must not import each other: "
        "primekit.reward_models.heads -> primekit.trainer.experience at heads.py:18",
        # Both ways at once is also a cycle, which the cycle check names as such.
        "import cycle among L2 units primekit.reward_models, primekit.trainer: "
        "primekit.reward_models.heads -> primekit.trainer.experience at heads.py:18; "
        "primekit.trainer.rl -> primekit.reward_models.dense at rl.py:9",
    ]


def test_checker_flags_algorithms_beyond_rollout_types():
    edges = [
        Edge("primekit.algorithms.groups", "primekit.rollout.base", "groups.py:1"),  # allowed
        Edge("primekit.algorithms.groups", "primekit.config", "groups.py:2"),
    ]
    assert violations(edges) == [
        "primekit.algorithms may import only primekit.algorithms, primekit.rollout.base: "
        "primekit.algorithms.groups -> primekit.config at groups.py:2",
    ]


def test_checker_flags_cycles_among_siblings():
    edges = [
        # The data <-> verifiers cycle this layering removed, through a third package.
        Edge("primekit.data.arithmetic", "primekit.verifiers.base", "arithmetic.py:29"),
        Edge("primekit.verifiers", "primekit.models.hf", "__init__.py:3"),
        Edge("primekit.models.hf", "primekit.data.problem", "hf.py:4"),
        Edge("primekit.rollout.hf", "primekit.models", "hf.py:1"),  # outside the cycle
        Edge("primekit.logging", "primekit.distributed", "logging.py:32"),
        Edge("primekit.distributed", "primekit.logging", "distributed.py:5"),
    ]
    assert violations(edges) == [
        "import cycle among L0 units primekit.distributed, primekit.logging: "
        "primekit.distributed -> primekit.logging at distributed.py:5; "
        "primekit.logging -> primekit.distributed at logging.py:32",
        "import cycle among L1 units primekit.data, primekit.models, primekit.verifiers: "
        "primekit.data.arithmetic -> primekit.verifiers.base at arithmetic.py:29; "
        "primekit.models.hf -> primekit.data.problem at hf.py:4; "
        "primekit.verifiers -> primekit.models.hf at __init__.py:3",
    ]


def test_checker_flags_cycles_between_modules_of_one_unit():
    edges = [
        # The trainer's circle before live mode left the trainer (main at 4595649): rl.py ran
        # the live step, live.py typed its argument as RLTrainer under TYPE_CHECKING.
        Edge("primekit.trainer.rl", "primekit.trainer.live", "primekit/trainer/rl.py:64"),
        Edge("primekit.trainer.live", "primekit.trainer.rl", "primekit/trainer/live.py:59"),
        # A package's __init__ and one of its modules, through a third module.
        Edge("primekit.viz", "primekit.viz.cli", "__init__.py:1"),
        Edge("primekit.viz.cli", "primekit.viz.sim", "cli.py:2"),
        Edge("primekit.viz.sim", "primekit.viz", "sim.py:3"),
        Edge("primekit.viz.dashboard", "primekit.viz.sim", "dashboard.py:4"),  # into it only
        Edge("primekit.trainer.live", "primekit.trainer.checkpoint", "live.py:5"),  # one way
    ]
    assert violations(edges) == [
        "import cycle among modules primekit.trainer.live, primekit.trainer.rl: "
        "primekit.trainer.live -> primekit.trainer.rl at primekit/trainer/live.py:59; "
        "primekit.trainer.rl -> primekit.trainer.live at primekit/trainer/rl.py:64",
        "import cycle among modules primekit.viz, primekit.viz.cli, primekit.viz.sim: "
        "primekit.viz -> primekit.viz.cli at __init__.py:1; "
        "primekit.viz.cli -> primekit.viz.sim at cli.py:2; "
        "primekit.viz.sim -> primekit.viz at sim.py:3",
    ]


def test_checker_flags_cycles_among_top_units():
    edges = [
        Edge("primekit.cli", "primekit.viz.cli", "cli.py:10"),
        Edge("primekit.viz.sim", "primekit.cli", "sim.py:20"),
    ]
    assert violations(edges) == [
        "import cycle among L3 units primekit.cli, primekit.viz: "
        "primekit.cli -> primekit.viz.cli at cli.py:10; primekit.viz.sim -> primekit.cli at sim.py:20",
    ]


def test_checker_flags_unclassified_modules_and_passes_a_clean_graph():
    assert violations([Edge("primekit.newthing", "primekit.config", "newthing.py:1")]) == [
        "unclassified module primekit.newthing (add it to LAYERS): "
        "primekit.newthing -> primekit.config at newthing.py:1",
    ]
    clean = [
        Edge("primekit.factory", "primekit.trainer.rl", "factory.py:1"),
        Edge("primekit.factory", "primekit.reward_models.dense", "factory.py:2"),
        Edge("primekit.reward_models.heads", "primekit.rollout.batching", "heads.py:17"),
        Edge("primekit.verifiers.arithmetic", "primekit.data.arithmetic", "arithmetic.py:11"),
        Edge("primekit.logging", "primekit.distributed", "logging.py:32"),
    ]
    assert violations(clean) == []
