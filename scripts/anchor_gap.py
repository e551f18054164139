"""Where the decode-time gap between speculant and onnxruntime-genai comes from (CPU).

    python scripts/anchor_gap.py PACKAGE GENAI_MODEL_DIR --prompts FILE --threads 1 --out DIR

``GENAI_MODEL_DIR`` is the builder's output for the same target (``--anchor-dir D`` of
``speculant bench --anchors genai`` leaves it in ``D/genai/target``). Two measurements, on the
same ONNX Runtime, with the same thread count:

1. **The graphs alone.** One single-token pass (cache length ``--cache``) of speculant's target
   graph and of genai's builder graph, each in a plain ``InferenceSession`` with numpy inputs,
   the two interleaved, ``--repeats`` times: the cost of the graph (speculant's hand-built one
   against the builder's fused GroupQueryAttention / SkipSimplifiedLayerNormalization one).
2. **speculant's greedy loop under cProfile**: one pass over the prompt set after a warm-up;
   the time inside ``InferenceSession.run_with_iobinding`` against the rest (the runtime's
   Python per pass), and the top functions by own time.
3. **genai's per-request setup**: the time to construct an ``og.Generator`` (when
   onnxruntime-genai is installed), which its time to first token includes.

Writes ``anchor_gap.json`` and ``anchor_gap.txt`` to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import speculant
from speculant_bench.report import machine


def read_prompts(path: Path) -> list[list[int]]:
    items = json.loads(path.read_text())
    if isinstance(items, dict):
        items = [item["prompt"] for item in items["prompts"]]
    return [list(item) for item in items]


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(sess: ort.InferenceSession, tokens: list[int], past: dict | None, start: int,
          head_size: int) -> dict:
    """Inputs of one pass over ``tokens`` at positions ``start…``; ``past`` (name → array) or
    an empty cache (``head_size`` where the graph leaves the last axis symbolic)."""
    n = len(tokens)
    out = {}
    for item in sess.get_inputs():
        name = item.name
        if name == "input_ids":
            out[name] = np.asarray([tokens], dtype=np.int64)
        elif name == "attention_mask":
            out[name] = np.ones((1, start + n), dtype=np.int64)
        elif name == "position_ids":
            out[name] = np.arange(start, start + n, dtype=np.int64)[None]
        elif name.startswith("past_key_values."):
            if past is not None:
                out[name] = past[name]
            else:
                heads, width = item.shape[1], item.shape[3]
                width = width if isinstance(width, int) else head_size
                out[name] = np.zeros((1, heads, 0, width), dtype=np.float32)
        else:
            raise SystemExit(f"unexpected input {name} of {sess}")
    return out


def presents_as_past(sess: ort.InferenceSession, outputs: list) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return {name.replace("present.", "past_key_values."): value
            for name, value in zip(names, outputs, strict=True) if name.startswith("present.")}


def graph_pass_ms(speculant_graph: Path, genai_graph: Path, context: list[int], threads: int,
                  repeats: int, head_size: int) -> dict:
    sessions = {"speculant": session(speculant_graph, threads),
                "genai": session(genai_graph, threads)}
    state = {}
    for name, sess in sessions.items():
        prefill = sess.run(None, feeds(sess, context[:-1], None, 0, head_size))
        state[name] = feeds(sess, context[-1:], presents_as_past(sess, prefill),
                            len(context) - 1, head_size)
        first = sess.run(["logits"], state[name])[0]
        state[name + "_argmax"] = int(np.argmax(first[0, -1]))
    times = {name: [] for name in sessions}
    for _ in range(10 + repeats):
        for name, sess in sessions.items():
            started = time.perf_counter()
            sess.run(None, state[name])
            times[name].append(time.perf_counter() - started)
    nodes = {name: len(onnx.load(str(path), load_external_data=False).graph.node)
             for name, path in (("speculant", speculant_graph), ("genai", genai_graph))}
    return {name: {"median_ms": 1000 * float(np.median(values[10:])),
                   "min_ms": 1000 * float(np.min(values[10:])),
                   "max_ms": 1000 * float(np.max(values[10:])),
                   "graph_nodes": nodes[name]}
            for name, values in times.items()} | {
        "same_next_token": state["speculant_argmax"] == state["genai_argmax"]}


def generator_construction_ms(genai_model: Path, repeats: int = 20) -> dict | None:
    """Milliseconds to construct an ``og.Generator`` (once per request), when installed."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None
    model = og.Model(str(genai_model))
    times = []
    for _ in range(repeats + 2):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=128)
        started = time.perf_counter()
        og.Generator(model, params)
        times.append(time.perf_counter() - started)
    return {"median_ms": 1000 * float(np.median(times[2:])),
            "min_ms": 1000 * float(np.min(times[2:])), "repeats": repeats}


def profile_greedy(package: Path, prompts: list[list[int]], new_tokens: int, threads: int
                   ) -> tuple[dict, str]:
    engine = speculant.load(package, threads=threads)
    for prompt in prompts:
        engine.generate(prompt, new_tokens, stop_on_eos=False)
    profiler = cProfile.Profile()
    passes = 0
    started = time.perf_counter()
    profiler.enable()
    for prompt in prompts:
        passes += engine.generate(prompt, new_tokens, stop_on_eos=False).stats.target_passes
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    # cumulative time of ORT's Python wrapper InferenceSession.run_with_iobinding
    ort_s = sum(row[3] for key, row in stats.stats.items() if key[2] == "run_with_iobinding")
    total_s = stats.total_tt
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.strip_dirs().sort_stats("tottime").print_stats(15)
    return {"target_passes": passes, "wall_s_under_profiler": wall,
            "profiled_s": total_s, "in_run_with_iobinding_s": ort_s,
            "ms_per_pass": 1000 * total_s / passes,
            "ort_ms_per_pass": 1000 * ort_s / passes,
            "python_ms_per_pass": 1000 * (total_s - ort_s) / passes}, text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("genai_model", type=Path)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", type=int, default=96, help="cache length of the timed pass")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    prompts = read_prompts(args.prompts)
    context = [t for prompt in prompts for t in prompt][:args.cache + 1]
    genai_config = json.loads((args.genai_model / "genai_config.json").read_text())
    graphs = graph_pass_ms(args.package / "target" / "model.onnx",
                           args.genai_model / "model.onnx", context, args.threads,
                           args.repeats, genai_config["model"]["decoder"]["head_size"])
    loop, top = profile_greedy(args.package, prompts, args.new_tokens, args.threads)
    result = {"machine": machine(), "command": " ".join(["python", *sys.argv]),
              "onnxruntime": ort.__version__, "threads": args.threads,
              "cache_length": args.cache, "single_token_pass": graphs,
              "speculant_greedy_under_cprofile": loop,
              "genai_generator_construction": generator_construction_ms(args.genai_model)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "anchor_gap.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "anchor_gap.txt").write_text(json.dumps(result, indent=2) + "\n\n" + top)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
