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
import re
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
    "engine": 5, "generation": 5, "aio": 5,
    "": 6, "cli": 6, "chat_repl": 6, "__main__": 7, "serve": 7,
}
# Line ceilings of the runtime's layers (src/speculant, the served API included). A ceiling
# rises only in a commit that adds a capability and says by how much; any other growth comes
# with a deletion beside it. The change a commit makes is `git diff --stat`'s to report.
LAYER_CEILINGS = {
    "package": 3_642, "tensors": 2_066, "text": 815, "session": 927, "workflow": 2_115,
    "speculative": 3_407, "engine and API": 2_216, "serve": 1_724,
}
RUNTIME_CEILING = 16_912  # the sum
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


def runtime_layer(path: Path) -> str:
    parts = path.relative_to(SRC / RUNTIME).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYER_CEILINGS else "engine and API"


def test_the_runtime_layers_stay_under_their_ceilings():
    assert sum(LAYER_CEILINGS.values()) <= RUNTIME_CEILING
    sizes: dict[str, int] = dict.fromkeys(LAYER_CEILINGS, 0)
    for path in (SRC / RUNTIME).rglob("*.py"):
        sizes[runtime_layer(path)] += len(path.read_text().splitlines())
    over = {layer: f"{n} > {LAYER_CEILINGS[layer]}" for layer, n in sizes.items()
            if n > LAYER_CEILINGS[layer]}
    assert not over, f"runtime layers over their ceilings: {over}"


def test_no_module_is_over_the_module_limit():
    large = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
             if (n := len(p.read_text().splitlines())) > MODULE_LINE_LIMIT}
    assert not large, f"modules over {MODULE_LINE_LIMIT} lines: {large}"


def calls_in(path: Path) -> list[tuple[str, ast.Call]]:
    """Every call in ``path`` with the name it calls (``f`` or ``a.f`` -> ``f``)."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            calls.append((name, node))
    return calls


def runtime_modules() -> dict[str, Path]:
    return {str(p.relative_to(SRC / RUNTIME)): p for p in (SRC / RUNTIME).rglob("*.py")}


def test_one_decode_loop():
    """One loop: the scheduler's step (speculative/scheduler.py), which alone makes a row's
    ``Rounds`` (speculative/round.py, which alone launches rounds); a request decoded alone
    (speculative/decode.py's ``alone``) is that loop at one row, not a second
    implementation, and the reference is the same rounds at queue depth 0. No function
    decodes beside it."""
    defined = sorted(name for name, path in runtime_modules().items()
                     for node in ast.parse(path.read_text()).body
                     if isinstance(node, ast.FunctionDef) and "decode" in node.name)
    assert defined == []
    launching = {name: sorted({call for call, _ in calls_in(path)
                               if call == "Rounds" or call.startswith("launch_")})
                 for name, path in runtime_modules().items()}
    launching = {name: calls for name, calls in launching.items() if calls}
    assert launching == {"speculative/round.py": ["launch_host_round", "launch_queued_round",
                                                  "launch_step"],
                         "speculative/scheduler.py": ["Rounds"]}
    driving = {name for name, path in runtime_modules().items()
               for call, _ in calls_in(path) if call == "Scheduler"}
    assert driving == {"engine.py", "speculative/decode.py"}


CACHE_KINDS = {"StaticCells", "AppendedCells"}
CACHE_OWNER = "workflow/cells.py"


def cache_kind_checks(path: Path) -> list[int]:
    """Lines of ``isinstance(..., <cache kind>)`` in ``path``."""
    return [node.lineno for name, node in calls_in(path) if name == "isinstance"
            and len(node.args) == 2 and CACHE_KINDS & {n.id for n in ast.walk(node.args[1])
                                                     if isinstance(n, ast.Name)}]


def test_only_the_cache_owner_asks_a_caches_kind(tmp_path):
    found = {name: lines for name, path in runtime_modules().items()
             if name != CACHE_OWNER and (lines := cache_kind_checks(path))}
    assert not found, f"cache-kind switches outside {CACHE_OWNER}: {found}"
    planted = tmp_path / "planted.py"
    planted.write_text("def f(cells):\n    return isinstance(cells, (dict, StaticCells))\n")
    assert cache_kind_checks(planted) == [2]


REPOSITORY = SRC.parent
OUTPUT_NAMES = {"bench.md"}  # a file the bench writes, not a page it cites
CITED_FILE = re.compile(r"[\w./-]+\.(?:md|py|sh|json|yaml)\b")
OUTSIDE = re.compile(r"\.\./shared|/work/|shared/spec")


def citations_outside(path: Path) -> list[str]:
    """What ``path`` cites that is not a file of the repository (a documentation page is
    named from the repository's root: docs/design/...)."""
    text = path.read_text()
    wrong = [m.group(0) for m in OUTSIDE.finditer(text)]
    for match in CITED_FILE.finditer(text):
        cited = match.group(0).strip("./")
        if cited.endswith(".md") and cited not in OUTPUT_NAMES and \
                not (REPOSITORY / cited).exists():
            wrong.append(cited)
    return wrong


def test_src_cites_nothing_outside_the_repository(tmp_path):
    found = {str(p.relative_to(SRC)): cited for p in SRC.rglob("*.py")
             if (cited := citations_outside(p))}
    assert not found, f"src/ cites pages that are not in the repository: {found}"
    planted = tmp_path / "planted.py"
    planted.write_text('"""See runtime.md §14 and ../shared/spec/README.md."""\n')
    assert {"../shared", "runtime.md"} <= set(citations_outside(planted))


MODEL_SUFFIXES = {".onnx", ".npz", ".safetensors", ".gguf", ".data"}
MODEL_BYTES_LIMIT = 30_000_000  # every GPU call carries the working tree; models come from packages


def test_the_shipped_model_files_stay_under_30_mb():
    files = {p: p.stat().st_size for p in SRC.rglob("*") if p.suffix in MODEL_SUFFIXES}
    assert len(files) >= 4  # the demo target and drafter, the draft model, the SmolLM2 drafter
    total = sum(files.values())
    assert total < MODEL_BYTES_LIMIT, f"model files under src/ hold {total:,} bytes: " + \
        ", ".join(f"{p.relative_to(SRC)} {n:,}" for p, n in sorted(files.items()))
