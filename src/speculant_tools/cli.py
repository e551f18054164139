"""The tools' commands, registered onto the `speculant` command (entry point
``speculant.commands``): import, convert, export-hf, scale-target, train-drafter, metadata
name-axes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from speculant.cli import fail, stderr
from speculant.errors import SpeculantError
from speculant_tools.train_drafter.command import train_drafter_command

tools = typer.Typer()
metadata_app = typer.Typer(no_args_is_help=True, help="Tools for inference_metadata documents.")

GRAPH_HELP = ("The target's graph: auto (fused kernels for float16), fused (also float32: "
              "CPU only), explicit (node by node).")
QUANTIZE_DRAFTER_HELP = ("int4: the chained drafter's linear layers as ONNX Runtime's "
                         "MatMulNBits (a draft is only ever verified: the outputs stay "
                         "greedy's).")
CACHE_HELP = ("The KV caches' form: appended (past in, longer present out) or static "
              "(fixed-capacity buffers written in place; docs/design/static-cache.md). "
              "Default: the source package's.")
BATCH_HELP = ("Also write the target's batched pass of up to N requests' rows "
              "(target/batched.onnx; static caches only; docs/design/batching.md).")
BatchOpt = Annotated[str | None, typer.Option("--batch", metavar="N", help=BATCH_HELP)]
SourceBatchOpt = Annotated[str | None, typer.Option(
    "--batch", metavar="N", help=BATCH_HELP + " Default: the source package's, where the "
    "caches stay static.")]


def batch_rows(text: str | None) -> int | None:
    """``--batch N`` as a row count (the writers check its range); text that is no integer
    is an ExportError naming the flag, the value and the remedy."""
    from speculant_tools.export.errors import ExportError

    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ExportError("--batch takes a number of rows >= 1", path="batch", value=text,
                          remedy="--batch 16, or leave --batch out for a batch-1 package"
                          ) from None


@tools.command()
def convert(
    package: Annotated[Path, typer.Argument(help="Package written by speculant_tools.export.")],
    out: Annotated[Path, typer.Argument(help="Folder for the rebuilt package.")],
    dtype: Annotated[str, typer.Option(help="float16 or float32: weights, IO and the "
                                            "chain's currency.")] = "float16",
    graph: Annotated[str, typer.Option(help=GRAPH_HELP)] = "auto",
    cache: Annotated[str | None, typer.Option(help=CACHE_HELP)] = None,
    quantize_drafter: Annotated[str | None, typer.Option(help=QUANTIZE_DRAFTER_HELP)] = None,
    batch: SourceBatchOpt = None,
) -> None:
    """Rebuild an exported package's graphs in another dtype (or cache form)."""
    from speculant_tools.export import convert as convert_package

    try:
        convert_package(package, out, dtype=dtype, graph=graph, cache=cache,
                        quantize_drafter=quantize_drafter, batch=batch_rows(batch))
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(f"wrote {out} ({dtype}"
                        f"{f', {quantize_drafter} drafter' if quantize_drafter else ''})"),
                 highlight=False)


@tools.command("export-hf")
def export_hf(
    package: Annotated[Path, typer.Argument(help="Package written by speculant_tools.export "
                                                 "or speculant import, or a built-in name "
                                                 "(smollm2, demo).")],
    out: Annotated[Path, typer.Argument(help="Folder for the Hugging Face checkpoint.")],
) -> None:
    """Write an exported package's weights back out as a Hugging Face checkpoint."""
    from speculant.package.builtin import resolve_package
    from speculant_tools.export import export_hf as write_checkpoint

    try:
        write_checkpoint(resolve_package(package), out)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(f"wrote {out} (config.json, model.safetensors)"), highlight=False)


