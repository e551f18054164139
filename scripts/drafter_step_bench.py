"""One chained-drafter step at a real model's shape, explicit attention against the fused
(ONNX RotaryEmbedding + Attention), on CUDA with IO binding and CUDA graph replay.

    python scripts/drafter_step_bench.py --shape realistic-1b --out step.json

Random float16 weights at the widened demo drafter's shape (hidden 2048, 32/8 heads, its
trained MLP width), static borrowed caches ``[1, 8, capacity, 64]``, 1 query row. Prints the
median over repeats of the mean time of one replay (``--runs`` back to back, one sync), and
the graphs' node counts. Eager runs are timed too (one sync per run: launch-bound)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort

from speculant_tools.export import read_weights
from speculant_tools.export.config import drafter_shapes
from speculant_tools.export.graphs import drafter_graph
from speculant_tools.export.widen import widened_config


def build(config, fused_attention: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = {name: (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
               for name, shape in drafter_shapes(config).items()}
    for name in weights:
        if name.endswith("norm.weight"):
            weights[name] = np.ones_like(weights[name])
    table = (rng.standard_normal((config.vocab_size, config.hidden_size), dtype=np.float32)
             * 0.02).astype(np.float16)
    return drafter_graph(config, weights, table, "float16", fused_norms=True, cache="static",
                         fused_attention=fused_attention)


def bench(model, config, capacity: int, length: int, graphs: bool, runs: int, repeats: int):
    options = {"device_id": "0", **({"enable_cuda_graph": "1"} if graphs else {})}
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=[("CUDAExecutionProvider", options)])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    rng = np.random.default_rng(1)
    kv = (1, config.num_key_value_heads, capacity, config.head_dim)
    host = {"inputs_embeds": rng.standard_normal((1, 1, 2 * config.hidden_size)).astype(np.float16),
            "position_ids": np.array([[length - 1]], np.int64),
            "cache_lengths": np.array([length], np.int64),
            "shared_kv.key": rng.standard_normal(kv).astype(np.float16),
            "shared_kv.value": rng.standard_normal(kv).astype(np.float16)}
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)
              for name, array in host.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    outputs = {"logits": (1, 1, config.draft_vocab_size),
               "projected_state": (1, 1, config.hidden_size)}
    for name, shape in outputs.items():
        binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_shape_and_type(
            shape, np.float16, "cuda", 0))
    session.run_with_iobinding(binding)  # capture (graphs) or warm-up
    for _ in range(20):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(repeats):
        binding.synchronize_outputs()
        start = time.perf_counter()
        for _ in range(runs):
            session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append((time.perf_counter() - start) / runs * 1e3)
    logits = binding.get_outputs()[0].numpy()
    return statistics.median(times), logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--package", default="src/speculant/demo")
    parser.add_argument("--shape", default="realistic-1b")
    parser.add_argument("--capacity", type=int, default=512)
    parser.add_argument("--length", type=int, default=160)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    ort.preload_dlls()
    trained, _, _ = read_weights(args.package)
    config = widened_config(trained, args.shape)
    result = {"shape": args.shape, "hidden": config.hidden_size,
              "drafter_intermediate_size": config.drafter_intermediate_size,
              "vocab": config.draft_vocab_size, "capacity": args.capacity,
              "length": args.length, "onnxruntime": ort.__version__, "runs": {}}
    logits = {}
    for fused in (False, True):
        model = build(config, fused)
        name = "fused" if fused else "explicit"
        result["runs"][name] = {"nodes": len(model.graph.node)}
        for graphs in (False, True):
            ms, logits[name, graphs] = bench(model, config, args.capacity, args.length, graphs,
                                             args.runs, args.repeats)
            result["runs"][name]["graph_replay_ms" if graphs else "eager_ms"] = round(ms, 4)
            print(f"{name:8s} nodes {len(model.graph.node):3d} "
                  f"{'graph replay' if graphs else 'eager'}: {ms:.4f} ms per step", flush=True)
    diff = np.abs(logits["fused", True].astype(np.float32)
                  - logits["explicit", True].astype(np.float32))
    result["max_abs_logit_difference"] = float(diff.max())
    result["argmax_equal"] = bool(logits["fused", True].argmax()
                                  == logits["explicit", True].argmax())
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
