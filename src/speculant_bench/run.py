"""One bench run: load once, check each runner, warm up, time the repeats, summarize.

Every runner decodes every prompt to exactly its tokens (``PromptSet.new_tokens``: ``new_tokens``
each, or on Spec-Bench each question's answer length; EOS masked) on the same engine (the same
sessions and thread count). Runners interleave prompt by prompt, in an order
that rotates, so drift and position in the sequence hit them alike, and each speedup is a
ratio within one invocation. A repeat is one pass of every runner over the whole prompt set.

Anchors (``anchors=("hf", "genai")``, :mod:`speculant_bench.anchors`) are more runners in the
same rotation: other runtimes decoding the same weights with the same thread count, each
producing the same record per decode (tokens, time to first token, total time).

Compared packages (``compare=(("int4", path), ...)``, :mod:`speculant_bench.compared`) are
more runners in the same rotation too: the package's runners on another package's engine.

Spec-Bench (``spec_bench=True``, :mod:`speculant_bench.spec_bench`): the prompts are its
questions' first turns, ``per_category`` of each category, and ``new_tokens`` caps each answer.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from itertools import chain, cycle, islice
from pathlib import Path

from speculant.engine import Engine, load
from speculant.workflow.request import Admitted
from speculant_bench import limits
from speculant_bench.anchors import AnchorRunner, AnchorSetup, prepare_anchors
from speculant_bench.compared import ComparedPackage, PackageRunner, load_compared
from speculant_bench.prompts import PromptSet, find_prompt_file, fit_prompts, read_prompts
from speculant_bench.runners import KS, PROPOSERS, Runner, Width, runner_list, why_unavailable
from speculant_bench.spec_bench.prompts import SpecBenchSet, answer_lengths, spec_bench_prompts
from speculant_bench.spread import Spread
from speculant_bench.timing import (
    VERIFY_WIDTHS,
    WIDTH_REPEATS,
    WIDTH_WARMUP,
    InvokeClock,
    WidthTiming,
    verify_width_curve,
)

WIDTH_CACHE_LENGTH = 128  # cache length of the verify-width curve, when the context allows


@dataclass(frozen=True)
class BenchConfig:
    package: Path
    device: str = "cpu"
    draft: Path | None = None  # a greedy-decoder package: the draft model of proposer "draft"
    prompts_file: Path | None = None
    new_tokens: int = 32  # N: tokens every runner decodes per prompt (Spec-Bench: at most)
    warmup: int = 1  # untimed passes over the prompt set, per runner
    repeats: int = 5  # timed passes over the prompt set, per runner
    threads: int | None = None  # ORT intra-op threads; None: every CPU this process may use
    proposers: tuple[str, ...] = PROPOSERS
    ks: tuple[Width, ...] = KS  # fixed widths and/or "auto"
    widths: tuple[int, ...] = VERIFY_WIDTHS  # block sizes k + 1 of the verify-width curve
    width_repeats: int = WIDTH_REPEATS  # timed passes of each verify width
    anchors: tuple[str, ...] = ()  # other runtimes in the same run: "hf", "genai"
    anchor_dir: Path | None = None  # their checkpoints and models (None: a temporary folder)
    genai_model: Path | None = None  # a folder genai's builder made (None: build one here)
    chat: bool = False  # text prompts are user messages, rendered by the chat template
    compare: tuple[tuple[str, str], ...] = ()  # (label, path): packages timed beside it
    spec_bench: bool = False  # the prompts are Spec-Bench's first turns (replaces prompts_file)
    per_category: int | None = None  # Spec-Bench questions per category (None: all)

    @property
    def resolved_threads(self) -> int | None:
        """The same count for every CPU runner; CUDA sessions keep ORT's default."""
        if self.threads is not None or self.device != "cpu":
            return self.threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count()


@dataclass
class Sample:
    """One timed decode of one prompt."""

    token_ids: list[int]
    total_s: float  # request in to last token out
    ttft_s: float  # request in to first token out (admission + prefill)
    target_s: float | None  # target invokes after the prefill (None: an anchor)
    proposer_s: float | None  # proposer invokes (None: an anchor)
    num_passes: int | None  # target passes after the prefill: rounds + greedy steps

    @property
    def decode_s(self) -> float:
        return self.total_s - self.ttft_s


