"""speculant: speculative decoding for ONNX inference packages.

    import speculant
    engine = speculant.load("path/to/package")          # device="cpu" or "cuda"
    options = speculant.GenerationOptions(max_new_tokens=64, proposer="chained", k=4)
    result = engine.generate("def fib(n):", options)
    print(result.text, result.finish_reason, result.stats.mean_accepted_length)
    with engine.stream("def fib(n):", options) as pieces:  # admitted before the first piece
        for piece in pieces:
            print(piece, end="")
    results = engine.generate(["def a():", "def b():"], options)  # a list: one result each
    # asyncio: await speculant.AsyncEngine(engine).generate(...), async for ... in .stream(...)

Names are imported on first use (``import speculant`` loads only the errors), so the command
can answer an interrupt during its heavy imports (__main__.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from speculant.errors import (
    AdmissionError,
    ChainError,
    ContractError,
    MetadataError,
    RequestError,
    ResidencyError,
    SpeculantError,
    UnsupportedError,
)

if TYPE_CHECKING:
    from speculant.aio import AsyncEngine, AsyncStream
    from speculant.engine import Engine, load
    from speculant.generation import Decode, Generation, Stream
    from speculant.session.session import share_cpu_pool
    from speculant.workflow.constraint import Grammar
    from speculant.workflow.options import GenerationOptions
    from speculant.workflow.stats import DecodeStats

_LAZY = {"AsyncEngine": "aio", "AsyncStream": "aio", "Engine": "engine", "load": "engine",
         "Decode": "generation", "Generation": "generation", "Stream": "generation",
         "share_cpu_pool": "session.session", "GenerationOptions": "workflow.options",
         "DecodeStats": "workflow.stats", "Grammar": "workflow.constraint"}

__all__ = [
    "AdmissionError", "AsyncEngine", "AsyncStream", "ChainError", "ContractError", "Decode",
    "DecodeStats", "Engine", "Generation", "GenerationOptions", "Grammar", "MetadataError",
    "RequestError", "ResidencyError", "SpeculantError", "Stream", "UnsupportedError", "load",
    "share_cpu_pool",
]


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'speculant' has no attribute '{name}'")
    value = getattr(import_module(f"speculant.{_LAZY[name]}"), name)
    globals()[name] = value  # imported once
    return value
