"""cProfile of chained decoding: where a round's Python time goes.

    uv run --extra cpu python scripts/profile_chained.py PACKAGE --prompts FILE --k 4 \
        --new-tokens 64 --threads 1 --out profile.txt
    python scripts/profile_chained.py PACKAGE --prompts FILE --device cuda --k 0 --out greedy.txt

Loads the package, decodes every prompt once untimed (warm-up), then profiles one pass over
the prompt set with ``speculative=True, k=K`` (``--k 0``: plain greedy; EOS masked) and
writes the top 20 functions by own time (tottime) and by cumulative time, with the run's
totals. The ONNX Runtime work shows as ``InferenceSession.run_with_iobinding``; everything
else is the runtime's Python.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import time
from pathlib import Path

import speculant
from speculant_bench.report import machine


def read_prompts(path: Path) -> list[list[int]]:
    items = json.loads(path.read_text())
    if isinstance(items, dict):
        items = [item["prompt"] for item in items["prompts"]]
    return [list(item) for item in items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None,
                        help="ONNX Runtime intra-op threads (default: 1 on the CPU, ORT's on CUDA)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--proposer", default="chained")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    threads = args.threads if args.threads or args.device != "cpu" else 1
    engine = speculant.load(args.package, device=args.device, threads=threads)
    prompts = read_prompts(args.prompts)
    options = ({"stop_on_eos": False, "speculative": True, "k": args.k, "proposer": args.proposer}
               if args.k else {"stop_on_eos": False})
    for prompt in prompts:
        engine.generate(prompt, args.new_tokens, **options)

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    passes = rounds = 0
    for prompt in prompts:
        result = engine.generate(prompt, args.new_tokens, **options)
        passes += result.stats.target_passes
        rounds += result.stats.rounds
    profiler.disable()
    wall = time.perf_counter() - started

    text = io.StringIO()
    runner = f"{args.proposer} k={args.k}" if args.k else "greedy"
    text.write(f"cProfile: {runner} on {args.device}, {len(prompts)} prompts x "
               f"{args.new_tokens} new tokens, package {args.package}, threads {threads}\n"
               f"machine: {machine()['cpu']} ({machine()['cores']['usable']} usable CPUs), python "
               f"{platform.python_version()}; wall {wall:.3f} s under the profiler, "
               f"{passes} target passes, {rounds} rounds\n\n")
    for order in ("tottime", "cumulative"):
        text.write(f"== top 20 by {order}\n")
        stats = pstats.Stats(profiler, stream=text)
        stats.strip_dirs().sort_stats(order).print_stats(20)
    args.out.write_text(text.getvalue())
    print(text.getvalue())


if __name__ == "__main__":
    main()
