"""The OpenAI routes as a Ray Serve deployment: one engine per replica, behind Ray Serve's
HTTP proxy, which spreads requests over the replicas.

    speculant serve demo --ray --replicas 2                   # a local Ray instance
    speculant serve demo --ray --replicas 4 --ray-address auto  # a running Ray cluster
    serve run speculant.serve.ray_app:app_builder package=demo num_replicas=2   # Ray's CLI

    from ray import serve
    from speculant.serve.ray_app import build
    serve.run(build("demo", num_replicas=2), route_prefix="/")

Each replica is a Ray actor that loads its own engine and answers with the same FastAPI app
as `speculant serve` (:func:`speculant.serve.app.create_app`, built on the replica through
``__serve_build_asgi_app__``). Replicas land on whichever machines of the Ray cluster have
the resources (``num_cpus`` / ``num_gpus`` per replica); docs/serving.md shows a cluster.
Requests to one replica queue on its engine, so ``max_ongoing_requests`` bounds that queue;
beyond it Ray's proxy holds requests back. ``GET /metrics`` answers from the replica that
takes the request (each counts its own). The server's limits (:class:`ServerLimits`: request
deadline, queue bound, token cap, body size and deadline, stall grace) and the chat template's
(:class:`TemplateLimits`) reach each replica's app and engine; the connection and header limits
are the proxy's, which Ray Serve owns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray import serve

from speculant import GenerationOptions
from speculant.serve.limits import ServerLimits
from speculant.text.chat import DEFAULT_LIMITS, TemplateLimits


@serve.deployment(name="speculant")
@serve.ingress()
class SpeculantReplica:
    """One engine and its app; the options arrive as plain mappings (Ray's deployment
    arguments) and become their dataclasses here."""

    def __init__(self, package: str, model_name: str, defaults: dict, device: str = "cpu",
                 draft: str | None = None, threads: int | None = None,
                 limits: dict | None = None, template_limits: dict | None = None) -> None:
        from speculant.serve import load_engine

        self.engine = load_engine(package, device=device, draft=draft, threads=threads,
                                  template_limits=TemplateLimits(**(template_limits or {})))
        self.model_name = model_name
        self.defaults = GenerationOptions(**defaults)
        self.limits = ServerLimits(**(limits or {}))

    def __serve_build_asgi_app__(self):
        from speculant.serve.app import create_app

        return create_app(self.engine, self.model_name, self.defaults, limits=self.limits)


def build(package: str = "demo", *, model_name: str | None = None,
          defaults: GenerationOptions | None = None, device: str = "cpu",
          draft: str | None = None, threads: int | None = None, num_replicas: int = 1,
          num_cpus: float = 1.0, num_gpus: float = 0.0, max_ongoing_requests: int = 16,
          limits: ServerLimits | None = None,
          template_limits: TemplateLimits = DEFAULT_LIMITS) -> serve.Application:
    """The application: ``num_replicas`` engines of ``package``, each on ``num_cpus`` CPUs
    and ``num_gpus`` GPUs of some machine of the cluster (``threads``: ORT's intra-op
    threads per session), each replica's app under ``limits`` and its chat template under
    ``template_limits``."""
    from pathlib import Path

    options = dataclasses.asdict(defaults or GenerationOptions())
    deployment = SpeculantReplica.options(
        num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus})
    return deployment.bind(package, model_name or Path(package).name or package, options,
                           device, draft, threads, dataclasses.asdict(limits or ServerLimits()),
                           dataclasses.asdict(template_limits))


# app_builder's keys beyond build's: ServerLimits' fields, and the template limits by the
# names of speculant serve's options
LIMIT_TYPES = {f.name: float if "float" in str(f.type) else int
               for f in dataclasses.fields(ServerLimits)}
TEMPLATE_KEYS = {"chat_template_deadline": ("deadline_s", float),
                 "chat_template_max_chars": ("max_output_chars", int)}


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For Ray's ``serve run speculant.serve.ray_app:app_builder key=value ...``: the keys of
    :func:`build`, :class:`ServerLimits`' fields (``request_timeout_s=60``), and
    ``chat_template_deadline`` / ``chat_template_max_chars`` (``speculant serve``'s)."""
    numbers = {"num_replicas": int, "num_cpus": float, "num_gpus": float,
               "max_ongoing_requests": int, "threads": int}
    kwargs = {key: numbers.get(key, str)(value) for key, value in args.items()
              if key != "package" and key not in LIMIT_TYPES and key not in TEMPLATE_KEYS}
    limits = {key: LIMIT_TYPES[key](value) for key, value in args.items() if key in LIMIT_TYPES}
    template = {field: kind(args[key]) for key, (field, kind) in TEMPLATE_KEYS.items()
                if key in args}
    return build(args.get("package", "demo"), **kwargs, limits=ServerLimits(**limits),
                 template_limits=dataclasses.replace(DEFAULT_LIMITS, **template))


def run_blocking(package: str, *, model_name: str, defaults: GenerationOptions,
                 device: str, draft: str | None, threads: int | None, num_replicas: int,
                 host: str, port: int, address: str | None, limits: ServerLimits,
                 template_limits: TemplateLimits) -> None:
    """``speculant serve --ray``: start (or join) Ray, deploy, serve until Ctrl-C."""
    import ray

    ray.init(address=address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build(package, model_name=model_name, defaults=defaults, device=device,
                    draft=draft, threads=threads, num_replicas=num_replicas, limits=limits,
                    template_limits=template_limits),
              route_prefix="/", blocking=True)
