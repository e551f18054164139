"""k="auto"'s rule (speculative/auto_k.py) replayed on simulated acceptance, against fixed k.

    python scripts/auto_k_sim.py

Costs are the H200's realistic ~1B chained round (2026-12-03: a verify pass 1.12 ms + 8 µs a
token, a drafter step 77 µs, 0.07 ms a round besides); acceptance is drawn per round, either
independently (the first draft accepted 59 % of the time, later ones more, as measured) or
in runs: a two-state chain (easy 0.8 / hard 0.05 at every position) that switches with the
given probability each round. Prints decode tokens/s and greedy steps per 512 tokens, averaged
over seeds, for each acceptance smoothing weight. A model of the decode, not a measurement.
"""

from __future__ import annotations

import random
import statistics

from speculant.speculative import auto_k

MEASURED = [0.59, 0.71, 0.76, 0.81, 0.6, 0.56, 0.65, 0.5]  # p_i given the drafts before


def costs() -> auto_k.WidthCosts:
    return auto_k.WidthCosts(
        auto_k.WidthTable({n: (1.12 + 0.008 * n) / 1e3 for n in range(1, 10)}),
        {"chained": auto_k.WidthTable({k: 0.077e-3 * (k + 1) for k in range(1, 9)})}, 0.07e-3)


def decode(k: int | str, weight: float, seed: int, switch: float | None) -> tuple[float, int]:
    """(tokens/s, greedy steps) of 8 requests of 64 tokens."""
    auto_k.ACCEPTANCE_SMOOTHING = weight
    rng, table = random.Random(seed), costs()
    seconds = tokens = greedy = 0
    for _ in range(8):
        controller, made, easy = auto_k.WidthController(8), 0, rng.random() < 0.5
        while made < 64:
            if switch is not None and rng.random() < switch:
                easy = not easy
            width = controller.choose(table, "chained") if k == "auto" else k
            greedy += width == 0
            accepted = 1
            for i in range(width):
                p = MEASURED[i] if switch is None else (0.8 if easy else 0.05)
                if rng.random() >= p:
                    break
                accepted += 1
            controller.observe(width, accepted)
            seconds += ((table.propose_seconds("chained", 8)[width] if width else 0.0)
                        + table.verify_seconds(9)[width] + table.round_seconds)
            made, tokens = made + accepted, tokens + accepted
    return tokens / seconds, greedy


def main() -> None:
    for switch in (None, 0.15, 0.3, 0.5):
        name = "independent" if switch is None else f"runs, switch {switch}"
        for k, weight in ((4, 0.15), ("auto", 0.3), ("auto", 0.15), ("auto", 0.1)):
            runs = [decode(k, weight, seed, switch) for seed in range(40)]
            rate = statistics.fmean(r for r, _ in runs)
            steps = statistics.fmean(g for _, g in runs)  # per 512 tokens
            label = f"k={k}" if k != "auto" else f"auto, weight {weight}"
            print(f"{name:20s} {label:18s} {rate:7.0f} tok/s  greedy steps {steps:5.1f}")


if __name__ == "__main__":
    main()
