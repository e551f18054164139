"""The CUDA kernels of a few steady-state decode tokens, for Nsight Compute.

    ncu --profile-from-start off --cache-control none --clock-control none \
        --metrics gpu__time_duration.sum --csv --print-units base \
        python scripts/kernel_timeline.py PACKAGE --proposer chained --k 4 --tokens 8 > k.csv
    python scripts/kernel_timeline.py --summarize k.csv

Loads the package on CUDA, decodes two prompts of ``docs/benchmarks/val8-prompts.json`` to
warm plans and CUDA graphs, then decodes ``--tokens`` more between ``cudaProfilerStart`` and
``cudaProfilerStop``, so Nsight Compute times exactly those kernels (graph replays included,
node by node). ``--summarize`` reads the CSV back: each kernel's duration in launch order
and the total by kernel name. Nsight Compute serializes kernels: the durations are the
kernels' own, without the launch gaps a CUDA graph replay also has.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import sys


def decode(args: argparse.Namespace) -> None:
    import cupy

    import speculant

    engine = speculant.load(args.package, "cuda")
    prompts = json.load(open("docs/benchmarks/val8-prompts.json"))
    options = dict(stop_on_eos=False)
    if args.proposer != "greedy":
        options.update(proposer=args.proposer, k=args.k if args.k == "auto" else int(args.k))
    for prompt in prompts[:2]:
        engine.generate(prompt, max_new_tokens=64, **options)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    engine.generate(prompts[2], max_new_tokens=args.tokens, **options)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()


def summarize(path: str) -> None:
    with open(path) as file:
        lines = [line for line in file if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    rows = [r for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]
    total: dict[str, list[float]] = collections.defaultdict(list)
    for row in rows:
        name = row["Kernel Name"][:90]
        ns = float(row["Metric Value"].replace(",", ""))
        total[name].append(ns)
        print(f"{ns / 1e3:8.2f} us  {name}")
    print(f"\n{len(rows)} kernels, {sum(sum(v) for v in total.values()) / 1e3:.1f} us in all")
    for name, values in sorted(total.items(), key=lambda item: -sum(item[1])):
        print(f"{sum(values) / 1e3:9.1f} us {len(values):5d}x  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package", nargs="?")
    parser.add_argument("--proposer", default="chained")
    parser.add_argument("--k", default="4")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--summarize")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    elif args.package:
        decode(args)
    else:
        sys.exit("a PACKAGE, or --summarize CSV")


if __name__ == "__main__":
    main()
