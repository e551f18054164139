"""k by load under load on the CPU (issue 40, item 4): greedy against ``k="auto"`` rows.

    uv run --extra cpu python scripts/probe_k_by_load.py --rows 8 --repeats 2
    uv run --extra cpu python scripts/probe_k_by_load.py --rows 8 --repeats 2 --unmade-unobserved
    uv run --extra cpu python scripts/probe_k_by_load.py --rows 8 --repeats 1 --steps

The built-in ``smollm2`` (a 16-row batched graph, built once into ~/.cache/speculant) loaded
with ``max_batch = rows``; ``2 × rows`` requests (at least 4) of the bundled prompts, 64 tokens
each (EOS masked), through ``Engine.generate_many``: greedy, prompt lookup and chained at
``k="auto"``, one warm-up of each, then the runners taking turns within each repeat. Prints
each run's aggregate tokens/s and the widths the step chose in its steps of ``rows`` rows.
``--unmade-unobserved``: the rule before a draft the proposer did not make counted as a
rejection (a row's acceptance observed over the drafts made only), for comparison.
``--steps``: also each run's steps, timed, by (rows, W), or ("prefill", rows) for a step in
which a row prefills (the decoding rows' time against the joining rows' prefill).
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import speculant
from speculant import GenerationOptions
from speculant.speculative import scheduler, step_width
from speculant_tools.builtin import smollm2

PROMPTS = Path(__file__).resolve().parents[1] / "src" / "speculant_bench" / "prompts.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--unmade-unobserved", action="store_true")
    parser.add_argument("--steps", action="store_true")
    args = parser.parse_args()
    if args.unmade_unobserved:
        def observe(self: step_width.RowWidth, result) -> None:
            if result.k:
                self.controller.observe(result.k, result.num_accepted)
        step_width.RowWidth.observe = observe
    chosen: collections.Counter[tuple[int, int]] = collections.Counter()
    choose = step_width.StepWidth.choose

    def counted(self: step_width.StepWidth, rows, num_run: int) -> int:
        width = choose(self, rows, num_run)
        chosen[len(rows), width] += 1
        step_key[:] = [(len(rows), width)]
        return width

    step_width.StepWidth.choose = counted
    step_key: list[tuple] = []
    steps: collections.defaultdict[tuple, list[float]] = collections.defaultdict(
        lambda: [0, 0.0])
    step = scheduler.Scheduler.step

    def timed(self: scheduler.Scheduler) -> bool:
        step_key.clear()
        started = time.perf_counter()
        ran = step(self)
        key = step_key[0] if step_key else ("prefill", sum(e is not None for e in self.rows))
        steps[key][0] += 1
        steps[key][1] += time.perf_counter() - started
        return ran

    if args.steps:
        scheduler.Scheduler.step = timed
    engine = speculant.load(smollm2("cpu", batch=16), max_batch=args.rows)
    prompts = (json.loads(PROMPTS.read_text()) * 8)[:max(4, 2 * args.rows)]
    runners = {"greedy": None, "prompt_lookup": "prompt_lookup", "chained": "chained"}

    def run(proposer: str | None) -> float:
        options = GenerationOptions(max_new_tokens=64, stop_on_eos=False, proposer=proposer,
                                    k="auto")
        started = time.perf_counter()
        generations = engine.generate_many(prompts, options)
        return sum(len(g.token_ids) for g in generations) / (time.perf_counter() - started)

    for proposer in runners.values():  # warm-up: builds the sessions, measures the costs
        run(proposer)
    rates = collections.defaultdict(list)
    for repeat in range(args.repeats):
        for name, proposer in runners.items():
            chosen.clear()
            steps.clear()
            rates[name].append(run(proposer))
            widths = sorted((w, n) for (b, w), n in chosen.items() if b == args.rows)
            print(f"repeat {repeat} {name:14s} {rates[name][-1]:6.1f} tok/s; "
                  f"(W, steps) at {args.rows} rows: {widths}", flush=True)
            if args.steps:
                print("  steps (count, seconds):", {key: (n, round(seconds, 2)) for key, (
                    n, seconds) in sorted(steps.items(), key=str)}, flush=True)
    for name, values in rates.items():
        print(name, " ".join(f"{value:.1f}" for value in values))


if __name__ == "__main__":
    main()
