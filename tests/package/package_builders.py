"""Builders for package-layer tests: base documents, one-edit mutations, tiny ONNX graphs.

No weights and no downloads: every graph is built here with ``onnx.helper``, its ports taken
from the document (dtype and shape per declared contract), each output a ``Constant``.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from google.protobuf import text_format
from onnx import helper, numpy_helper

from speculant.dtypes import DTYPES
from speculant.package.contract import DTYPE_ALIASES

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
DATA = Path(__file__).parent / "data"
GREEDY = DATA / "greedy.yaml"  # metadata.md §8.1, verbatim
CHAINED = DATA / "chained.yaml"  # metadata.md §8.2, verbatim
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
WF = "pipeline.workflow"

ELEMENT_TYPES = {name: dtype.onnx for name, dtype in DTYPES.items() if dtype.onnx is not None}
ELEMENT_TYPES.update({alias: ELEMENT_TYPES[name] for alias, name in DTYPE_ALIASES.items()
                      if name in ELEMENT_TYPES})


@functools.cache
def _parsed(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=Loader)


def base(name: str) -> dict[str, Any]:
    """A fresh copy of a base document: ``greedy`` (§8.1) or ``chained`` (§8.2)."""
    return copy.deepcopy(_parsed(GREEDY if name == "greedy" else CHAINED))


def at(doc: dict[str, Any], path: str) -> Any:
    """The node at a dotted path; keys containing dots are matched greedily."""
    node: Any = doc
    parts = path.split(".")
    index = 0
    while index < len(parts):
        for end in range(len(parts), index, -1):
            key = ".".join(parts[index:end])
            if isinstance(node, list) and key.isdigit():
                node, index = node[int(key)], end
                break
            if isinstance(node, dict) and key in node:
                node, index = node[key], end
                break
        else:
            raise KeyError(f"{path}: no '{parts[index]}'")
    return node


def _parent(doc: dict[str, Any], path: str) -> tuple[Any, Any]:
    """(container, key) of a dotted path; the key may itself contain dots."""
    parts = path.split(".")
    if path in doc or len(parts) == 1:
        return doc, path
    splits = range(len(parts) - 1, 0, -1)
    for split in splits:  # an existing key, the shortest one that matches
        head, last = ".".join(parts[:split]), ".".join(parts[split:])
        try:
            container = at(doc, head)
        except KeyError:
            continue
        if isinstance(container, list) and last.isdigit() and int(last) <= len(container):
            return container, int(last)
        if isinstance(container, dict) and last in container:
            return container, last
    for split in splits:  # a new key in the deepest existing mapping
        try:
            container = at(doc, ".".join(parts[:split]))
        except KeyError:
            continue
        if isinstance(container, dict):
            return container, ".".join(parts[split:])
    raise KeyError(path)


def setv(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set the node at ``path`` (a new key, or the index one past the end of a list)."""
    container, key = _parent(doc, path)
    if isinstance(container, list) and key == len(container):
        container.append(value)
    else:
        container[key] = value
    return doc


def delete(doc: dict[str, Any], path: str) -> dict[str, Any]:
    container, key = _parent(doc, path)
    del container[key]
    return doc


def rename_symbol(doc: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """Rename a shape symbol in every contract (one edit: the symbol's name)."""
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("shape"), list):
                node["shape"] = [new if d == old else d for d in node["shape"]]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(doc)
    return doc


# -- graphs -------------------------------------------------------------------------------
def rank_of(contract: dict[str, Any]) -> int:
    """A contract's rank; a later revision of the standard leaves it to the shape's length."""
    return contract["rank"] if "rank" in contract else len(contract["shape"])


def _value_info(name: str, contract: dict[str, Any]) -> onnx.ValueInfoProto:
    shape = contract.get("shape")
    return helper.make_tensor_value_info(name, ELEMENT_TYPES[contract["dtype"]], shape)


def build_graph(doc: dict[str, Any], component: str, *,
                initializers: dict[str, np.ndarray] | None = None,
                drop_inputs: tuple[str, ...] = (), drop_outputs: tuple[str, ...] = (),
                retype: dict[str, dict[str, Any]] | None = None,
                extra_inputs: dict[str, dict[str, Any]] | None = None) -> onnx.ModelProto:
    """A graph whose ports are the component's declared ports; each output is a Constant.
    ``retype`` overrides a port's contract as the graph sees it."""
    ports = at(doc, f"{WF}.components.{component}.ports")
    retype = retype or {}
    inputs = [_value_info(p, retype.get(p, c)) for p, c in ports["inputs"].items()
              if p not in drop_inputs]
    inputs += [_value_info(p, c) for p, c in (extra_inputs or {}).items()]
    outputs, nodes = [], []
    for port, contract in ports["outputs"].items():
        if port in drop_outputs:
            continue
        contract = retype.get(port, contract)
        outputs.append(_value_info(port, contract))
        value = helper.make_tensor(f"{port}_value", ELEMENT_TYPES[contract["dtype"]],
                                   [1] * rank_of(contract), [0] * 1)
        nodes.append(helper.make_node("Constant", [], [port], value=value))
    tables = [numpy_helper.from_array(array, name)
              for name, array in (initializers or {}).items()]
    graph = helper.make_graph(nodes, component, inputs, outputs, initializer=tables)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def default_initializers(doc: dict[str, Any], component: str) -> dict[str, np.ndarray]:
    """The embedding table §8.2 needs: target ``model.embed_tokens.weight`` [32, 16] float16."""
    spec = doc.get("speculative") or {}
    embedding = (spec.get("proposal_execution") or {}).get("token_embedding") or {}
    if embedding.get("component") == component and embedding.get("table"):
        return {embedding["table"]: np.zeros((32, 16), np.float16)}
    return {}


def write_model(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".onnx.textproto"):
        path.write_text(text_format.MessageToString(model))
    else:
        onnx.save(model, str(path))


def write_package(root: Path, doc: dict[str, Any], *,
                  graphs: dict[str, onnx.ModelProto | None] | None = None,
                  tokenizer: bool = True) -> Path:
    """Write ``doc`` and a graph for every ONNX component (``graphs`` overrides one; ``None``
    leaves the artifact out) into ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "inference_metadata.yaml").write_text(yaml.dump(doc, Dumper=Dumper, sort_keys=False))
    graphs = graphs or {}
    components = ((doc.get("pipeline") or {}).get("workflow") or {}).get("components") or {}
    for name, component in components.items():
        artifact = component.get("implementation", {}).get("artifact")
        if not artifact or artifact.startswith("/") or ".." in artifact:
            continue
        model = graphs[name] if name in graphs else build_graph(
            doc, name, initializers=default_initializers(doc, name))
        if model is not None:
            write_model(model, root / artifact)
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    return root


def mutated(name: str, *edits: tuple) -> dict[str, Any]:
    """``base(name)`` after edits ``("set", path, value)`` / ``("del", path)``."""
    doc = copy.deepcopy(base(name))
    for edit in edits:
        if edit[0] == "set":
            setv(doc, edit[1], edit[2])
        elif edit[0] == "del":
            delete(doc, edit[1])
        else:
            raise ValueError(edit)
    return doc
