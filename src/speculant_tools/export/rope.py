"""RoPE's inverse frequencies, plain or rescaled, and the cos/sin tables the graphs bake in.

Every scaling here rescales the inverse frequencies, and longrope also multiplies cos and sin
by its attention factor, so one table of ``max_position_embeddings`` rows serves every graph
form: the explicit rotation, ONNX's RotaryEmbedding and GroupQueryAttention's caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from speculant_tools.export.errors import ExportError

ROPE_TYPES = ("linear", "llama3", "factors", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """How plain RoPE's inverse frequencies are rescaled (``rope_type``):

    * ``linear``: every frequency divided by ``factor`` (Hugging Face ``rope_scaling``
      ``linear``, GGUF ``rope.scaling.type: linear``);
    * ``llama3`` (Llama 3.1 and later): wavelengths longer than
      ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, those
      shorter than ``original_max_position_embeddings / high_freq_factor`` kept, the band
      between interpolated (transformers' ``_compute_llama3_parameters``, in float32);
    * ``factors``: frequency ``i`` divided by ``frequency_factors[i]`` (a GGUF's
      ``rope_freqs.weight``: llama.cpp's converter writes llama3 scaling so);
    * ``longrope`` (Phi-3 128k, Phi-3.5; ``su`` before): frequency ``i`` divided by
      ``frequency_factors[i]``, one of the checkpoint's two sets, and cos and sin multiplied
      by ``attention_factor``. transformers takes the short factors up to
      ``original_max_position_embeddings`` tokens and the long ones beyond; a static table
      holds one set, so an importer bakes the short ones and caps the context there.
    """

    rope_type: str
    factor: float | None = None  # linear, llama3
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position_embeddings: int | None = None  # llama3
    frequency_factors: tuple[float, ...] | None = None  # factors, longrope: [head_dim / 2]
    attention_factor: float | None = None  # longrope

    def __post_init__(self) -> None:
        if self.frequency_factors is not None:  # a JSON list comes back as a tuple
            object.__setattr__(self, "frequency_factors", tuple(self.frequency_factors))
        required = {"linear": ("factor",), "factors": ("frequency_factors",),
                    "longrope": ("frequency_factors", "attention_factor"),
                    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                               "original_max_position_embeddings")}
        if self.rope_type not in required:
            raise ExportError("unsupported RoPE scaling", path="config.rope_scaling.rope_type",
                              value=self.rope_type, expected=" or ".join(ROPE_TYPES))
        numbers = [getattr(self, name) for name in required[self.rope_type]]
        if self.rope_type in ("factors", "longrope"):
            numbers = [*(self.frequency_factors or [None]), *numbers[1:]]
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                   and x > 0 for x in numbers):
            raise ExportError(f"{self.rope_type} RoPE scaling needs positive finite "
                              f"{', '.join(required[self.rope_type])}",
                              path="config.rope_scaling", value=self)
        if self.rope_type == "llama3" and self.low_freq_factor >= self.high_freq_factor:
            raise ExportError("llama3 RoPE scaling needs low_freq_factor < high_freq_factor",
                              path="config.rope_scaling.low_freq_factor",
                              value=(self.low_freq_factor, self.high_freq_factor))


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None
                        ) -> np.ndarray:
    """``[head_dim / 2]`` float32: ``1 / theta ** (2i / head_dim)`` as transformers computes
    it in float32, rescaled as ``scaling`` says (None: plain RoPE)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) \
        / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.rope_type == "factors":
        return (inv_freq / np.asarray(scaling.frequency_factors, np.float32)).astype(np.float32)
    if scaling.rope_type == "longrope":  # transformers' order: 1 / (factor * theta ** e)
        return (np.float32(1.0) / (np.asarray(scaling.frequency_factors, np.float32)
                                   * np.float32(theta) ** exponents)).astype(np.float32)
    factor, low, high = (np.float32(x) for x in (
        scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor))
    context = np.float32(scaling.original_max_position_embeddings)
    wavelen = np.float32(2 * math.pi) / inv_freq
    long_wavelen, short_wavelen = context / low, context / high
    scaled = np.where(wavelen > long_wavelen, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = ((context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < short_wavelen) & ~(wavelen > long_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(config) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin ``[max_position_embeddings, rotated_dim]`` float32 of ``config`` (a
    :class:`~speculant_tools.export.config.LlamaConfig`), as transformers' rotary embedding
    computes them (float32 frequencies times positions, halves duplicated; longrope's
    attention factor multiplied in)."""
    inv_freq = inverse_frequencies(config.rotated_dim, config.rope_theta, config.rope_scaling)
    positions = np.arange(config.max_position_embeddings, dtype=np.float32)
    freqs = np.outer(positions, inv_freq).astype(np.float32)  # [max_ctx, dim / 2]
    angles = np.concatenate([freqs, freqs], axis=-1)  # [max_ctx, dim]
    scaling = config.rope_scaling
    factor = np.float32(scaling.attention_factor if scaling is not None
                        and scaling.rope_type == "longrope" else 1.0)
    return (np.cos(angles) * factor).astype(np.float32), \
        (np.sin(angles) * factor).astype(np.float32)
