"""Where a decode's host time goes: cProfile over ``speculant generate``-style decodes of a
package (greedy, chained and prompt lookup at one k), the functions sorted by their own time,
then speculant's own sorted by cumulative time (where a round's host time goes, by caller).

    python scripts/profile_round.py PACKAGE --device cuda --k 4 \
        --prompts docs/benchmarks/val8-prompts.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import speculant


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", default="4")
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    engine = speculant.load(args.package, args.device)
    prompts = json.load(open(args.prompts))
    prompts = [engine.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    k = args.k if args.k == "auto" else int(args.k)
    for mode in ("greedy", "chained", "prompt_lookup"):
        options = dict(max_new_tokens=args.new_tokens, stop_on_eos=False)
        if mode != "greedy":
            options.update(proposer=mode, k=k)
        for prompt in prompts[:2]:  # warm: plans, graphs, kernels
            engine.generate(prompt, **options)
        profile = cProfile.Profile()
        started, tokens = time.perf_counter(), 0
        profile.enable()
        for prompt in prompts:
            tokens += len(engine.generate(prompt, **options).token_ids)
        profile.disable()
        seconds = time.perf_counter() - started
        print(f"== {mode}{'' if mode == 'greedy' else f' k={k}'}: {tokens} tokens, "
              f"{tokens / seconds:.0f} tok/s under the profiler")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        pstats.Stats(profile).sort_stats("cumulative").print_stats("speculant/", args.top)


if __name__ == "__main__":
    main()
