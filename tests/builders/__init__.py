"""Hermetic test fixtures built in code (evidence.md §3): a greedy decoder package and a
chained target/drafter pair over a 32-token vocabulary, their numpy reference, and the exact
greedy streams and speculative traces they must produce.

    from builders import write_chained_package, FixtureSpec, speculative_trace
    root = write_chained_package(tmp_path / "pair", dtype="float16")
    trace = speculative_trace(FixtureSpec(), encode("def "), max_new_tokens=24, k=2)
    trace.pairs(), trace.counters(), trace.tokens     # (k_r, a_r) per round, stats, G

Modules: ``definition`` (what the fixtures compute), ``graphs`` (ONNX), ``metadata``
(documents), ``writers`` (packages on disk), ``reference`` (the graphs in numpy),
``trace`` (expected streams and traces), ``tokenizer``.
"""

from builders.definition import (
    DEFAULT_DEVIATION_POSITIONS,
    EOS_ID,
    TOKENS,
    UNK_ID,
    VOCAB_SIZE,
    FixtureSpec,
)
from builders.metadata import chained_metadata, decoder_metadata
from builders.tokenizer import build_tokenizer, decode, encode
from builders.trace import (
    Round,
    Trace,
    greedy_stream,
    speculative_trace,
    target_next,
)
from builders.writers import VARIANTS, write_chained_package, write_decoder_package
from speculant_tools.writing import read_model, write_metadata

__all__ = [
    "DEFAULT_DEVIATION_POSITIONS", "EOS_ID", "TOKENS", "UNK_ID", "VARIANTS", "VOCAB_SIZE",
    "FixtureSpec", "Round", "Trace", "build_tokenizer", "chained_metadata", "decode",
    "decoder_metadata", "encode", "greedy_stream", "read_model", "speculative_trace",
    "target_next", "write_chained_package", "write_decoder_package", "write_metadata",
]
