"""Where k="auto" loses to a fixed k on a device, in one process: greedy, fixed k=4, auto,
auto with its controller pinned to 4 (its timing and observers kept: the machinery's cost at
k=4's widths) and each with two rounds queued instead of one, interleaved repeat by repeat.
Then the controller's estimates after the runs: t_propose(k), t_verify(n), t_round and the
widths it chose.

    python3 scripts/ab_auto_gpu.py PACKAGE --repeats 5 --prompts docs/benchmarks/val8-prompts.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import speculant
from speculant.speculative import auto_k
from speculant_bench.timing import prompts_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", default="docs/benchmarks/val8-prompts.json")
    args = parser.parse_args()
    engine = speculant.load(args.package, device="cuda")
    prompts = json.load(open(args.prompts))[:8]
    choose, chosen = auto_k.WidthController.choose, collections.Counter()

    def recorded(self, costs, kind):
        width = choose(self, costs, kind)
        chosen[width] += 1
        return width

    def pinned(self, costs, kind):
        recorded(self, costs, kind)  # its work, not its width
        return 4

    def run(k, pin: bool, ahead: int) -> tuple[float, list[list[int]]]:
        auto_k.WidthController.choose = pinned if pin else recorded
        engine.target.ahead = ahead
        return prompts_rate(engine, prompts, k)

    runners = {"greedy": (None, False, 1), "k=4": (4, False, 1), "auto": ("auto", False, 1),
               "auto pinned 4": ("auto", True, 1), "k=4 ahead 2": (4, False, 2),
               "auto ahead 2": ("auto", False, 2)}
    want = run(None, False, 1)[1]
    for spec in runners.values():
        assert run(*spec)[1] == want
    rates: dict[str, list[float]] = {name: [] for name in runners}
    chosen.clear()
    for _ in range(args.repeats):
        for name, spec in runners.items():
            if name == "auto":
                before = collections.Counter(chosen)
            rate, outputs = run(*spec)
            if name == "auto":
                auto_widths = chosen - before
            assert outputs == want, name
            rates[name].append(rate)
    greedy = statistics.median(rates["greedy"])
    for name, values in rates.items():
        print(f"{name:14s} {statistics.median(values):8.1f} tok/s  "
              f"{statistics.median(values) / greedy:.3f}x greedy  "
              f"(repeats: {' '.join(f'{v:.0f}' for v in values)})")
    costs = engine.proposer_sources.costs
    print("auto's widths in its last repeat:", dict(sorted(auto_widths.items())))
    print("t_propose(k) ms:", [round(s * 1e3, 3) for s in costs.propose_seconds("chained", 8)])
    print("t_verify(n) ms:", [round(s * 1e3, 3) for s in costs.verify_seconds(9)])
    print(f"t_round ms: {costs.round_seconds * 1e3:.3f}, greedy step's "
          f"{(costs.greedy_round_seconds or 0) * 1e3:.3f}")


if __name__ == "__main__":
    main()
