"""Phi-3 128k's and Phi-3.5's longrope (``su``), as both sources carry it: ``config.json``'s
``rope_scaling`` (read in :mod:`~speculant_tools.importers.families`) and a GGUF's
``rope_factors_short.weight`` / ``rope_factors_long.weight`` with
``ARCH.rope.scaling.original_context_length`` and ``attn_factor`` (llama.cpp's converter).

With both factor sets the package keeps the model's whole context: its graphs rotate a
forward call with the short factors while its sequence is at most the original context and
with the long ones beyond (:class:`~speculant_tools.export.RopeScaling`). A checkpoint
without long factors rotates with the short ones at every length, so its context is capped
at the original one, and the import logs that.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from speculant_tools.export.rope import RopeScaling

LONGROPE = ("rope_factors_short.weight", "rope_factors_long.weight")  # a GGUF's tensors
log = logging.getLogger("speculant_tools.importers")


def longrope_scaling(short: tuple[float, ...], long: tuple[float, ...] | None,
                     original: int, attention: float, sizes: dict[str, Any]) -> RopeScaling:
    """Longrope with ``short`` factors, ``long`` ones (None: none in the checkpoint) beyond
    ``original`` tokens, and ``attention`` on cos and sin; without long factors the context
    (``sizes``) is capped at ``original`` and a warning says so."""
    if long is None:
        if sizes["max_position_embeddings"] > original:
            log.warning("longrope without long factors: the short factors serve every length "
                        "and the context is capped at the original %d tokens (of %d)",
                        original, sizes["max_position_embeddings"])
        sizes["max_position_embeddings"] = min(sizes["max_position_embeddings"], original)
        return RopeScaling("longrope", frequency_factors=short, attention_factor=attention)
    return RopeScaling("longrope", frequency_factors=short, attention_factor=attention,
                       long_factors=long, original_max_position_embeddings=original)


def gguf_longrope(fields: Any, arch: str, tensors: list[Any], sizes: dict[str, Any]
                  ) -> RopeScaling:
    """llama.cpp's longrope (``fields``: gguf_file's reader of the file's keys): the
    divisors of ``rope_factors_short.weight`` and, where the file has it,
    ``rope_factors_long.weight`` (each one F32 row per rotated pair), beyond
    ``rope.scaling.original_context_length``; ``rope.scaling.attn_factor`` on cos and sin
    (the converter's sqrt(1 + log(s) / log(original))), as the Hugging Face import reads the
    same model."""
    half = (fields.count(f"{arch}.rope.dimension_count", None) or sizes["head_dim"]) // 2
    factors = []
    for name in LONGROPE:
        tensor = next((t for t in tensors if t.name == name), None)
        if tensor is None:
            factors.append(None)
            continue
        if tensor.tensor_type.name != "F32" or [int(n) for n in tensor.shape] != [half]:
            raise fields.refuse(f"tensors.{name}", "the longrope factors must be one F32 row "
                                "of head_dim / 2 values", (tensor.tensor_type.name,
                                [int(n) for n in tensor.shape]), f"F32 [{half}]")
        with np.errstate(all="ignore"):  # non-finite factors: refused by RopeScaling
            factors.append(tuple(float(x) for x in np.asarray(tensor.data, np.float32)
                                 .reshape(-1)))
    return longrope_scaling(factors[0], factors[1], fields.count(
        f"{arch}.rope.scaling.original_context_length"), fields.positive(
        f"{arch}.rope.scaling.attn_factor", 1.0), sizes)
