"""speculant: speculative decoding for ONNX inference packages.

    import speculant
    engine = speculant.load("path/to/package")          # device="cpu" or "cuda"
    options = speculant.GenerationOptions(max_new_tokens=64, proposer="chained", k=4)
    result = engine.generate("def fib(n):", options)
    print(result.text, result.finish_reason, result.stats.mean_accepted_length)
    for piece in engine.stream("def fib(n):", options):  # admitted before the first piece
        print(piece, end="")

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
    from speculant.engine import Engine, load
    from speculant.generation import Decode, Generation, Stream
    from speculant.session.session import share_cpu_pool
    from speculant.workflow.constraint import Grammar
    from speculant.workflow.options import GenerationOptions
    from speculant.workflow.stats import DecodeStats

_LAZY = {"Engine": "engine", "load": "engine", "Decode": "generation", "Generation": "generation",
         "Stream": "generation", "share_cpu_pool": "session.session",
         "GenerationOptions": "workflow.options", "DecodeStats": "workflow.stats",
         "Grammar": "workflow.constraint"}

__all__ = [
    "AdmissionError", "ChainError", "ContractError", "Decode", "DecodeStats", "Engine",
    "Generation", "GenerationOptions", "Grammar", "MetadataError", "RequestError", "ResidencyError",
    "SpeculantError", "Stream", "UnsupportedError", "load", "share_cpu_pool",
]


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'speculant' has no attribute '{name}'")
    value = getattr(import_module(f"speculant.{_LAZY[name]}"), name)
    globals()[name] = value  # imported once
    return value
