"""`speculant bench --concurrency 1,4,16`: requests decoded together by the engine's scheduler
(continuous batching, speculative/scheduler.py) beside the same requests one at a time through
``engine.generate`` (the single-request path), for greedy and each proposer the scheduler takes.

Each level ``N`` is a closed loop: N clients, each sending its next request as soon as its
last one ended, over the prompt set cycled to ``max(len(prompts), 2 N)`` requests (EOS
masked: every request decodes its prompt's token count). The clock of a request starts when
it is submitted; its first token's time (TTFT) and its last are taken after the step that
committed them. Reported per runner and level: aggregate output tokens/s over the wall time,
that over the same runner's one-at-a-time rate, per-request tokens/s (p50), TTFT and time per
output token after the first (TPOT), p50 and p99, and the mean accepted length. Runners and
levels are interleaved within each repeat, so the machine's drift touches them alike; the
aggregate rate is the median over repeats.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speculant.engine import Engine
from speculant.errors import RequestError
from speculant_bench.prompts import PromptSet
from speculant_bench.runners import Runner

ONE_AT_A_TIME = 0  # the level of the single-request path (engine.generate, one after another)


@dataclass
class RequestTimes:
    submitted: float
    first_at: float | None = None
    last_at: float | None = None
    num_tokens: int = 0
    rounds: int = 0
    accepted: int = 0

    @property
    def latency_s(self) -> float:
        return (self.last_at or self.submitted) - self.submitted

    @property
    def tpot_s(self) -> float | None:
        if self.num_tokens < 2 or self.first_at is None or self.last_at is None:
            return None
        return (self.last_at - self.first_at) / (self.num_tokens - 1)


def requests_of(prompts: PromptSet, clients: int) -> list[tuple[Sequence[int], int]]:
    """(prompt ids, tokens to decode) for a level of ``clients``: the set cycled."""
    count = max(len(prompts.prompts), 2 * clients)
    return [(prompts.prompts[i % len(prompts.prompts)],
             prompts.new_tokens[i % len(prompts.prompts)]) for i in range(count)]


def closed_loop(engine: Engine, runner: Runner, requests: list[tuple[Sequence[int], int]],
                clients: int) -> tuple[list[RequestTimes], float]:
    """The requests through the scheduler, at most ``clients`` at once; their times and the
    wall time."""
    scheduler, waiting, active, done = engine.scheduler, deque(requests), [], []
    started = time.perf_counter()
    while waiting or active:
        while waiting and len(active) < clients:
            prompt, new_tokens = waiting.popleft()
            handle = engine.submit(list(prompt), runner.options(new_tokens))
            active.append((handle, RequestTimes(time.perf_counter())))
        scheduler.step()
        now = time.perf_counter()
        for handle, times in list(active):
            generated = handle.state.num_generated
            if generated > times.num_tokens:
                times.first_at = times.first_at or now
                times.last_at, times.num_tokens = now, generated
            if handle.is_finished:
                handle.result  # noqa: B018 -- raises the request's error, if it had one
                stats = handle.stats
                times.rounds, times.accepted = stats.rounds, stats.accepted_drafts
                active.remove((handle, times))
                done.append(times)
    return done, time.perf_counter() - started


def one_at_a_time(engine: Engine, runner: Runner, requests: list[tuple[Sequence[int], int]]
                  ) -> tuple[list[RequestTimes], float]:
    """The requests through ``engine.generate``, one after another."""
    done = []
    started = time.perf_counter()
    for prompt, new_tokens in requests:
        submitted = time.perf_counter()
        result = engine.generate(list(prompt), runner.options(new_tokens))
        done.append(RequestTimes(submitted, submitted + result.time_to_first_token_s,
                                 submitted + result.total_s, len(result.token_ids),
                                 result.stats.rounds, result.stats.accepted_drafts))
    return done, time.perf_counter() - started


def why_not_batched(engine: Engine, runner: Runner, prompt: Sequence[int]) -> str | None:
    """None when the scheduler takes ``runner``'s requests; otherwise its reason."""
    try:
        engine.submit(list(prompt), runner.options(2)).close()
    except RequestError as error:
        return str(error)
    return None


