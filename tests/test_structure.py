"""The shape of `src/`: its import graph has no cycle, and the runtime imports no tool.

The graph is read with `ast` from the source (nothing is imported): an edge A -> B for every
``import B`` and ``from B import name`` anywhere in module A, at top level or inside a function
(a lazy import still ties the two modules together); ``from B import name`` where ``B.name`` is
a module is an edge to ``B.name``. Only modules under `src/` are nodes; an import of a package
is an edge to its ``__init__``. The implicit import of a parent package (importing ``a.b.c``
runs ``a/__init__.py``) is not an edge, as in the usual cycle checkers.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
RUNTIME = "speculant"
TOOLS = ("speculant_tools", "speculant_bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, module: str, modules: frozenset[str] = frozenset()
                   ) -> set[str]:
    """Every module name ``path`` imports (absolute, resolved for relative imports);
    ``from B import name`` names ``B.name`` alone when that is one of ``modules``."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                names.add(submodule if submodule in modules else source)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of `src/` it imports."""
    paths = {module_name(p): p for p in SRC.rglob("*.py")}
    modules = frozenset(paths)
    graph = {}
    for module, path in paths.items():
        graph[module] = {name for name in imported_names(path, module, modules)
                         if name in modules and name != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return stack[stack.index(successor):] + [successor]
            if successor not in state:
                found = visit(successor)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imported_names_sees_lazy_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import thing\n")
    (package / "a.py").write_text("def f():\n    from pkg import b\n    import pkg.c\n")
    modules = frozenset({"pkg", "pkg.a", "pkg.b", "pkg.c"})
    assert imported_names(package / "__init__.py", "pkg", modules) == {"pkg.a"}
    assert imported_names(package / "a.py", "pkg.a", modules) == {"pkg.b", "pkg.c"}


def test_src_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50, "the graph should cover every module of src/"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_runtime_imports_no_tool_and_no_bench():
    wrong = {module: sorted(name for name in imports if name.startswith(TOOLS))
             for module, imports in import_graph().items()
             if module.split(".")[0] == RUNTIME}
    wrong = {module: names for module, names in wrong.items() if names}
    assert not wrong, f"runtime modules import tools or the bench: {wrong}"


def test_the_runtime_check_sees_a_planted_tool_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from speculant_bench.timing import InvokeClock\n")
    assert "speculant_bench.timing" in imported_names(planted, "speculant.planted")


# The runtime's layers in data-flow order: a module imports only its own layer or lower ones.
LAYERS = {
    "errors": 0, "dtypes": 0,
    "package": 1, "tensors": 1, "text": 1,
    "session": 2,
    "workflow": 3,
    "speculative": 4,
    "engine": 5, "generation": 5,
    "": 6, "cli": 6, "__main__": 7, "serve": 7,
}
# The line budget of the runtime (src/speculant, the served API included): a ceiling, written
# down so growth is a decision. Tools and bench have their own homes and no budget here.
# 11,000 -> 11,250 (2026-12-02): greedy passes queued ahead of the host, their read-back on a
# reader stream and event-timed observed passes (issue 12's overhead goal), ~110 lines.
# 11,250 -> 11,300: the chain unrolled into one run (opt-in) and the sampling mixins' headers.
# 11,300 -> 11,750: chained rounds queued behind one another on the device (issue 12's best-
# mode goal): the seam's cursor writes and their CUDA kernels (two mixins, ~200 lines), the
# proposer's advance and the queued loop (speculative/ahead.py), ~400 lines in all.
# 11,750 -> 11,800 (2026-12-03): k="auto" prices a proposal by its work on the device, not
# its launch (issue 12 item 5: it drafted 7.3 drafts a round where k=4 was faster), ~50 lines.
# 11,800 -> 11,860: step 0 of a chained proposal step by step without its scores (its LM head
# was a quarter of a SmolLM2 round's drafting on the CPU at k=1): chain_graph.bootstrap_component.
# 11,860 -> 11,940: one ONNX Runtime thread pool for every CPU session of the process, made
# once and reported (session/pools.py; the demo pair's greedy +14 %, chained k=2 +23 %).
# 11,940 -> 11,970: that pool only where the process's owner allows it (share_cpu_pool; the
# CLI does): once it exists ONNX Runtime refuses every other session of the process its own.
# 11,970 -> 11,980 (2026-12-04): the step graph's one-row argmax without a row Gather (two
# kernels fewer a drafter step) and load refusing hard-linked external data (ONNX refused
# it only mid-request, as an internal error).
# 11,980 -> 11,990: k=auto's greedy steps priced by their own round time (t_round(0)).
# 11,990 -> 12,070 (2026-12-05): k=auto captures every width it may pick before its first
# round (a width captured mid-decode stalled the H200's decodes): the target's widths, the
# chain's plans, runs unobserved (capture runs are no measurement), then each width timed
# once (widths not measured yet looked free), ~80 lines.
# 12,070 -> 12,100 (2026-12-06): k=auto's probes priced against a greedy step (the demo pair
# on the CPU: 0.7x -> 0.9x greedy) and its cost tables fitted once per observation.
# 12,100 -> 12,145 (2026-12-06, later): k=auto's greedy stretches run on the greedy path
# (greedy_ahead with a step count; the controller hands out the steps before its probe; the
# stretch's time per step priced as t_round(0)): the demo pair on the CPU 0.86x -> 0.89x.
RUNTIME_LINE_BUDGET = 12_145
MODULE_LINE_LIMIT = 500


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_runtime_layers_import_only_downwards():
    upward = sorted(f"{module} -> {name}" for module, imports in import_graph().items()
                    if module.split(".")[0] == RUNTIME
                    for name in imports if name.split(".")[0] == RUNTIME
                    and layer_of(name) > layer_of(module))
    assert not upward, "runtime imports against the data flow: " + "; ".join(upward)


def test_the_runtime_stays_inside_its_line_budget():
    sizes = {p: len(p.read_text().splitlines()) for p in (SRC / RUNTIME).rglob("*.py")}
    total = sum(sizes.values())
    assert total <= RUNTIME_LINE_BUDGET, f"src/speculant has {total} lines (budget " \
                                         f"{RUNTIME_LINE_BUDGET})"
    for root in (SRC / RUNTIME, SRC / "speculant_tools", SRC / "speculant_bench"):
        large = {str(p.relative_to(SRC)): n for p, n in sizes.items() if n > MODULE_LINE_LIMIT}
        large.update({str(p.relative_to(SRC)): len(p.read_text().splitlines())
                      for p in root.rglob("*.py")
                      if len(p.read_text().splitlines()) > MODULE_LINE_LIMIT})
        assert not large, f"modules over {MODULE_LINE_LIMIT} lines: {large}"


MODEL_SUFFIXES = {".onnx", ".npz", ".safetensors", ".gguf", ".data"}
MODEL_BYTES_LIMIT = 30_000_000  # every GPU call carries the working tree; models come from packages


def test_the_shipped_model_files_stay_under_30_mb():
    files = {p: p.stat().st_size for p in SRC.rglob("*") if p.suffix in MODEL_SUFFIXES}
    assert len(files) >= 4  # the demo target and drafter, the draft model, the SmolLM2 drafter
    total = sum(files.values())
    assert total < MODEL_BYTES_LIMIT, f"model files under src/ hold {total:,} bytes: " + \
        ", ".join(f"{p.relative_to(SRC)} {n:,}" for p, n in sorted(files.items()))
