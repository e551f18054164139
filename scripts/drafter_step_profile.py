"""One chained-drafter step of a package on the CPU, under ONNX Runtime's profiler.

    python scripts/drafter_step_profile.py PACKAGE [THREADS]

Builds the package's step graph (``chain_graph.step_component``), feeds it placeholder
inputs (capacity 512, batch and sequence 1), runs it 300 times with profiling on and prints
the mean time of a run and the nodes that took longest. Profiling adds time to every node:
compare packages with one another, not with a decode."""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

import speculant
from speculant.speculative.chain_graph import step_component

CAPACITY = 512


def main() -> None:
    package, threads = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    step = step_component(speculant.load(package).package)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    session = ort.InferenceSession(step.source, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else CAPACITY if d == "capacity" else 1
                 for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = np.full(shape, 3, np.int64 if "int64" in i.type else np.int32)
        else:
            dtype = np.float32 if i.type == "tensor(float)" else np.float16
            feeds[i.name] = np.random.default_rng(0).random(shape).astype(dtype)
    for _ in range(20):
        session.run(None, feeds)
    started = time.perf_counter()
    for _ in range(300):
        session.run(None, feeds)
    print(f"{(time.perf_counter() - started) / 300 * 1e3:.3f} ms a run (profiling on), "
          f"{len(step.ports.inputs)} inputs")
    path = session.end_profiling()
    with open(path) as file:
        events = json.load(file)
    os.remove(path)
    nodes: dict[tuple[str, str], float] = collections.defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            nodes[event["args"]["op_name"], event["name"][:-12]] += event["dur"] / 320
    print(f"{sum(nodes.values()):.1f} us of nodes a run")
    for (op, name), us in sorted(nodes.items(), key=lambda item: -item[1])[:12]:
        print(f"{us:8.1f} us  {op:30s} {name}")


if __name__ == "__main__":
    main()