def run_concurrency(engine: Engine, runners: Sequence[Runner], prompts: PromptSet,
                    levels: Sequence[int], repeats: int, warmup: int) -> dict:
    """Every runner the scheduler takes at ONE_AT_A_TIME and each level, ``warmup`` untimed
    then ``repeats`` timed passes, interleaved; the report's runners and skipped ones."""
    taken, skipped = [], []
    for runner in runners:
        reason = why_not_batched(engine, runner, prompts.prompts[0])
        (taken if reason is None else skipped).append(runner if reason is None
                                                      else {"runner": runner.name,
                                                            "reason": reason})
    all_levels = [ONE_AT_A_TIME, *levels]
    samples: dict[tuple[str, int], list[tuple[list[RequestTimes], float]]] = {}
    for repeat in range(warmup + repeats):
        for runner in taken:
            for level in all_levels:
                requests = requests_of(prompts, max(level, 1))
                run = one_at_a_time(engine, runner, requests) if level == ONE_AT_A_TIME \
                    else closed_loop(engine, runner, requests, level)
                if repeat >= warmup:
                    samples.setdefault((runner.name, level), []).append(run)
    rows = [summarize(name, level, runs) for (name, level), runs in samples.items()]
    alone = {r["runner"]: r["tokens_per_s"] for r in rows if r["clients"] == ONE_AT_A_TIME}
    for row in rows:
        row["x_one_at_a_time"] = row["tokens_per_s"] / alone[row["runner"]]
    return {"levels": list(levels), "repeats": repeats, "warmup": warmup, "rows": rows,
            "skipped": skipped}


def summarize(name: str, level: int, runs: list[tuple[list[RequestTimes], float]]) -> dict:
    every = [t for times, _ in runs for t in times]
    rates = [sum(t.num_tokens for t in times) / wall for times, wall in runs]
    ttft = np.array([(t.first_at or t.submitted) - t.submitted for t in every])
    tpot = np.array([t.tpot_s for t in every if t.tpot_s is not None] or [np.nan])
    per_request = np.array([t.num_tokens / t.latency_s for t in every if t.latency_s > 0])
    rounds = sum(t.rounds for t in every)
    return {"runner": name, "clients": level, "num_requests": len(every) // len(runs),
            "tokens_per_s": statistics.median(rates), "tokens_per_s_per_repeat": rates,
            "request_tokens_per_s_p50": float(np.percentile(per_request, 50)),
            "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
            "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99)),
            "tpot_p50_ms": 1000 * float(np.percentile(tpot, 50)),
            "tpot_p99_ms": 1000 * float(np.percentile(tpot, 99)),
            "mean_accepted_length": 1 + sum(t.accepted for t in every) / rounds
            if rounds else None}


def concurrency_markdown(report: dict) -> str:
    lines = [f"`{report['command']}`", "", f"{report['machine']}; package "
             f"`{report['package']}`, device {report['device']}; prompts: {report['prompts']}; "
             f"{report['repeats']} timed repeats (median aggregate rate) after "
             f"{report['warmup']} untimed; 1-minute load average {report['load_average']:.1f}",
             "", "| runner | clients | tok/s | × one at a time | tok/s per request p50 | "
             "TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | mean accepted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        clients = "one at a time" if r["clients"] == ONE_AT_A_TIME else str(r["clients"])
        accepted = "–" if r["mean_accepted_length"] is None else \
            f"{r['mean_accepted_length']:.2f}"
        lines.append(f"| {r['runner']} | {clients} | {r['tokens_per_s']:.1f} | "
                     f"{r['x_one_at_a_time']:.2f}× | {r['request_tokens_per_s_p50']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
                     f"{r['tpot_p50_ms']:.1f} | {r['tpot_p99_ms']:.1f} | {accepted} |")
    for skipped in report["skipped"]:
        lines.append(f"\nskipped {skipped['runner']}: {skipped['reason']}")
    return "\n".join(lines) + "\n"
