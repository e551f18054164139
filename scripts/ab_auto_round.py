"""k=auto with a greedy step's own round time against one time for every round, in one
process: two engines of one package, the second's controller counting every round's outside
time as a drafting round's (the rule before 2026-12-04), greedy and k=auto interleaved
repeat by repeat so a shared machine's drift hits both alike.

    uv run --extra cpu python scripts/ab_auto_round.py smollm2 \
        docs/benchmarks/smollm2-chat8-prompts.json

PROMPTS: a JSON list of token-id lists (or strings). Prints each runner's median tokens/s
(end to end) over 3 repeats of 64 tokens a prompt, EOS masked, and its ratio to greedy.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import types

import speculant
from speculant.speculative.width import WidthCosts


def main() -> None:
    speculant.share_cpu_pool()  # as the console script does
    package, prompts = sys.argv[1], json.load(open(sys.argv[2]))[:8]
    engines = {"greedy-step time": speculant.load(package, threads=2),
               "one round time": speculant.load(package, threads=2)}
    costs = engines["one round time"].proposer_sources.costs
    costs.observe_round = types.MethodType(
        lambda self, seconds, width=1: WidthCosts.observe_round(self, seconds, 1), costs)

    def run(engine, k: str) -> float:
        seconds, tokens = 0.0, 0
        for prompt in prompts:
            options = dict(max_new_tokens=64, stop_on_eos=False)
            if k != "greedy":
                options.update(proposer="chained", k=k)
            started = time.perf_counter()
            tokens += len(engine.generate(prompt, **options).token_ids)
            seconds += time.perf_counter() - started
        return tokens / seconds

    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(3):
        for name, engine in engines.items():
            for k in ("greedy", "auto"):
                rates.setdefault((name, k), []).append(run(engine, k))
    for (name, k), values in rates.items():
        greedy = statistics.median(rates[name, "greedy"])
        print(f"{name:17s} {k:6s} {statistics.median(values):7.1f} tok/s "
              f"{statistics.median(values) / greedy:.2f}x")


if __name__ == "__main__":
    main()
