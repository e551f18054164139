"""What keyed Gumbel-max acceptance costs against rejection sampling, in accepted drafts.

    uv run --extra cpu python scripts/acceptance_methods.py [--prompts 8] [--seeds 2] [--k 4]

Decodes the first ``--prompts`` of the demo package's ``val_prompts.json`` with its chained
drafter at a fixed ``k`` (so that both methods verify the same widths), sampling at
temperature 0.8 and top-p 0.9 (the issue's settings), once per seed and method, 64 tokens
each, and prints per method the mean accepted length (committed tokens per verification
pass, over all rounds; ± the standard error of the per-run means) and the fraction of drafts
accepted.
Only acceptance is compared: timings on a shared CPU say nothing, and a round costs the same
under either method but for the noise (one hash per id and row).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import speculant

DEMO = Path(speculant.__file__).parent / "demo"
METHODS = ("gumbel", "rejection")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.9)
    args = parser.parse_args()
    engine = speculant.load(DEMO)
    prompts = json.loads((DEMO / "val_prompts.json").read_text())["prompts"][:args.prompts]
    print(f"demo pair, chained, k={args.k}, temperature {args.temperature}, top-p "
          f"{args.top_p}, {len(prompts)} val_prompts x {args.seeds} seeds x 64 tokens")
    print("| acceptance | rounds | mean accepted length | drafts accepted |")
    print("|---|---:|---:|---:|")
    for method in METHODS:
        pairs: list[tuple[int, int]] = []
        run_means: list[float] = []
        for prompt in prompts:
            for seed in range(args.seeds):
                result = engine.generate(prompt["prompt"], 64, proposer="chained", k=args.k,
                                         temperature=args.temperature, top_p=args.top_p,
                                         seed=seed, acceptance=method, stop_on_eos=False)
                pairs += result.stats.trace
                run_means.append(result.stats.mean_accepted_length)
        mean_length = sum(a for _, a in pairs) / len(pairs)
        error = statistics.stdev(run_means) / len(run_means) ** 0.5
        accepted = sum(a - 1 for _, a in pairs) / sum(k for k, _ in pairs)
        print(f"| {method} | {len(pairs)} | {mean_length:.3f} ± {error:.3f} | "
              f"{accepted:.3f} |")


if __name__ == "__main__":
    main()