@tools.command("scale-target")
def scale_target(
    package: Annotated[Path, typer.Argument(help="Chained pair written by speculant_tools.export "
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
    shape: Annotated[str | None, typer.Option(
        help="A real model's shape instead of --params: realistic-1b (hidden 2048, 16 layers, "
             "32/8 heads of 64, MLP 8192), zero-padded to keep the function.")] = None,
    cache: Annotated[str | None, typer.Option(help=CACHE_HELP)] = None,
    quantize_drafter: Annotated[str | None, typer.Option(help=QUANTIZE_DRAFTER_HELP)] = None,
    batch: SourceBatchOpt = None,
) -> None:
    """Derive a cost-scaled pair with the trained pair's function: wider MLPs, more layers
    (or, with --shape, every dimension of a real model)."""
    from speculant_tools.export.cost_scale import describe
    from speculant_tools.export.cost_scale import scale_target as scale

    try:
        result = scale(package, out, params, num_layers=layers,
                       intermediate_size=intermediate, seed=seed, external_data=external_data,
                       check_tokens=check_tokens, graph=graph, shape=shape, cache=cache,
                       quantize_drafter=quantize_drafter, batch=batch_rows(batch))
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(describe(result)), highlight=False)


@tools.command("import")
def import_command(
    source: Annotated[Path, typer.Argument(help="A GGUF file of the Llama family, a Hugging "
                                                "Face checkpoint folder (config.json + "
                                                "safetensors + tokenizer.json), an "
                                                "onnxruntime-genai model folder, or a "
                                                "speculators EAGLE head (with --target).")],
    out: Annotated[Path, typer.Argument(help="Folder for the package (new or empty).")],
    dtype: Annotated[str | None, typer.Option(help="float32 or float16: weights and IO "
                                                   "(default float32; a speculators head: "
                                                   "the target's).")] = None,
    quantize: Annotated[str | None, typer.Option(help="int4: the target's linear layers as "
                                                      "MatMulNBits (float32 compute, so "
                                                      "speculation stays exact); float: "
                                                      "every weight widened to --dtype (a "
                                                      "GGUF's Q4_0/Q3_K layers are otherwise "
                                                      "kept as MatMulNBits).")] = None,
    graph: Annotated[str, typer.Option(help=GRAPH_HELP)] = "auto",
    cache: Annotated[str | None, typer.Option(
        help="The KV caches' form: static (fixed-capacity buffers written in place, rollback "
             "moves no bytes; the default) or appended (a speculators head: the "
             "target's).")] = None,
    target: Annotated[str | None, typer.Option(
        help="With a speculators head (config.json with speculators_config): the package "
             "of the target it drafts for (a folder, or a built-in name).")] = None,
    max_proposal_width: Annotated[int | None, typer.Option(
        help="With a speculators head: the largest k (default: its speculative_tokens).")
    ] = None,
    batch: BatchOpt = None,
) -> None:
    """Write a speculant package from a GGUF file or a model folder, or a speculators EAGLE
    head beside its target's package (--target)."""
    from speculant_tools.importers import import_model
    from speculant_tools.progress import import_progress

    try:
        rows = batch_rows(batch)
        with import_progress(f"importing {source}") as progress:
            import_model(source, out, dtype=dtype, quantize=quantize, graph=graph,
                         cache=cache, target=target, max_proposal_width=max_proposal_width,
                         batch=rows, progress=progress)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(escape(f"wrote {out}" + (f" ({dtype})" if dtype else "")
                        + (f" ({quantize} weights)" if quantize else "")),
                 highlight=False)


@metadata_app.command("name-axes")
def name_axes_command(
    package: Annotated[Path, typer.Argument(help="Package folder or metadata file.")],
    dry_run: Annotated[bool, typer.Option(help="Report without writing.")] = False,
) -> None:
    """Rename sequence-like axes called `sequence` by what they are."""
    from speculant.package.document import find_metadata
    from speculant_tools.name_axes import name_axes

    try:
        path = find_metadata(package) if package.is_dir() else package
        report = name_axes(path, write=not dry_run)
    except SpeculantError as error:
        fail(error)
        return
    stderr.print(str(report), highlight=False)




tools.command("train-drafter")(train_drafter_command)  # speculant_tools/train_drafter/


def register(app: typer.Typer) -> None:
    for command in tools.registered_commands:
        app.registered_commands.append(command)
    app.add_typer(metadata_app, name="metadata")