@dataclass
class RunnerResult:
    runner: Runner | PackageRunner | AnchorRunner
    samples: list[list[Sample]] = field(default_factory=list)  # [repeat][prompt]
    stats: list = field(default_factory=list)  # DecodeStats per prompt, last repeat
    counts: list[dict] = field(default_factory=list)  # an anchor's counters per prompt

    @property
    def is_anchor(self) -> bool:
        return isinstance(self.runner, AnchorRunner)

    @property
    def is_compared(self) -> bool:
        """A runner of a compared package (not the package's own)."""
        return isinstance(self.runner, PackageRunner)

    def per_repeat(self, figure: Callable[[list[Sample]], float]) -> Spread:
        return Spread.of([figure(samples) for samples in self.samples])

    def differences_from(self, greedy: RunnerResult) -> dict[int, int]:
        """Prompt index -> the first token where any repeat's tokens leave greedy's (its last
        repeat); the prompts every repeat decoded exactly as greedy are absent."""
        first: dict[int, int] = {}
        for samples in self.samples:
            for index, (s, g) in enumerate(zip(samples, greedy.samples[-1], strict=True)):
                if s.token_ids != g.token_ids:
                    pairs = zip(s.token_ids, g.token_ids, strict=False)  # to the shorter's end
                    at = next((i for i, (a, b) in enumerate(pairs) if a != b),
                              min(len(s.token_ids), len(g.token_ids)))
                    first[index] = min(at, first.get(index, at))
        return dict(sorted(first.items()))


@dataclass
class BenchRun:
    config: BenchConfig
    engine: Engine
    prompts: PromptSet
    threads: int | None
    results: list[RunnerResult]
    skipped: list[tuple[Runner, str]]
    widths: list[WidthTiming]
    width_cache_length: int
    load_average: tuple[float, float, float]  # os.getloadavg() as the run began
    limit: limits.PhysicalLimit | None = None  # bytes per token over measured bandwidth
    anchor_results: list[RunnerResult] = field(default_factory=list)  # same run, same weights
    anchors: AnchorSetup | None = None  # what was asked for, skipped, and each runtime's facts
    spec_bench: SpecBenchSet | None = None  # Spec-Bench: the question of each prompt
    compared: list[ComparedPackage] = field(default_factory=list)  # packages timed beside it
    compared_results: list[RunnerResult] = field(default_factory=list)  # their runners


class Progress:
    """What a run reports while it goes; the CLI draws it as a rich progress bar."""

    def start(self, description: str, total: int) -> None: ...
    def advance(self) -> None: ...
    def note(self, message: str) -> None: ...


def run_bench(config: BenchConfig, progress: Progress | None = None) -> BenchRun:
    """Load the package, fit the prompts into its context, keep the runners it admits, time
    them (:func:`measure`), then time the target's verify-width curve."""
    progress = progress or Progress()
    load_average = os.getloadavg()  # other work on the machine shows here, and in the spread
    threads = config.resolved_threads
    engine = load(config.package, config.device, threads=threads, draft=config.draft)
    root = engine.package.root  # a built-in name (smollm2) resolved to its folder
    prompts, spec_bench, admitted = bench_prompts(engine, config, progress)

    runners, skipped = [], []
    for runner in runner_list(config.proposers, config.ks):
        reason = why_unavailable(engine, runner, prompts.prompts[0])
        if reason is None:
            runners.append(runner)
        else:
            skipped.append((runner, reason))
            progress.note(f"skipping {runner.name}: {reason}")
    compared = load_compared(config.compare, engine, runner_list(config.proposers, config.ks),
                             prompts.prompts[0], device=config.device, threads=threads)
    for package in compared:
        for runner, reason in package.skipped:
            progress.note(f"skipping {package.label}: {runner.name}: {reason}")
    anchors = None
    if config.anchors:
        progress.note(f"preparing the anchors: {', '.join(config.anchors)}")
        reference = [engine.generate(list(p), config.new_tokens, stop_on_eos=False).token_ids
                     for p in prompts.prompts]
        anchors = prepare_anchors(config.anchors, package=root,
                                  draft=Path(config.draft) if config.draft else None,
                                  device=config.device, threads=threads,
                                  proposers=config.proposers, ks=config.ks,
                                  reference=reference, check_prompt=prompts.prompts[0],
                                  work=config.anchor_dir, note=progress.note,
                                  genai_model=config.genai_model)
    try:
        every = measure(engine, [*runners, *(r for c in compared for r in c.runners),
                                 *(anchors.runners if anchors else [])], prompts, config,
                        progress)
    finally:
        if anchors is not None:
            anchors.close()
    results = [r for r in every if not r.is_anchor and not r.is_compared]

    room = admitted.context_cap - max(config.widths) if admitted.context_cap else None
    length = min(WIDTH_CACHE_LENGTH, room) if room is not None else WIDTH_CACHE_LENGTH
    context = list(islice(cycle(chain.from_iterable(prompts.prompts)), length))
    progress.start("verify-width curve", WIDTH_WARMUP + config.width_repeats)
    widths = verify_width_curve(engine, context, config.widths, repeats=config.width_repeats,
                                on_step=progress.advance)
    progress.start("physical limit (bandwidth, launch floor)", 1)
    limit = limits.measure(engine.package, engine.device, list(prompts.lengths),
                           sum(prompts.new_tokens) / len(prompts.new_tokens), threads,
                           engine.seam)
    progress.advance()
    return BenchRun(config, engine, prompts, threads, results, skipped, widths, length,
                    load_average, limit,
                    anchor_results=[r for r in every if r.is_anchor], anchors=anchors,
                    spec_bench=spec_bench, compared=compared,
                    compared_results=[r for r in every if r.is_compared])


