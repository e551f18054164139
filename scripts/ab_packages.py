"""Packages side by side in one process: greedy and chained decoding of chat prompts, each
package's runners interleaved repeat by repeat, so drift on a shared machine hits all alike
(``speculant bench`` times one package per run).

    uv run --extra cpu python scripts/ab_packages.py fp32=PATH,int4=PATH 1,4,auto \
        docs/benchmarks/2026-12-02-cpu-smollm2/prompts.json 8 64

Prints, per package, each runner's median tokens/s over 3 repeats (end to end: admission,
prefill and decode), its ratio to that package's greedy, and its mean accepted length.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import speculant


def main() -> None:
    speculant.share_cpu_pool()  # as the console script does
    packages = dict(item.split("=") for item in sys.argv[1].split(","))
    widths = sys.argv[2].split(",")
    prompts = json.load(open(sys.argv[3]))[:int(sys.argv[4])]
    num_tokens = int(sys.argv[5])
    engines = {name: speculant.load(path, threads=2) for name, path in packages.items()}
    chats = [[{"role": "user", "content": prompt}] for prompt in prompts]

    def run(engine, k: str) -> tuple[float, float]:
        seconds, accepted = 0.0, []
        for chat in chats:
            options = dict(max_new_tokens=num_tokens, stop_on_eos=False)
            if k != "greedy":
                options.update(proposer="chained", k=k if k == "auto" else int(k))
            started = time.perf_counter()
            result = engine.chat(chat, **options)
            seconds += time.perf_counter() - started
            if k != "greedy":
                accepted.append(result.stats.mean_accepted_length)
        return len(chats) * num_tokens / seconds, statistics.fmean(accepted) if accepted else 0

    runners = [(name, k) for name in engines for k in ["greedy", *widths]]
    for name, k in runners:  # warm-up: plans, sessions
        run(engines[name], k)
    rates: dict = {runner: [] for runner in runners}
    accepted: dict = {}
    for _ in range(3):
        for name, k in runners:
            rate, accepted[name, k] = run(engines[name], k)
            rates[name, k].append(rate)
    for name in engines:
        greedy = statistics.median(rates[name, "greedy"])
        print(name, {k: (round(statistics.median(rates[name, k]), 1),
                         round(statistics.median(rates[name, k]) / greedy, 3),
                         round(accepted[name, k], 2)) for k in ["greedy", *widths]})


if __name__ == "__main__":
    main()
