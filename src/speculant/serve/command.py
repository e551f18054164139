"""The `speculant serve` command (registered onto `speculant` as a plugin)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from inspect import Parameter, signature
from typing import Annotated, Any, get_type_hints

import typer

from speculant import cli
from speculant.errors import SpeculantError
from speculant.serve import load_engine, require
from speculant.serve.limits import ServerLimits, uvicorn_config
from speculant.serve.schemas import PROPOSERS
from speculant.speculative.kinds import AUTO
from speculant.text.chat import DEFAULT_LIMITS as LIMITS
from speculant.text.chat import TemplateLimits

# max_new_tokens is the limits' --max-tokens: the server's default is the remaining context
REQUEST_OPTIONS = tuple(name for name in cli.REQUEST_OPTIONS if name != "max_new_tokens")


def limit_options(command):
    """Give ``command`` an option for each field of :class:`ServerLimits` (its flag,
    default and help), received in its ``**fields`` like the generation options."""
    hints = get_type_hints(ServerLimits)
    added = [Parameter(f.name, Parameter.KEYWORD_ONLY, default=f.default, annotation=Annotated[
        hints[f.name], typer.Option(f.metadata["flag"], help=f.metadata["help"])])
        for f in dataclass_fields(ServerLimits)]
    declared = signature(command, eval_str=True)
    command.__signature__ = declared.replace(parameters=[*declared.parameters.values(), *added])
    return command


@limit_options
@cli.generation_options(*REQUEST_OPTIONS, "stop")
def serve(
    package: Annotated[str, typer.Argument(help="Package folder or built-in name.")] = \
        cli.DEFAULT_PACKAGE,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    device: cli.Device = "cpu",
    threads: cli.Threads = None,
    draft: Annotated[str | None, typer.Option(help="Draft-model package, for "
                                                   "proposer=draft.")] = None,
    model_name: Annotated[str | None, typer.Option(help="The model id clients send "
                                                        "(default: the package's folder "
                                                        "name).")] = None,
    chat_template_deadline: Annotated[float, typer.Option(
        min=0.001, help="Seconds one chat-template render may take (then 400).")] = \
        LIMITS.deadline_s,
    chat_template_max_chars: Annotated[int, typer.Option(
        min=1, help="Longest rendered chat prompt, in characters (then 400).")] = \
        LIMITS.max_output_chars,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level (info logs each "
                                                 "request).")] = "info",
    ray: Annotated[bool, typer.Option("--ray", help="Serve as a Ray Serve deployment (one "
                                                    "engine per replica).")] = False,
    replicas: Annotated[int, typer.Option(help="Ray Serve replicas (with --ray).")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster to join (with --ray; "
                                                         "default: start a local "
                                                         "one).")] = None,
    **fields: Any,
) -> None:
    """Serve a package over OpenAI's HTTP API: /v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics. The generation options are the requests' defaults; the
    limits bound each request, the queue and the connections (docs/serving.md)."""
    limits = ServerLimits(**{f.name: fields.pop(f.name) for f in _LIMIT_FIELDS})
    try:
        proposer = fields["proposer"]
        if proposer is not None and proposer not in (*PROPOSERS, AUTO):
            raise typer.BadParameter(f"{proposer!r} is not one of {', '.join(PROPOSERS)} or "
                                     f"{AUTO}", param_hint="--proposer")
        require("serve")
        defaults = cli.options_of(fields)
        name = model_name or _model_name(package)
        template_limits = TemplateLimits(chat_template_deadline, chat_template_max_chars,
                                         LIMITS.max_memory_bytes)
        if ray:
            require("ray")
            from speculant.serve.ray_app import run_blocking

            run_blocking(package, model_name=name, defaults=defaults, device=device,
                         draft=draft, threads=threads, num_replicas=replicas, host=host, port=port,
                         address=ray_address, limits=limits, template_limits=template_limits)
            return
        import uvicorn

        from speculant.serve.app import create_app

        engine = load_engine(package, device=device, draft=draft, threads=threads,
                             template_limits=template_limits,
                             max_batch=limits.max_batch if limits.max_batch > 1 else None)
        app = create_app(engine, name, defaults, limits=limits)
    except SpeculantError as error:
        cli.fail(error)
    uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, log_level=log_level)).run()


_LIMIT_FIELDS = dataclass_fields(ServerLimits)


def _model_name(package: str) -> str:
    from pathlib import Path

    return Path(package).name or package


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
