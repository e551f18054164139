"""The `speculant bench` command, registered onto the `speculant` command (entry point
``speculant.commands``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from speculant.cli import DEFAULT_PACKAGE, fail, stderr
from speculant.errors import SpeculantError

bench_app = typer.Typer()
NEW_TOKENS = 32  # tokens per prompt, without --spec-bench
SPEC_BENCH_TOKENS = 128  # the longest Spec-Bench answer (Spec-Bench's own runs allow 1024)


@bench_app.command()
def bench(
    package: Annotated[Path | None, typer.Argument(help="Package folder (default: the "
                                                        "smollm2 built-in).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    draft: Annotated[Path | None, typer.Option(help="Draft-model package for the draft "
                                                    "proposer (without it, draft is "
                                                    "skipped).")] = None,
    prompts: Annotated[Path | None, typer.Option(help="JSON list of prompts (token-id lists "
                                                      "or strings); default: the package's "
                                                      "val_prompts.json, else the bundled "
                                                      "code snippets.")] = None,
    new_tokens: Annotated[int | None, typer.Option(help="Tokens every runner decodes per "
                                                        "prompt (EOS masked); default "
                                                        f"{NEW_TOKENS}.")] = None,
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
    k: Annotated[list[str] | None, typer.Option(help="Drafts per round, or auto (the width "
                                                     "chosen per round); repeatable; "
                                                     "default: 1 2 4 8 auto.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for bench.json, bench.md and the "
                                           "PNGs.")] = Path("bench-out"),
    verify_widths: Annotated[list[int] | None, typer.Option(
        "--verify-widths", min=1, help="Block sizes k + 1 of the target's verify-width cost "
                                       "curve (repeatable; default: 1 2 3 5 9).")] = None,
    width_repeats: Annotated[int | None, typer.Option(
        min=1, help="Timed passes of each block size in the verify-width curve (default: "
                    "20).")] = None,
    anchors: Annotated[list[str] | None, typer.Option(
        help="Other runtimes to time in the same run on the same weights: hf (transformers "
             "generate), genai (onnxruntime-genai); comma-separated or repeated. Skipped with "
             "the reason when their packages are missing.")] = None,
    anchor_dir: Annotated[Path | None, typer.Option(
        help="Keep the anchors' checkpoints and built models here (default: a temporary "
             "folder).")] = None,
    genai_model: Annotated[Path | None, typer.Option(
        help="A folder onnxruntime-genai's model builder made beforehand, for the genai "
             "anchor to decode instead of building one here (needs only onnxruntime-genai; "
             "its tokens are checked against greedy).")] = None,
    compare: Annotated[list[str] | None, typer.Option(
        help="Another package of the same model (same tokenizer) to time beside PACKAGE in "
             "the same run, its runners interleaved with the package's: LABEL=PATH or PATH; "
             "repeatable.")] = None,
    chat: Annotated[bool, typer.Option(
        "--chat", help="Each text prompt is one user message, rendered by the package's chat "
                       "template (with --spec-bench: a package without one is refused "
                       "rather than given plain first turns).")] = False,
    spec_bench: Annotated[bool, typer.Option(
        "--spec-bench", help="Decode Spec-Bench's questions (first turns, through the chat "
                             "template where the package has one) and add its per-category "
                             "table; replaces --prompts.")] = False,
    per_category: Annotated[int | None, typer.Option(
        min=1, help="Spec-Bench questions per category (default: all).")] = None,
    concurrency: Annotated[str | None, typer.Option(
        help="Concurrent requests decoded together by the scheduler, e.g. 1,4,16 (a package "
             "with a batched graph: import --batch N): each level beside the same requests "
             "one at a time; replaces the runner table.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(
        min=1, help="Spec-Bench: the longest answer; each question is decoded to greedy's "
                    f"answer length, its end of turn or this (default {SPEC_BENCH_TOKENS})."
    )] = None,
) -> None:
    """Time greedy and each proposer at each k side by side; write JSON, Markdown and plots."""
    import shlex

    from speculant.errors import RequestError
    from speculant_bench.anchors import parse_anchors
    from speculant_bench.command import bench as run_bench_command
    from speculant_bench.compared import parse_compared
    from speculant_bench.run import BenchConfig
    from speculant_bench.runners import KS, PROPOSERS, parse_widths

    try:
        anchor_names = parse_anchors(anchors)
    except ValueError as error:
        fail(RequestError(str(error), path="--anchors", value=anchors,
                          expected="hf, genai"))
        return
    if genai_model is not None:
        from speculant_bench.anchors.base import AnchorError
        from speculant_bench.anchors.genai import read_prebuilt

        if "genai" not in anchor_names:
            fail(RequestError("--genai-model names the model of the genai anchor, which is not "
                              "asked for", path="--genai-model", value=str(genai_model),
                              remedy="add --anchors genai"))
            return
        try:
            read_prebuilt(genai_model)
        except AnchorError as error:
            fail(RequestError(str(error), path="--genai-model", value=str(genai_model),
                              expected="a folder with genai_config.json and its model"))
            return
    for given, name, needs in ((prompts, "--prompts", False), (new_tokens, "--new-tokens", False),
                               (per_category, "--per-category", True),
                               (max_new_tokens, "--max-new-tokens", True)):
        if given is not None and needs != spec_bench:
            fail(RequestError(f"{name} {'needs' if needs else 'does not go with'} --spec-bench",
                              path=name, value=str(given),
                              remedy="add --spec-bench" if needs else
                              "leave it out (Spec-Bench brings its own prompts, and its "
                              "answers end at --max-new-tokens)"))
            return
    try:
        compared = parse_compared(compare or [])
    except ValueError as error:
        fail(RequestError(str(error), path="--compare", value=compare,
                          expected="LABEL=PATH or PATH, each label once"))
        return
    try:
        widths = parse_widths(k) if k else KS
    except ValueError as error:
        fail(RequestError(str(error), path="--k", value=k,
                          expected="integers >= 1 or auto, e.g. --k 1 --k 4 --k auto"))
        return
    config = BenchConfig(package or Path(DEFAULT_PACKAGE), device=device, draft=draft,
                         prompts_file=prompts, warmup=warmup, spec_bench=spec_bench,
                         per_category=per_category,
                         new_tokens=(max_new_tokens or SPEC_BENCH_TOKENS) if spec_bench
                         else new_tokens or NEW_TOKENS,
                         repeats=repeats, threads=threads,
                         proposers=tuple(proposer or PROPOSERS), ks=widths,
                         anchors=anchor_names, anchor_dir=anchor_dir,
                         genai_model=genai_model, chat=chat, compare=tuple(compared),
                         widths=tuple(sorted(set(verify_widths or BenchConfig.widths))),
                         width_repeats=width_repeats or BenchConfig.width_repeats)
    if concurrency is not None:
        try:
            levels = sorted({int(n) for n in concurrency.split(",")})
            if not levels or levels[0] < 1:
                raise ValueError(concurrency)
        except ValueError:
            fail(RequestError("--concurrency takes request counts >= 1", path="--concurrency",
                              value=concurrency, expected="e.g. 1,4,16"))
            return
        from speculant_bench.command import bench_concurrency
        from speculant_bench.concurrency import concurrency_markdown

        try:
            report = bench_concurrency(config, levels, out,
                                       shlex.join(["speculant", *sys.argv[1:]]), stderr)
        except SpeculantError as error:
            fail(error)
            return
        print(concurrency_markdown(report), end="")
        return
    try:
        report = run_bench_command(config, out, shlex.join(["speculant", *sys.argv[1:]]),
                                   stderr)
    except SpeculantError as error:
        fail(error)
        return
    from speculant_bench.report import markdown

    print(markdown(report), end="")


def register(app: typer.Typer) -> None:
    app.registered_commands.extend(bench_app.registered_commands)
