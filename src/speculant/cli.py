"""The `speculant` command: the runtime's own commands (generate, inspect), and the commands
of installed plugins (the tools' convert / scale-target / export-hf / metadata, the bench's
bench), which register themselves through the ``speculant.commands`` entry points; the runtime
imports none of them."""

from __future__ import annotations

import json
import sys
from importlib import import_module, resources
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from speculant.errors import SpeculantError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Speculative decoding for ONNX inference packages.")
stderr = Console(stderr=True, soft_wrap=True)


def demo_package() -> Path:
    """The package bundled inside the wheel."""
    return Path(str(resources.files("speculant") / "demo"))


def fail(error: SpeculantError) -> None:
    stderr.print(f"[bold red]{type(error).__name__}[/]: {escape(str(error))}", highlight=False)
    raise typer.Exit(2)


@app.command()
def generate(
    package: Annotated[Path | None, typer.Argument(help="Package folder (default: the "
                                                        "bundled demo package).")] = None,
    prompt: Annotated[str, typer.Option(help="Prompt text.")] = "def ",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 64,
    speculative: Annotated[bool, typer.Option(help="Speculate with the declared chained "
                                                   "proposer (= --proposer chained).")] = False,
    proposer: Annotated[str | None, typer.Option(help="chained (declared by the package), "
                                                      "draft (the --draft model) or lookup "
                                                      "(prompt n-grams).")] = None,
    draft: Annotated[Path | None, typer.Option(help="Draft-model package (a greedy decoder "
                                                    "with the target's vocabulary); implies "
                                                    "--proposer draft.")] = None,
    k: Annotated[int | None, typer.Option(help="Drafts per round (default: the proposer's "
                                               "bound: max_proposal_width for chained, "
                                               "rollback_positions otherwise).")] = None,
    temperature: Annotated[float, typer.Option(help="0: greedy; above 0: sample (the "
                                                    "output follows the target's "
                                                    "distribution).")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k most probable ids (0: "
                                            "all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample within the smallest set of ids of "
                                              "this mass.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the request's sampling "
                                           "generator.")] = 0,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    stats: Annotated[bool, typer.Option(help="Print acceptance figures and counters to "
                                             "stderr.")] = False,
) -> None:
    """Generate text, streaming it to stdout; a summary line goes to stderr."""
    from speculant.engine import load

    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=stderr,
                      transient=True) as progress:
            progress.add_task(escape(f"loading {package or 'the demo package'} on {device}"))
            engine = load(package or demo_package(), device=device, draft=draft)
        kind = CLI_PROPOSERS.get(proposer or "", proposer) or (
            "chained" if speculative else "draft" if draft is not None else None)
        if kind is not None and k is None:
            k = default_width(engine, kind)
        options = dict(proposer=kind, k=k, stop=tuple(stop or ()), temperature=temperature,
                       top_k=top_k, top_p=top_p, seed=seed)
        generation = None
        pieces = engine.stream(prompt, max_new_tokens, **options) \
            if engine.tokenizer.has_text else None
        if pieces is not None:
            import time

            started = time.perf_counter()
            first_at = None
            for piece in pieces:  # the request is admitted before the first piece
                if first_at is None:
                    first_at = time.perf_counter()
                    sys.stdout.write(prompt)
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write(("" if first_at else prompt) + "\n")
            total = time.perf_counter() - started
            run_stats = engine.stats
            ttft = (first_at or started) - started
        else:
            generation = engine.generate(prompt, max_new_tokens, **options)
            print(generation.token_ids)
            run_stats, total, ttft = generation.stats, generation.total_s, \
                generation.time_to_first_token_s
    except SpeculantError as error:
        fail(error)
        return
    assert run_stats is not None
    n = run_stats.committed
    stderr.print(f"{n} tokens in {total:.3f} s ({n / total if total else 0:.1f} tok/s), "
                 f"time to first token {ttft * 1000:.1f} ms, stop: {run_stats.stop_reason}",
                 highlight=False)
    if stats:
        print_stats(run_stats)


CLI_PROPOSERS = {"lookup": "prompt_lookup"}  # --proposer names that differ from the API's


def default_width(engine, kind: str) -> int | None:
    """k when --k is absent: the largest the proposer allows (None: let the API refuse)."""
    plan = engine.package.plan
    if kind == "chained":
        spec = engine.package.document.speculative
        return spec.max_proposal_width if spec else None
    bound = plan.undeclared_rollback_bound
    if kind == "draft" and engine.draft is not None and engine.draft.rollback_bound is not None:
        bound = min(bound, engine.draft.rollback_bound + 1) if bound else bound
    return bound


def print_stats(run_stats) -> None:
    mean = run_stats.mean_accepted_length
    stderr.print(f"mean accepted length: {mean:.3f}" if mean is not None else
                 "mean accepted length: n/a (no speculative rounds)", highlight=False)
    by_position = run_stats.acceptance_by_position
    if by_position:
        stderr.print("acceptance by position: " + "  ".join(
            f"{i + 1}:{rate:.2f}" for i, rate in enumerate(by_position)), highlight=False)
    table = Table(title="counters", show_header=False)
    for key, value in run_stats.as_dict().items():
        if key in ("trace", "proposed_at", "accepted_at", "acceptance_by_position",
                   "mean_accepted_length", "residency"):
            continue
        table.add_row(key, str(value))
    for key, value in run_stats.residency.items():
        table.add_row(key, str(value))
    stderr.print(table)


@app.command()
def inspect(
    target: Annotated[Path, typer.Argument(help="Package folder, or a metadata file with "
                                                "--metadata-only.")],
    metadata_only: Annotated[bool, typer.Option("--metadata-only",
                                                 help="Validate one metadata document "
                                                      "without artifacts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show components, ports, state groups and the speculative contract."""
    from speculant.package import load_metadata_only, load_package, summarize

    try:
        if metadata_only:
            document, unsupported = load_metadata_only(target)
        else:
            document, unsupported = load_package(target).document, []
    except SpeculantError as error:
        fail(error)
        return
    summary = summarize(document)
    summary["unsupported"] = [f"{p.path}: {p.message}" for p in unsupported]
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return
    console = Console()
    console.print(f"[bold]{target}[/]")
    for key, value in summary.items():
        console.print(f"[bold cyan]{key}[/]")
        console.print_json(json.dumps(value, default=str))


# Where the distribution is not installed (a checkout on PYTHONPATH) there are no entry
# points; these are the in-tree plugins the wheel declares under ``speculant.commands``.
IN_TREE_PLUGINS = ("speculant_tools.cli:register", "speculant_bench.cli:register",
                   "speculant.serve.command:register")
_registered: set[str] = set()


def full_app() -> typer.Typer:
    """The runtime's app with every available plugin's commands registered (once)."""
    found = [entry.value for entry in entry_points(group="speculant.commands")]
    for target in found or IN_TREE_PLUGINS:
        if target in _registered:
            continue
        module_name, _, function = target.partition(":")
        try:
            module = import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # a plugin that is not installed adds no commands
        getattr(module, function)(app)
        _registered.add(target)
    return app


def main() -> None:
    full_app()(prog_name="speculant")


if __name__ == "__main__":
    main()
