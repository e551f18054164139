"""speculant: speculative decoding for ONNX inference packages.

    import speculant
    engine = speculant.load("path/to/package")          # device="cpu" or "cuda"
    result = engine.generate("def fib(n):", 64, speculative=True, k=4)
    print(result.text, result.stats.mean_accepted_length)
"""

from speculant.engine import Engine, Generation, load
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

__all__ = [
    "AdmissionError", "ChainError", "ContractError", "Engine", "Generation", "MetadataError",
    "RequestError", "ResidencyError", "SpeculantError", "UnsupportedError", "load",
]
