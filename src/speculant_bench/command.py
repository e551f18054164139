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
