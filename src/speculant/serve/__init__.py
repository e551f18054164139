"""`speculant serve`: an OpenAI-compatible HTTP server over one engine (FastAPI + uvicorn),
and the same routes as a Ray Serve deployment (:mod:`speculant.serve.ray_app`).

Its dependencies are the ``serve`` extra (``ray`` for Ray Serve); :func:`require` names the
extra to install when one is missing. Nothing in the runtime imports this package.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from speculant.errors import SpeculantError

EXTRAS = {"serve": ("fastapi", "uvicorn", "prometheus_client"), "ray": ("ray.serve",)}


class MissingExtraError(SpeculantError):
    """An optional dependency of a command is not installed."""


def require(extra: str) -> None:
    """Import the modules of ``extra``, or raise :class:`MissingExtraError` naming it."""
    for module in EXTRAS[extra]:
        try:
            import_module(module)
        except ImportError as error:
            raise MissingExtraError(
                f"`speculant serve{' --ray' if extra == 'ray' else ''}` needs {module}, which "
                "is not installed", value=str(error),
                remedy=f"pip install 'speculant[{extra}]'") from None


def load_engine(package: str, device: str = "cpu", draft: str | None = None,
                threads: int | None = None, **options: Any) -> Any:
    """``speculant.load(package)`` (a folder or a built-in name such as ``smollm2`` or
    ``demo``); ``threads``: ONNX Runtime's intra-op threads per session (None: ORT's
    default); ``options``: more of :class:`speculant.Engine`'s keywords."""
    import speculant

    return speculant.load(package, device=device, draft=draft, threads=threads, **options)
