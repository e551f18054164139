"""speculant: speculative decoding for ONNX inference packages.

    import speculant
    engine = speculant.load("path/to/package")          # device="cpu" or "cuda"
    options = speculant.GenerationOptions(max_new_tokens=64, proposer="chained", k=4)
    result = engine.generate("def fib(n):", options)
    print(result.text, result.finish_reason, result.stats.mean_accepted_length)
    for piece in engine.stream("def fib(n):", options):  # admitted before the first piece
        print(piece, end="")
"""

from speculant.engine import Engine, load
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
from speculant.generation import Decode, Generation, Stream
from speculant.session.session import share_cpu_pool
from speculant.workflow.options import GenerationOptions
from speculant.workflow.stats import DecodeStats

__all__ = [
    "AdmissionError", "ChainError", "ContractError", "Decode", "DecodeStats", "Engine",
    "Generation", "GenerationOptions", "MetadataError", "RequestError", "ResidencyError",
    "SpeculantError", "Stream", "UnsupportedError", "load", "share_cpu_pool",
]
