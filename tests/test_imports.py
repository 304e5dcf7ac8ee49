"""No import circles in specdec: every module's imports, read with `ast`, form a graph without cycles.

Every import counts, wherever it is written: at the top of a module, under
`if TYPE_CHECKING:`, or inside a function. A circle hidden in a function is
still a circle between two modules (each needs the other), only one that fails
later, at the first call, instead of at import time.
An import of the package itself (`from ..drafters import make_drafter`) counts as
an edge to its `__init__.py`; a parent package being run first is Python's doing
and is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the modules of the package under `root` it imports}, from every import statement in every file."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: level 1 is this package, 2 its parent, ...
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:  # `from . import x` imports the module x; `from .m import f` the module m
                    sub = f"{source}.{alias.name}"
                    if sub in paths:
                        graph[name].add(sub)
                    elif source in paths:
                        graph[name].add(source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None: depth-first search, a back edge closes a cycle."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all it reaches is searched
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_specdec_has_no_import_circle():
    graph = import_graph(ROOT)
    assert (
        "specdec.model.gpt2" in graph and "specdec.model.base" in graph["specdec.model.gpt2"]
    )  # the walk sees imports
    assert "specdec.checkpoints.hf_llama" in graph["specdec.checkpoints.load"]  # `from .m import f`
    assert "specdec.checkpoints.registry" in graph["specdec.checkpoints.load"]  # `from . import m`
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_a_planted_circle_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from ..b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    assert find_cycle(import_graph(pkg)) is None
    # b now imports a inside a function: a circle all the same (pkg.sub.a -> pkg.b -> pkg.sub.a)
    (pkg / "b.py").write_text("def g():\n    from .sub import a\n    return a\n")
    cycle = find_cycle(import_graph(pkg))
    assert cycle is not None and cycle[0] == cycle[-1] and {"pkg.sub.a", "pkg.b"} <= set(cycle), cycle
    # under TYPE_CHECKING too
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.a import f\n")
    assert find_cycle(import_graph(pkg)) is not None


def test_the_circles_this_test_guards_against_were_real():
    """Circles of the kinds that existed: a loader and the reader it dispatches to, each importing the other;
    a model and its cache; the shared head code and the heads built on it."""
    for module, planted in [
        ("specdec.checkpoints.hf_llama", "specdec.checkpoints.load"),
        ("specdec.model.attention", "specdec.model.gpt2"),
        ("specdec.drafters.heads", "specdec.drafters.eagle"),
    ]:
        graph = import_graph(ROOT)
        assert find_cycle(graph) is None
        graph[module] = graph[module] | {planted}
        assert find_cycle(graph) is not None, (module, planted)


# The checkpoint readers, each turning one kind of file into a model, and the dispatcher that chooses one.
READERS = ("gpt2_folder", "hf_llama", "gguf", "wheel", "draft")


def reader_violations(graph: dict[str, set[str]]) -> list[str]:
    """A reader that imports the dispatcher or another reader: they are peers behind load.load_model."""
    readers = {f"specdec.checkpoints.{r}" for r in READERS}
    return sorted(f"{r} imports {m}" for r in readers for m in graph[r] if m in readers | {"specdec.checkpoints.load"})


def test_the_checkpoint_readers_are_peers_behind_one_dispatcher():
    graph = import_graph(ROOT)
    assert readers_of(graph) == {f"specdec.checkpoints.{r}" for r in READERS}  # load.py reaches each of them
    assert reader_violations(graph) == []
    graph["specdec.checkpoints.gguf"] = graph["specdec.checkpoints.gguf"] | {"specdec.checkpoints.hf_llama"}
    assert reader_violations(graph) == ["specdec.checkpoints.gguf imports specdec.checkpoints.hf_llama"]


def readers_of(graph: dict[str, set[str]]) -> set[str]:
    return {m for m in graph["specdec.checkpoints.load"] if m.removeprefix("specdec.checkpoints.") in READERS}


# What each layer may import besides itself (each subpackage's __init__.py says so in words).
ROUND_RULES = {"specdec.interfaces", "specdec.sampling", "specdec.verify"}
ROUND = {
    "specdec.speculative",
    "specdec.autoregressive",
    "specdec.batch",
    "specdec.config",
    "specdec.result",
    "specdec.timing",
    "specdec.costmodel",
} | ROUND_RULES
FILES = "safe_io"  # the one way to write and to read a file (specdec/safe_io/): imports nothing of specdec
MAY_IMPORT = {
    "model": {FILES},
    "checkpoints": {"model", FILES},
    "drafters": {"model", "checkpoints", "specdec.costmodel", FILES} | ROUND_RULES,
    # train/ takes the strict flag parser (cli/flags.py) and nothing else of the command line
    "train": {
        "model",
        "checkpoints",
        "drafters",
        "specdec.autoregressive",
        "specdec.config",
        "specdec.sampling",
        "cli",
        FILES,
    },
    FILES: set(),
    "race": {"model", "checkpoints", "drafters"} | ROUND,
    "specdec.verify": {"specdec.interfaces", "specdec.sampling"},
    "specdec.costmodel": {"specdec.interfaces", "specdec.verify"},
}
SUBPACKAGES = ("model", "checkpoints", "drafters", "train", "bench", "cli", "race", "safe_io")


def layer(module: str) -> str:
    """'model' for specdec.model.gpt2, ...; a top-level module or package itself (specdec.verify for
    specdec.verify.trees)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    return ".".join(parts[:2])


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imported in graph.items():
        allowed = MAY_IMPORT.get(layer(module))
        if allowed is None:
            continue
        bad += [f"{module} imports {m}" for m in imported if layer(m) != layer(module) and layer(m) not in allowed]
    bad += [f"{m} imports {b}" for m, bs in graph.items() for b in bs if layer(b) == "bench" and layer(m) != "bench"]
    return sorted(bad)


def test_imports_run_down_the_layers():
    graph = import_graph(ROOT)
    assert layer_violations(graph) == []
    graph["specdec.model.attention"] = graph["specdec.model.attention"] | {
        "specdec.checkpoints.hub"
    }  # planted: up a layer
    assert layer_violations(graph) == ["specdec.model.attention imports specdec.checkpoints.hub"]


def test_each_subpackage_says_what_it_is_and_may_import():
    inits = [p for p in sorted(ROOT.rglob("__init__.py")) if p.parent != ROOT]
    assert {ROOT / name / "__init__.py" for name in SUBPACKAGES} <= set(inits)
    for init in inits:
        doc = ast.get_docstring(ast.parse(init.read_text()))
        where = init.relative_to(ROOT.parent)
        assert doc and "may import" in doc.lower(), f"{where}: a docstring saying what it may import"
