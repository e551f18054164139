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
takes the request (each counts its own).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray import serve

from speculant import GenerationOptions


@serve.deployment(name="speculant")
@serve.ingress()
class SpeculantReplica:
    def __init__(self, package: str, model_name: str, defaults: dict, device: str = "cpu",
                 draft: str | None = None, threads: int | None = None) -> None:
        from speculant.serve import load_engine

        self.engine = load_engine(package, device=device, draft=draft, threads=threads)
        self.model_name = model_name
        self.defaults = GenerationOptions(**defaults)

    def __serve_build_asgi_app__(self):
        from speculant.serve.app import create_app

        return create_app(self.engine, self.model_name, self.defaults)


def build(package: str = "demo", *, model_name: str | None = None,
          defaults: GenerationOptions | None = None, device: str = "cpu",
          draft: str | None = None, threads: int | None = None, num_replicas: int = 1,
          num_cpus: float = 1.0, num_gpus: float = 0.0,
          max_ongoing_requests: int = 16) -> serve.Application:
    """The application: ``num_replicas`` engines of ``package``, each on ``num_cpus`` CPUs
    and ``num_gpus`` GPUs of some machine of the cluster (``threads``: ORT's intra-op
    threads per session)."""
    from pathlib import Path

    options = dataclasses.asdict(defaults or GenerationOptions())
    deployment = SpeculantReplica.options(
        num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus})
    return deployment.bind(package, model_name or Path(package).name or package, options,
                           device, draft, threads)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """For Ray's ``serve run speculant.serve.ray_app:app_builder key=value ...``."""
    numbers = {"num_replicas": int, "num_cpus": float, "num_gpus": float,
               "max_ongoing_requests": int, "threads": int}
    kwargs = {key: numbers.get(key, str)(value) for key, value in args.items()
              if key != "package"}
    return build(args.get("package", "demo"), **kwargs)


def run_blocking(package: str, *, model_name: str, defaults: GenerationOptions,
                 device: str, draft: str | None, threads: int | None, num_replicas: int,
                 host: str, port: int, address: str | None) -> None:
    """``speculant serve --ray``: start (or join) Ray, deploy, serve until Ctrl-C."""
    import ray

    ray.init(address=address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build(package, model_name=model_name, defaults=defaults, device=device,
                    draft=draft, threads=threads, num_replicas=num_replicas),
              route_prefix="/", blocking=True)
