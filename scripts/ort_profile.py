"""ONNX Runtime's own profiler on a package's target: which kernels a decode pass runs.

    python scripts/ort_profile.py PACKAGE --device cuda --context 128 --width 1 --runs 20 \
        --out profile.json

Builds the target's session as speculant does (same provider and options, profiling on),
binds one pass's inputs once (token ids, positions, mask, and caches of ``--context``
positions of random values: timing does not depend on their values), runs it ``--runs``
times after 5 untimed runs, and summarizes ORT's trace: kernels per pass, the time of the
kernels by operator type, and the pass's wall time against the sum of its kernel times (the
difference is ORT launching them). Writes the summary as JSON and prints it as a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

import speculant
from speculant.session.binding import bind_input
from speculant.tensors import NUMPY_DTYPES, Value

WARMUP = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--width", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    engine = speculant.load(args.package, device=args.device, threads=args.threads)
    component = engine.sessions[engine.package.plan.target]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = "/tmp/speculant_ort_profile"  # the raw trace stays there
    if args.threads is not None:
        options.intra_op_num_threads = args.threads
    providers = (["CPUExecutionProvider"] if args.device == "cpu" else
                 [("CUDAExecutionProvider", component.provider_options["CUDAExecutionProvider"])])
    session = ort.InferenceSession(engine.package.model_source(engine.package.plan.target),
                                   options, providers=providers)

    rng = np.random.default_rng(0)
    seam, residency = engine.seam, engine.device
    binding = session.io_binding()
    keep = []
    for item in session.get_inputs():
        dims = [d if isinstance(d, int) else None for d in item.shape]
        dtype = {"tensor(float)": "float32", "tensor(float16)": "float16",
                 "tensor(int64)": "int64"}[item.type]
        if item.name == "input_ids":
            array = rng.integers(0, 100, (1, args.width))
        elif item.name == "position_ids":
            array = np.arange(args.context, args.context + args.width)[None]
        elif item.name == "attention_mask":
            array = np.ones((1, args.context + args.width))
        else:  # a cache [1, KV, past, d]
            array = rng.standard_normal((1, dims[1], args.context, dims[3]))
        value = Value.host(np.asarray(array).astype(NUMPY_DTYPES[dtype]), dtype)
        value = seam.adopt(value, residency) if residency != "host" else value
        keep.append(value)
        bind_input(binding, item.name, value, seam.backend(value.residency))
    for item in session.get_outputs():
        if residency == "host":
            binding.bind_output(item.name, "cpu")
        else:
            binding.bind_output(item.name, "cuda", int(residency.split(":")[1]))

    walls = []
    for run in range(WARMUP + args.runs):
        started = time.perf_counter()
        session.run_with_iobinding(binding)
        if run >= WARMUP:
            walls.append(time.perf_counter() - started)
    trace = json.loads(Path(session.end_profiling()).read_text())

    runs = [e for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"]
    timed_runs = runs[WARMUP:]
    first = timed_runs[0]["ts"] if timed_runs else 0
    kernels = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
               and e["ts"] >= first]
    by_op: dict[str, list[float]] = defaultdict(list)
    for event in kernels:
        by_op[event["args"].get("op_name", "?")].append(event["dur"])
    per_pass_us = sum(e["dur"] for e in kernels) / max(len(timed_runs), 1)
    summary = {
        "package": str(args.package), "device": args.device, "context": args.context,
        "width": args.width, "runs": len(timed_runs),
        "providers": session.get_providers(),
        "wall_ms_median": statistics.median(walls) * 1000,
        "model_run_ms_median": statistics.median(e["dur"] for e in timed_runs) / 1000,
        "kernels_per_pass": len(kernels) / max(len(timed_runs), 1),
        "kernel_ms_per_pass": per_pass_us / 1000,
        "by_op": sorted(({"op": op, "kernels_per_pass": len(d) / len(timed_runs),
                          "ms_per_pass": sum(d) / len(timed_runs) / 1000}
                         for op, d in by_op.items()), key=lambda r: -r["ms_per_pass"]),
        "note": "kernel times are ORT's node timings (host-side for CUDA nodes: launch and any "
                "wait inside the node), summed per pass",
    }
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"{args.package} on {args.device}: {summary['kernels_per_pass']:.0f} nodes per pass, "
          f"wall {summary['wall_ms_median']:.3f} ms, ORT model_run "
          f"{summary['model_run_ms_median']:.3f} ms, node time {per_pass_us / 1000:.3f} ms")
    for row in summary["by_op"][:12]:
        print(f"  {row['op']:<36} {row['kernels_per_pass']:6.1f} nodes  "
              f"{row['ms_per_pass']:8.3f} ms")


if __name__ == "__main__":
    main()
