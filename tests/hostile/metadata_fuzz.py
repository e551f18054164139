"""A metadata fuzzer: hypothesis strategies that mutate real documents, and a runner that
feeds each input to the loader under a per-input time limit.

Seeds: the fixture documents (``tests/package/data``, the builders' decoder and chained
documents, the bundled demo pair) and the published conformance documents
(``../shared/conformance/*.yaml``). An input is a seed with 1-4 structural mutations (delete,
retype, rename or insert a key, duplicate or swap nodes, reuse another name of the document,
nest a node deeply, hostile scalars: huge and non-finite numbers, unicode controls, lone
surrogates, long strings), written as YAML or JSON, then optionally damaged as text (an alias
bomb or a recursive alias planted at a node, a Python tag, truncation, byte flips, a line
deleted or repeated).

Inputs from the ``decoder`` seed are also written into a copy of the decoder package and
loaded whole (``speculant.load``: admission, sessions, tokenizer). ``run_input`` returns one
outcome: ``accepted`` (it loaded), ``typed`` (a SpeculantError),
``uncaught`` (any other exception) or ``hang`` (past the time limit).
"""

from __future__ import annotations

import copy
import json
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hostile_helpers import laughs
from hypothesis import strategies as st

from builders import FixtureSpec, chained_metadata, decoder_metadata
from speculant.engine import load
from speculant.errors import SpeculantError, UnsupportedError
from speculant.package import derive_plan, load_metadata_only, summarize

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO.parent / "shared" / "conformance"
LIMIT_S = 5.0  # per input
MAX_MESSAGE_CHARS = 20_000  # the longest error message a hostile input may produce
Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def seed_documents() -> dict[str, dict[str, Any]]:
    seeds = {"decoder": decoder_metadata(FixtureSpec(), artifact="decoder/model.onnx"),
             "chained": chained_metadata(FixtureSpec())}
    for path in sorted((REPO / "tests" / "package" / "data").glob("*.yaml")):
        seeds[f"spec-{path.stem}"] = _load(path)
    for name in ("demo", "demo_draft"):
        seeds[name] = _load(REPO / "src" / "speculant" / name / "inference_metadata.yaml")
    for path in sorted(CONFORMANCE.glob("*.yaml")) if CONFORMANCE.is_dir() else []:
        seeds[f"conformance-{path.stem}"] = _load(path)
    return seeds


# -- hostile values -----------------------------------------------------------------------
SPECIAL_TEXT = ["", " ", "\u202e", "\u200b", "\ufeff", "\x00", "\U0010ffff", "\ud800",
                "x" * 100_000, "../../etc/passwd", "/dev/zero", "&a", "*a", "!!python/name:os",
                "%YAML 9.9", "---", "null", "1e999", "NaN", "\t\r\n"]
SPECIAL_NUMBERS = [2 ** 31, 2 ** 63, 2 ** 64 + 1, -(2 ** 63) - 1, 10 ** 300, 1e308, -1e308,
                   float("inf"), float("-inf"), float("nan"), 0, -1, 0.5, 1e-320]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from(SPECIAL_NUMBERS), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(SPECIAL_TEXT), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
keys = st.one_of(st.text(max_size=10), st.sampled_from(SPECIAL_TEXT[:8]), st.integers(),
                 st.none(), st.booleans())


