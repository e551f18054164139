"""Graphs written with external data: the weights go from their arrays straight to
``model.onnx.data`` (never through protobuf), hold exactly the values given, load in ONNX
Runtime with outputs equal to the inline-written graph's, and pass the ONNX checker by path."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS
from onnx import TensorProto, numpy_helper

from speculant_tools.export import write_pair_package
from speculant_tools.export.config import EMBEDDING
from speculant_tools.export.package import write_graph
from speculant_tools.onnx_build import (
    ALIGNMENT,
    APART_BYTES,
    GraphBuilder,
    weights_apart,
)

COMPONENTS = ("target", "assistant")
C = CONFIG


@pytest.fixture(scope="module")
def external_root(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("external") / "pair"
    return write_pair_package(root, TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS, tokenizer_path,
                              external_data=True)


def initializers(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))  # external data loaded from beside the file
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_weights_built_apart_stay_out_of_protobuf():
    """Inside ``weights_apart`` a weight of 1 KiB or more is a placeholder holding no bytes;
    its array is the caller's own (shared memory, not a copy); a smaller one stays inline."""
    big = np.arange(APART_BYTES // 4, dtype=np.float32)
    small = np.ones(3, np.float32)
    g = GraphBuilder("g")
    with weights_apart() as arrays:
        g.weight("big", big)
        g.weight("small", small)
    placeholder, inline = g.initializers
    assert placeholder.data_location == TensorProto.EXTERNAL
    assert not placeholder.raw_data and not placeholder.external_data
    assert list(placeholder.dims) == [big.size] and placeholder.data_type == TensorProto.FLOAT
    assert np.shares_memory(arrays["big"], big) and "small" not in arrays
    np.testing.assert_array_equal(numpy_helper.to_array(inline), small)


@pytest.mark.parametrize("component", COMPONENTS)
def test_external_data_holds_exactly_the_weights(pair_root, external_root, component):
    """Every initializer read back with its external data equals the inline-written
    graph's, the HF-named ones equal the weights given; the model file itself carries no
    weight bytes, and each tensor in ``model.onnx.data`` starts at a 4 KiB boundary."""
    path = external_root / component / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    external, inline = initializers(path), initializers(pair_root / component / "model.onnx")
    assert external.keys() == inline.keys()
    for name, array in inline.items():
        assert external[name].dtype == array.dtype, name
        np.testing.assert_array_equal(external[name], array, err_msg=name)
    given = {**DRAFTER_WEIGHTS, EMBEDDING: TARGET_WEIGHTS[EMBEDDING]} \
        if component == "assistant" else TARGET_WEIGHTS
    named = [name for name in given if name in external]
    assert EMBEDDING in named
    for name in named:
        expected = np.asarray(given[name], np.float32)
        np.testing.assert_array_equal(external[name], expected[:external[name].shape[0]],
                                      err_msg=name)
    proto = onnx.load(str(path), load_external_data=False)
    moved = [t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert moved and all(not t.raw_data for t in moved)
    assert all(len(t.raw_data) < APART_BYTES for t in proto.graph.initializer)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in moved]
    assert all(offset % ALIGNMENT == 0 for offset in offsets)


def run_target(path) -> list[np.ndarray]:
    """One prefill pass of five tokens over empty caches."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = [7, 3, 41, 12, 25]
    feeds = {"input_ids": np.array([ids], np.int64),
             "position_ids": np.arange(len(ids), dtype=np.int64)[None],
             "attention_mask": np.ones((1, len(ids)), np.int64)}
    empty = np.zeros((1, C.num_key_value_heads, 0, C.head_dim), np.float32)
    for i in range(C.num_hidden_layers):
        feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = empty
    wanted = {i.name for i in session.get_inputs()}
    return session.run(None, {name: value for name, value in feeds.items() if name in wanted})


def test_ort_outputs_equal_the_inline_graphs(pair_root, external_root):
    inline = run_target(pair_root / "target" / "model.onnx")
    external = run_target(external_root / "target" / "model.onnx")
    assert len(inline) == len(external) > 0
    for a, b in zip(inline, external, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_plain_model_moves_its_inline_weights_out(tmp_path):
    """A model built without ``weights_apart`` (raw bytes inline) written with external
    data: its large initializer moves to the data file, the small one stays, ORT's output
    equals the inline file's."""
    weight = np.linspace(-1, 1, 16 * 32, dtype=np.float32).reshape(16, 32)
    g = GraphBuilder("plain")
    x = g.add_input("x", "float32", (2, 16))
    g.add_output("y", g.op("Add", [g.op("MatMul", [x, g.weight("w", weight)]),
                                   g.const("b", 0.5)]), "float32", (2, 32))
    inline = write_graph(g.model(), tmp_path / "inline" / "model.onnx", external_data=False)
    g = GraphBuilder("plain")
    x = g.add_input("x", "float32", (2, 16))
    g.add_output("y", g.op("Add", [g.op("MatMul", [x, g.weight("w", weight)]),
                                   g.const("b", 0.5)]), "float32", (2, 32))
    external = write_graph(g.model(), tmp_path / "external" / "model.onnx", external_data=True)
    assert (external.parent / "model.onnx.data").stat().st_size == weight.nbytes
    np.testing.assert_array_equal(initializers(external)["w"], weight)
    feeds = {"x": np.arange(32, dtype=np.float32).reshape(2, 16)}
    outputs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)
               for p in (inline, external)]
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    np.testing.assert_allclose(outputs[1][0], feeds["x"] @ weight + 0.5, rtol=1e-6)
