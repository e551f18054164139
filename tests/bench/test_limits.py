"""The physical limit's arithmetic (speculant_bench.limits) on a tiny exported pair: bytes per
token from the target's initializers and cache cells, the limit, the per-runner ratio, the
report section. Measurements are only checked to run (no timing assertions)."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from tokenizers import AddedToken, Tokenizer, models

from speculant.package import load_package
from speculant_bench import limits
from speculant_bench.spread import Spread
from speculant_tools.export import LlamaConfig, drafter_shapes, target_shapes, write_pair_package

CONFIG = LlamaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=24, max_position_embeddings=32,
                     head_dim=4)


def _weights(shapes, rng):
    return {name: (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                   else rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
            for name, shape in shapes.items()}


def _pair(root, dtype="float32", external_data=None):
    rng = np.random.default_rng(0)
    tokenizer = Tokenizer(models.BPE(vocab={chr(65 + i): i for i in range(40)}, merges=[]))
    tokenizer.add_special_tokens([AddedToken("</s>", special=True)])
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root.parent / f"{root.name}-tokenizer.json"))
    return write_pair_package(root, _weights(target_shapes(CONFIG), rng), CONFIG,
                              _weights(drafter_shapes(CONFIG), rng),
                              root.parent / f"{root.name}-tokenizer.json", dtype=dtype,
                              eos_id=1, external_data=external_data)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("limits")
    return {"float32": _pair(folder / "f32"), "float16": _pair(folder / "f16", "float16"),
            "external": _pair(folder / "ext", external_data=True)}


@pytest.mark.parametrize("name", ["float32", "float16", "external"])
def test_bytes_per_token(packages, name):
    root = packages[name]
    itemsize = 2 if name == "float16" else 4
    counted = limits.target_bytes(load_package(root))
    model = onnx.load(str(root / "target" / "model.onnx"))  # external data loaded
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert counted.weight_bytes == weights
    assert counted.num_initializers == len(model.graph.initializer)
    c = CONFIG
    parameters = sum(math.prod(s) for s in target_shapes(c).values())
    rope = 2 * c.max_position_embeddings * c.head_dim * 4  # cos, sin tables (float32)
    assert weights >= parameters * itemsize + rope  # plus a few small constants
    per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * itemsize
    assert counted.kv_bytes_per_position == per_position
    assert counted.num_cells == 2 * c.num_hidden_layers
    assert counted.per_token(10.5) == weights + per_position * 10.5


def test_the_limit_and_the_ratios(packages):
    counted = limits.target_bytes(load_package(packages["float32"]))
    context = limits.mean_context([6, 10], 8)
    assert context == 8 + 4
    bandwidth = limits.Measured("given", Spread.of([9.0, 10.0, 30.0]))
    limit = limits.PhysicalLimit("cpu", counted, context, bandwidth, None)
    expected = 10e9 / (counted.weight_bytes + counted.kv_bytes_per_position * 12)
    assert limit.tokens_per_s == pytest.approx(expected)
    assert limit.floor_tokens_per_s is None
    report = {"runners": [
        {"name": "greedy", "decode_tokens_per_s": {"median": expected / 2}},
        {"name": "chained k=4", "decode_tokens_per_s": {"median": expected * 1.5}}]}
    limits.annotate(report, limit)
    assert [r["of_physical_limit"] for r in report["runners"]] == pytest.approx([0.5, 1.5])
    section = report["physical_limit"]
    assert section["bytes_per_token"] == pytest.approx(limit.bytes_per_token)
    assert section["kv_bytes_read"] == counted.kv_bytes_per_position * 12
    assert section["greedy_limit_tokens_per_s"] == pytest.approx(expected)
    text = "\n".join(limits.markdown(report))
    assert "## Physical limit" in text and "| chained k=4 |" in text and "1.500" in text

    floor = limits.Measured("given", Spread.of([0.02, 0.025, 0.03]))
    cuda = limits.PhysicalLimit("cuda:0", counted, context, bandwidth, floor)
    assert cuda.floor_tokens_per_s == pytest.approx(1000 / 0.025)
    assert "launch floor" in "\n".join(limits.markdown(limits.annotate(
        {"runners": []}, cuda)))
    missing = limits.PhysicalLimit("cpu", counted, context, limits.Measured("x", error="no"),
                                   None)
    report = limits.annotate({"runners": [{"name": "greedy",
                                           "decode_tokens_per_s": {"median": 1.0}}]}, missing)
    assert report["runners"][0]["of_physical_limit"] is None
    assert "not measured (no)" in "\n".join(limits.markdown(report))


def test_measurements_run_or_say_why():
    host = limits.host_bandwidth(threads=2, nbytes=8 << 20, repeats=2)
    assert host.error is None and host.spread.median > 0
    for measured in (limits.cuda_bandwidth("cuda:0", nbytes=1 << 20, repeats=1),
                     limits.cuda_launch_floor("cuda:0", repeats=2)):
        assert (measured.spread is None) != (measured.error is None)


def test_the_bench_report_carries_the_limit(bench_run, cli_bench):
    assert bench_run.limit is not None and bench_run.limit.tokens_per_s > 0
    result, out = cli_bench
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert "## Physical limit" in (out / "bench.md").read_text()
    section = report["physical_limit"]
    assert section["device"] == "cpu" and section["launch_floor_ms"] is None
    assert all("of_physical_limit" in r for r in report["runners"])