def bench_prompts(engine: Engine, config: BenchConfig, progress: Progress
                  ) -> tuple[PromptSet, SpecBenchSet | None, Admitted]:
    """The run's prompts (Spec-Bench's first turns, or the prompt file's, rendered by the chat
    template under ``config.chat``) fitted into the context, with Spec-Bench's greedy answer
    lengths; the Spec-Bench set, if any; a probe request's admission (the context cap)."""
    root = engine.package.root
    spec_bench = None
    if config.spec_bench:
        spec_bench, raw = spec_bench_prompts(engine, config.per_category, config.new_tokens,
                                             needs_template=config.chat)
        source = spec_bench.source
    else:
        render = (lambda text: engine.render_chat([{"role": "user", "content": text}])) \
            if config.chat else None
        source, raw = read_prompts(find_prompt_file(root, config.prompts_file),
                                   engine.tokenizer, render)
        if config.chat:
            source += " (chat template)"
    admitted = engine.admit(raw[0][:1], 1).admitted  # admission alone: the context cap
    prompts = fit_prompts(source, raw, config.new_tokens, admitted.context_cap)
    if prompts.num_truncated:
        progress.note(f"{prompts.num_truncated} of {len(prompts.prompts)} prompts keep only "
                      f"their last {max(prompts.lengths)} tokens (context "
                      f"{admitted.context_cap}, {config.new_tokens} new tokens)")
    if spec_bench is not None:
        progress.start("Spec-Bench: greedy answer lengths", len(prompts.prompts))
        lengths = answer_lengths(engine, prompts.prompts, config.new_tokens, progress.advance)
        prompts = replace(prompts, new_tokens=tuple(lengths))
    return prompts, spec_bench, admitted


def measure(engine: Engine, runners: Sequence[Runner | PackageRunner | AnchorRunner],
            prompts: PromptSet, config: BenchConfig, progress: Progress) -> list[RunnerResult]:
    """Warm up, then time every runner over the prompt set ``config.repeats`` times (a
    `Runner` on ``engine``, a `PackageRunner` on its own). Anchors first make one untimed
    pass with their counters on (``decode(..., count=True)``)."""
    def engine_of(runner: Runner | PackageRunner) -> Engine:
        return runner.engine if isinstance(runner, PackageRunner) else engine

    results = [RunnerResult(r) for r in runners]
    anchors = [r for r in results if r.is_anchor]
    if anchors:
        progress.start("anchors: counting pass", len(anchors) * len(prompts.prompts))
        for result in anchors:
            for prompt, n in zip(prompts.prompts, prompts.new_tokens, strict=True):
                result.counts.append(result.runner.decode(list(prompt), n, count=True).counts)
                progress.advance()
    progress.start("warm-up", len(runners) * len(prompts.prompts) * config.warmup)
    for runner in runners:
        for _ in range(config.warmup):
            for prompt, n in zip(prompts.prompts, prompts.new_tokens, strict=True):
                if isinstance(runner, AnchorRunner):
                    runner.decode(list(prompt), n)
                else:
                    engine_of(runner).generate(list(prompt), runner.options(n))
                progress.advance()

    progress.start("timed repeats", len(runners) * len(prompts.prompts) * config.repeats)
    with ExitStack() as stack:
        engines = {id(engine_of(r.runner)): engine_of(r.runner) for r in results
                   if not r.is_anchor}
        clocks = {key: stack.enter_context(InvokeClock(e)) for key, e in engines.items()}
        for repeat in range(config.repeats):
            gc.collect()
            for result in results:
                result.samples.append([])
                result.stats = []
            for i, (prompt, n) in enumerate(zip(prompts.prompts, prompts.new_tokens,
                                                strict=True)):
                shift = (repeat + i) % len(results)  # each runner takes each turn in the order
                for result in results[shift:] + results[:shift]:
                    if result.is_anchor:
                        done = result.runner.decode(list(prompt), n)
                        result.samples[-1].append(Sample(done.token_ids, done.total_s,
                                                         done.ttft_s, None, None, None))
                        progress.advance()
                        continue
                    decoding = engine_of(result.runner)
                    clock = clocks[id(decoding)]
                    clock.reset()
                    generation = decoding.generate(list(prompt), result.runner.options(n))
                    result.samples[-1].append(Sample(
                        generation.token_ids, generation.total_s,
                        generation.time_to_first_token_s, clock.target_s(skip_first=1),
                        clock.proposer_s(), generation.stats.target_passes - 1))
                    result.stats.append(generation.stats)
                    progress.advance()
    return results
