"""How much of a queued chained round is the small kernels between its two graph replays
(the cursor's advance, the block's and positions' writes, the acceptance): the same decodes
with those kernels skipped (their outputs then stale: the tokens are wrong, the device work
otherwise the same), milliseconds a round side by side. An upper bound on what fusing them
could give, not a runner.

    python3 scripts/round_kernels_probe.py PACKAGE --device cuda --k 4 \
        --prompts docs/benchmarks/val8-prompts.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import speculant
from speculant.tensors.cuda import CudaBackend

SKIPPED = ("add_first", "take_at", "write_arange_from", "write_ids")


def ms_per_round(engine, prompts: list[list[int]], k: int, repeats: int) -> tuple[float, float]:
    """Median over repeats of (ms a round, tokens a round) over every prompt."""
    rounds, per_token = [], []
    for _ in range(repeats):
        seconds, num_rounds, num_tokens = 0.0, 0, 0
        for prompt in prompts:
            started = time.perf_counter()
            result = engine.generate(prompt, 64, stop_on_eos=False, proposer="chained", k=k)
            seconds += time.perf_counter() - started
            num_rounds += len(result.stats.trace)
            num_tokens += len(result.token_ids)
        rounds.append(1e3 * seconds / num_rounds)
        per_token.append(num_tokens / num_rounds)
    return statistics.median(rounds), statistics.median(per_token)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    engine = speculant.load(args.package, device=args.device)
    prompts = [p if isinstance(p, list) else engine.tokenizer.encode(p)
               for p in json.load(open(args.prompts))]
    ms_per_round(engine, prompts[:2], args.k, 1)  # warm: plans and graphs
    whole = ms_per_round(engine, prompts, args.k, args.repeats)
    kept = {name: getattr(CudaBackend, name) for name in SKIPPED}
    for name in SKIPPED:
        setattr(CudaBackend, name, lambda *a, **kw: None)
    skipped = ms_per_round(engine, prompts, args.k, args.repeats)
    for name, method in kept.items():
        setattr(CudaBackend, name, method)
    again = ms_per_round(engine, prompts, args.k, args.repeats)
    print(f"k={args.k}: ms a round (tokens a round), median of {args.repeats}")
    print(f"  whole round          {whole[0]:.3f} ({whole[1]:.2f})")
    print(f"  {', '.join(SKIPPED)} skipped  {skipped[0]:.3f} ({skipped[1]:.2f})")
    print(f"  whole round again    {again[0]:.3f} ({again[1]:.2f})")


if __name__ == "__main__":
    main()
