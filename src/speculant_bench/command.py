"""`speculant bench`: run, draw a progress bar meanwhile, write the report files."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from speculant_bench import report as reports
from speculant_bench.run import BenchConfig, run_bench


class RichProgress:
    """The run's progress as one rich bar per phase, and notes printed above it."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def start(self, description: str, total: int) -> None:
        self.task = self.progress.add_task(description, total=total)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def note(self, message: str) -> None:
        self.progress.console.print(escape(message), highlight=False)


def bench(config: BenchConfig, out: Path, command: str, console: Console) -> dict:
    """Run the bench with a progress bar, then :func:`write_report`; return the report."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        run = run_bench(config, RichProgress(progress))
    report = reports.summarize(run, command)
    write_report(report, out, console)
    return report


def write_report(report: dict, out: Path, console: Console) -> list[str]:
    """``bench.json``, ``bench.md`` and the PNGs under ``out`` (the PNGs skipped, with a note,
    when matplotlib is missing); returns the names written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(reports.markdown(report))
    written = ["bench.json", "bench.md"]
    try:
        written += [path.name for path in reports.plot(report, out)]
    except ImportError:
        console.print("matplotlib is not installed, so the PNG plots are skipped (install "
                      "it with: pip install 'speculant[bench]')", highlight=False)
    compared = [r for package in report.get("compared", []) for r in package["runners"]]
    for runner in report["runners"] + compared + report.get("anchors", {}).get("runners", []):
        if not runner["decoded_every_token"] or runner["matches_greedy"] is False:
            differing = runner.get("prompts_differing_from_greedy")
            where = f" (prompt: first differing token {differing})" if differing else ""
            console.print(f"[bold red]warning[/]: {escape(runner['name'])} decoded "
                          f"{runner['tokens_per_prompt']} tokens per prompt; matches greedy: "
                          f"{runner['matches_greedy']}{escape(where)}", highlight=False)
    console.print(f"wrote {', '.join(written)} to {escape(str(out))}", highlight=False)
    return written


def bench_concurrency(config: BenchConfig, levels: list[int], out: Path, command: str,
                      console: Console) -> dict:
    """``--concurrency``: the scheduler at each level beside one at a time
    (:mod:`speculant_bench.concurrency`); writes ``bench.json`` and ``bench.md``."""
    import os
    import platform

    from speculant.engine import load
    from speculant_bench.concurrency import concurrency_markdown, run_concurrency
    from speculant_bench.run import bench_prompts
    from speculant_bench.runners import runner_list

    engine = load(config.package, config.device, threads=config.resolved_threads,
                  draft=config.draft, max_batch=max(levels))
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        prompts, _, _ = bench_prompts(engine, config, RichProgress(progress))
        task = progress.add_task("concurrency levels", total=None)
        run = run_concurrency(engine, runner_list(config.proposers, config.ks), prompts,
                              levels, config.repeats, config.warmup)
        progress.update(task, completed=1, total=1)
    report = {"command": command, "package": str(engine.package.root),
              "device": config.device, "prompts": f"{len(prompts.prompts)} from "
              f"{prompts.source}, {sum(prompts.new_tokens) / len(prompts.new_tokens):.0f} "
              "tokens each on average", "load_average": os.getloadavg()[0],
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
              f"{platform.processor() or platform.platform()}", **run}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(concurrency_markdown(report))
    console.print(f"wrote bench.json, bench.md to {escape(str(out))}", highlight=False)
    return report