# -- structural mutations -----------------------------------------------------------------
def _paths(root: Any, max_depth: int = 40) -> list[tuple]:
    """Every path to a node of the tree (the root excluded), down to ``max_depth``."""
    found: list[tuple] = []
    stack: list[tuple[Any, tuple]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        if len(prefix) >= max_depth:
            continue
        items = node.items() if isinstance(node, dict) else enumerate(node) \
            if isinstance(node, list) else ()
        for key, child in items:
            found.append(prefix + (key,))
            stack.append((child, prefix + (key,)))
    return found


def _parent(doc: Any, path: tuple) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def _strings(root: Any) -> list[str]:
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            found.append(node)
        elif isinstance(node, dict):
            stack += [*node.keys(), *node.values()]
        elif isinstance(node, list):
            stack += node
    return found


ALIAS = "__fuzz_alias__"  # replaced by an alias after dumping (text mutation "alias")
MUTATIONS = ("delete", "retype", "rename", "insert", "duplicate", "swap", "reuse_name", "nest",
             "alias")


@st.composite
def mutated_documents(draw, seeds: dict[str, dict[str, Any]]) -> tuple[str, dict, list[str]]:
    name = draw(st.sampled_from(sorted(seeds)))
    doc = copy.deepcopy(seeds[name])
    applied: list[str] = []
    nest: tuple[tuple, int, bool] | None = None  # path, levels, lists (else mappings)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        if not paths:
            break
        kind = draw(st.sampled_from(MUTATIONS))
        path = draw(st.sampled_from(paths))
        parent, key = _parent(doc, path), path[-1]
        if kind == "delete":
            del parent[key]
        elif kind == "retype":
            parent[key] = draw(values)
        elif kind == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(key)
        elif kind == "insert" and isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif kind == "swap":
            other = draw(st.sampled_from(paths))
            other_parent = _parent(doc, other)
            try:
                parent[key], other_parent[other[-1]] = other_parent[other[-1]], parent[key]
            except (KeyError, IndexError):  # one path lay inside the other
                pass
        elif kind == "reuse_name":
            parent[key] = draw(st.sampled_from(_strings(doc) or ["x"]))
        elif kind == "nest" and nest is None:  # once, after the others (it stays dumpable)
            nest = (path, draw(st.sampled_from([2, 20, 99, 150, 600])), draw(st.booleans()))
        elif kind == "alias":
            parent[key] = ALIAS
        else:
            continue
        applied.append(f"{kind} {'.'.join(map(str, path))}")
    if nest is not None:
        path, levels, as_lists = nest
        try:
            parent = _parent(doc, path)
            value = parent[path[-1]]
        except (KeyError, IndexError, TypeError):  # a later mutation moved it
            return name, doc, applied
        for _ in range(levels):
            value = [value] if as_lists else {"n": value}
        parent[path[-1]] = value
    return name, doc, applied


# -- text -----------------------------------------------------------------------------------
TEXT_DAMAGE = ("none", "none", "none", "truncate", "flip", "drop_line", "repeat_line", "tag")


def serialize(doc: dict, as_json: bool) -> str:
    if as_json:
        return json.dumps(doc, default=str)
    try:
        return yaml.dump(doc, Dumper=Dumper, allow_unicode=True, sort_keys=False, width=1 << 16)
    except (yaml.YAMLError, ValueError, RecursionError):
        return json.dumps(doc, default=str)  # JSON is YAML too


@st.composite
def inputs(draw, seeds: dict[str, dict[str, Any]]) -> tuple[str, str, list[str]]:
    """(file suffix, text, description) of one fuzz input."""
    name, doc, applied = draw(mutated_documents(seeds))
    as_json = draw(st.integers(0, 99)) < 20
    text = serialize(doc, as_json)
    if ALIAS in text and not as_json:
        levels, width = draw(st.sampled_from([(3, 9), (6, 9), (9, 9), (12, 2), (20, 2)]))
        recursive = draw(st.integers(0, 9)) == 0
        alias = "&r [1, *r]" if recursive else f"*l{levels}"
        text = f"quantization_fuzz: {laughs(levels, width)}\n" + text.replace(
            f"'{ALIAS}'", alias).replace(ALIAS, alias)
        applied.append("recursive alias" if recursive else f"alias bomb {width}**{levels}")
    damage = draw(st.sampled_from(TEXT_DAMAGE))
    data = text.encode("utf-8", "surrogatepass")
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "flip":
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 9))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        data = bytes(data)
    elif damage in ("drop_line", "repeat_line", "tag"):
        lines = data.split(b"\n")
        index = draw(st.integers(0, len(lines) - 1))
        if damage == "drop_line":
            del lines[index]
        elif damage == "repeat_line":
            lines.insert(index, lines[index])
        else:
            lines.insert(index, b"fuzz_tag: !!python/object/apply:os.system ['true']")
        data = b"\n".join(lines)
    if damage != "none":
        applied.append(damage)
    return (".json" if as_json else ".yaml"), data.decode("utf-8", "surrogateescape"), \
        [name, *applied]


# -- the runner -----------------------------------------------------------------------------
class Hang(BaseException):
    """Raised by the alarm: not an Exception, so no handler in speculant can swallow it."""


def _alarm(signum, frame):
    raise Hang()


@dataclass
class Outcome:
    kind: str  # accepted | typed | uncaught | hang
    seconds: float
    message_chars: int = 0
    detail: str = ""


def _exercise(target: Path, full_package: bool) -> None:
    """What `inspect` does with a document: load, summarize, render what is unsupported."""
    if full_package:
        load(target)  # validation, admission, ONNX Runtime sessions, the tokenizer
        return
    document, unsupported = load_metadata_only(target)
    json.dumps(summarize(document), default=str)
    if unsupported:
        str(UnsupportedError(problems=unsupported))
    elif document.pipeline is not None:
        derive_plan(document)


def run_input(target: Path, *, full_package: bool = False, limit_s: float = LIMIT_S) -> Outcome:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    started = time.perf_counter()
    try:
        _exercise(target, full_package)
        outcome = Outcome("accepted", 0.0)
    except Hang:
        outcome = Outcome("hang", 0.0)
    except SpeculantError as error:
        outcome = Outcome("typed", 0.0, len(str(error)), type(error).__name__)
    except Exception as error:  # noqa: BLE001 (what the fuzzer is looking for)
        outcome = Outcome("uncaught", 0.0, detail=f"{type(error).__name__}: {error}\n"
                          + "".join(traceback.format_tb(error.__traceback__)[-3:]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    outcome.seconds = time.perf_counter() - started
    return outcome
