"""The `speculant` command: generate, inspect, metadata tools."""

from __future__ import annotations

import json
import sys
from importlib import resources
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
metadata_app = typer.Typer(no_args_is_help=True, help="Tools for inference_metadata documents.")
app.add_typer(metadata_app, name="metadata")
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


@app.command()
def bench(
    package: Annotated[Path | None, typer.Argument(help="Package folder (default: the "
                                                        "bundled demo package).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    draft: Annotated[Path | None, typer.Option(help="Draft-model package for the draft "
                                                    "proposer (without it, draft is "
                                                    "skipped).")] = None,
    prompts: Annotated[Path | None, typer.Option(help="JSON list of prompts (token-id lists "
                                                      "or strings); default: the package's "
                                                      "val_prompts.json, else the bundled "
                                                      "code snippets.")] = None,
    new_tokens: Annotated[int, typer.Option(help="Tokens every runner decodes per prompt "
                                                 "(EOS masked).")] = 32,
    warmup: Annotated[int, typer.Option(help="Untimed passes over the prompts per "
                                             "runner.")] = 1,
    repeats: Annotated[int, typer.Option(help="Timed passes over the prompts per runner "
                                              "(median and spread).")] = 5,
    threads: Annotated[int | None, typer.Option(help="ONNX Runtime intra-op threads of every "
                                                     "session (default on CPU: every usable "
                                                     "CPU).")] = None,
    proposer: Annotated[list[str] | None, typer.Option(help="Proposer to run (repeatable; "
                                                            "default: chained, draft, "
                                                            "prompt_lookup).")] = None,
    k: Annotated[list[int] | None, typer.Option(help="Drafts per round (repeatable; default: "
                                                     "1 2 4 8).")] = None,
    out: Annotated[Path, typer.Option(help="Folder for bench.json, bench.md and the "
                                           "PNGs.")] = Path("bench-out"),
    anchors: Annotated[list[str] | None, typer.Option(
        help="Other runtimes to time in the same run on the same weights: hf (transformers "
             "generate), genai (onnxruntime-genai); comma-separated or repeated. Skipped with "
             "the reason when their packages are missing.")] = None,
    anchor_dir: Annotated[Path | None, typer.Option(
        help="Keep the anchors' checkpoints and built models here (default: a temporary "
             "folder).")] = None,
) -> None:
    """Time greedy and each proposer at each k side by side; write JSON, Markdown and plots."""
    import shlex

    from speculant.bench.anchors import parse_anchors
    from speculant.bench.command import bench as run_bench_command
    from speculant.bench.run import BenchConfig
    from speculant.bench.runners import KS, PROPOSERS
    from speculant.errors import RequestError

    try:
        anchor_names = parse_anchors(anchors)
    except ValueError as error:
        fail(RequestError(str(error), path="--anchors", value=anchors,
                          expected="hf, genai"))
        return
    config = BenchConfig(package or demo_package(), device=device, draft=draft,
                         prompts_file=prompts, new_tokens=new_tokens, warmup=warmup,
                         repeats=repeats, threads=threads,
                         proposers=tuple(proposer or PROPOSERS), ks=tuple(k or KS),
                         anchors=anchor_names, anchor_dir=anchor_dir)
    try:
        report = run_bench_command(config, out, shlex.join(["speculant", *sys.argv[1:]]),
                                   stderr)
    except SpeculantError as error:
        fail(error)
        return
    from speculant.bench.report import markdown

    print(markdown(report), end="")


GRAPH_HELP = ("The target's graph: auto (fused kernels for float16), fused (also float32: "
              "CPU only), explicit (node by node).")


@app.command()
def convert(
    package: Annotated[Path, typer.Argument(help="Package written by speculant.export.")],
    out: Annotated[Path, typer.Argument(help="Folder for the rebuilt package.")],
    dtype: Annotated[str, typer.Option(help="float16 or float32: weights, IO and the "
                                            "chain's currency.")] = "float16",
    graph: Annotated[str, typer.Option(help=GRAPH_HELP)] = "auto",
) -> None:
    """Rebuild an exported package's graphs in another dtype."""
    from speculant.export import convert as convert_package

    try:
        convert_package(package, out, dtype=dtype, graph=graph)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(f"wrote {out} ({dtype})"), highlight=False)


@app.command("export-hf")
def export_hf(
    package: Annotated[Path, typer.Argument(help="Package written by speculant.export.")],
    out: Annotated[Path, typer.Argument(help="Folder for the Hugging Face checkpoint.")],
) -> None:
    """Write an exported package's weights back out as a Hugging Face checkpoint."""
    from speculant.export import export_hf as write_checkpoint

    try:
        write_checkpoint(package, out)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(f"wrote {out} (config.json, model.safetensors)"), highlight=False)


@app.command("scale-target")
def scale_target(
    package: Annotated[Path, typer.Argument(help="Chained pair written by speculant.export "
                                                 "(e.g. src/speculant/demo).")],
    out: Annotated[Path, typer.Argument(help="Folder for the cost-scaled pair (keep it out "
                                             "of git: the repository ignores /scaled/).")],
    params: Annotated[str, typer.Option(help="Target parameters: 100M, 1B (or any count "
                                             "such as 250M, 1.5B).")] = "100M",
    layers: Annotated[int | None, typer.Option(help="Decoder layers (default: 12 below "
                                                    "500M parameters, 16 from 500M).")] = None,
    intermediate: Annotated[int | None, typer.Option(help="MLP width (default: the multiple "
                                                          "of 256 nearest --params).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    external_data: Annotated[bool | None, typer.Option(
        help="Weights in model.onnx.data beside each graph (default: above 1 GiB).")] = None,
    check_tokens: Annotated[int, typer.Option(help="Greedy and chained tokens to compare "
                                                   "with the trained pair on the CPU (0: "
                                                   "skip the check).")] = 16,
    graph: Annotated[str, typer.Option(help=GRAPH_HELP)] = "auto",
) -> None:
    """Derive a cost-scaled pair with the trained pair's function: wider MLPs, more layers."""
    from speculant.export.cost_scale import describe
    from speculant.export.cost_scale import scale_target as scale

    try:
        result = scale(package, out, params, num_layers=layers,
                       intermediate_size=intermediate, seed=seed, external_data=external_data,
                       check_tokens=check_tokens, graph=graph)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(describe(result)), highlight=False)


@metadata_app.command("name-axes")
def name_axes_command(
    package: Annotated[Path, typer.Argument(help="Package folder or metadata file.")],
    dry_run: Annotated[bool, typer.Option(help="Report without writing.")] = False,
) -> None:
    """Rename sequence-like axes called `sequence` by what they are."""
    from speculant.package.document import find_metadata
    from speculant.package.name_axes import name_axes

    try:
        path = find_metadata(package) if package.is_dir() else package
        report = name_axes(path, write=not dry_run)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(str(report), highlight=False)


if __name__ == "__main__":
    app()
