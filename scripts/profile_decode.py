"""Where a decode's time goes, for one package on one device.

    python scripts/profile_decode.py PACKAGE --what round [--device cuda] [--k 4] [--prompts FILE]
    python scripts/profile_decode.py PACKAGE --what ort [--device cuda] [--width 5] [--context 128]

``round``: cProfile over decodes of the prompt set (greedy, then each ``--proposer`` at ``--k``),
after two warm-up decodes each; prints the functions by their own time, then speculant's by
cumulative time. ``ort``: ONNX Runtime's own profiler on the target graph alone, one pass of
``--width`` tokens over a cache of ``--context`` positions (random values: the timing does not
depend on them), bound once and run ``--runs`` times; prints the kernels per pass and their time
by operator. Neither changes the runtime: ``round`` decodes through ``speculant.load``, ``ort``
opens the target's model file in a session of its own.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import speculant

WARMUP_RUNS = 5
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def profile_round(engine: speculant.Engine, args: argparse.Namespace) -> None:
    prompts = json.loads(Path(args.prompts).read_text())
    prompts = [engine.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    k = args.k if args.k == "auto" else int(args.k)
    for proposer in [None, *args.proposer]:
        options = {"max_new_tokens": args.new_tokens, "stop_on_eos": False}
        if proposer is not None:
            options.update(proposer=proposer, k=k)
        for prompt in prompts[:2]:  # plans, graphs and kernels are made on first use
            engine.generate(prompt, **options)
        profiler, tokens = cProfile.Profile(), 0
        started = time.perf_counter()
        profiler.enable()
        for prompt in prompts:
            tokens += len(engine.generate(prompt, **options).token_ids)
        profiler.disable()
        seconds = time.perf_counter() - started
        print(f"== {proposer or 'greedy'}{f' k={k}' if proposer else ''}: {tokens} tokens, "
              f"{tokens / seconds:.0f} tok/s under the profiler")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats("speculant/", args.top)


def profile_ort(engine: speculant.Engine, args: argparse.Namespace) -> None:
    import onnxruntime as ort

    package = engine.package
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort_profile")
    on_cuda = args.device.startswith("cuda")
    ordinal = int(args.device.split(":")[1]) if ":" in args.device else 0
    providers = ([("CUDAExecutionProvider", {"device_id": ordinal})] if on_cuda
                 else ["CPUExecutionProvider"])
    session = ort.InferenceSession(package.model_source(package.plan.target), options,
                                   providers=providers)
    rng, binding, kept = np.random.default_rng(0), session.io_binding(), []
    for item in session.get_inputs():
        if item.name.endswith("input_ids"):
            array = rng.integers(0, 100, (1, args.width))
        elif item.name.endswith("position_ids"):
            array = np.arange(args.context, args.context + args.width)[None]
        elif item.name.endswith("attention_mask"):
            array = np.ones((1, args.context + args.width))
        else:  # a cache [1, kv_heads, past, head_dim]
            array = rng.standard_normal((1, item.shape[1], args.context, item.shape[3]))
        value = ort.OrtValue.ortvalue_from_numpy(array.astype(ORT_DTYPES[item.type]),
                                                 "cuda" if on_cuda else "cpu", ordinal)
        kept.append(value)
        binding.bind_ortvalue_input(item.name, value)
    for item in session.get_outputs():
        binding.bind_output(item.name, "cuda" if on_cuda else "cpu", ordinal)
    for _ in range(WARMUP_RUNS):
        session.run_with_iobinding(binding)
    walls = []
    for _ in range(args.runs):
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        walls.append(time.perf_counter() - started)
    trace = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"]
    first_timed = runs[WARMUP_RUNS]["ts"]
    kernels = [e for e in trace if e.get("cat") == "Node" and e["ts"] >= first_timed
               and e["name"].endswith("_kernel_time")]
    by_op: dict[str, list[float]] = defaultdict(list)
    for event in kernels:
        by_op[event["args"].get("op_name", "?")].append(event["dur"])
    wall_ms = statistics.median(walls) * 1e3
    kernel_ms = sum(e["dur"] for e in kernels) / args.runs / 1e3
    print(f"{args.package} on {args.device}, width {args.width}, context {args.context}: "
          f"{len(kernels) / args.runs:.0f} kernels a pass, wall {wall_ms:.3f} ms, "
          f"kernel time {kernel_ms:.3f} ms")
    for op, durations in sorted(by_op.items(), key=lambda item: -sum(item[1]))[:args.top]:
        print(f"  {op:<36} {len(durations) / args.runs:6.1f} a pass "
              f"{sum(durations) / args.runs / 1e3:8.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--what", choices=("round", "ort"), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--k", default="4", help="round: drafts a round, or auto")
    parser.add_argument("--proposer", action="append", default=None,
                        help="round: proposers after greedy (repeatable; default chained)")
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--width", type=int, default=1, help="ort: tokens a pass")
    parser.add_argument("--context", type=int, default=128, help="ort: cached positions")
    parser.add_argument("--runs", type=int, default=20, help="ort: timed passes")
    args = parser.parse_args()
    args.proposer = args.proposer or ["chained"]
    engine = speculant.load(args.package, device=args.device, threads=args.threads)
    (profile_round if args.what == "round" else profile_ort)(engine, args)


if __name__ == "__main__":
    main()
