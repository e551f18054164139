"""RoPE's inverse frequencies, plain or rescaled, and the cos/sin tables the graphs bake in.

Every scaling here rescales the inverse frequencies, and longrope also multiplies cos and sin
by its attention factor, so one table of ``max_position_embeddings`` rows serves every graph
form: the explicit rotation, ONNX's RotaryEmbedding and GroupQueryAttention's caches. Longrope
with long factors has two such tables, short and long; the graphs choose between them per
forward call (``export/variations.py``, ``Variations.is_long_rope``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from speculant_tools.export.errors import ExportError

ROPE_TYPES = ("linear", "llama3", "factors", "longrope")
LONG_REMEDY = ("take the model's own long factors (config.json's rope_scaling.long_factor, a "
               "GGUF's rope_factors_long.weight), or drop them to cap the context at the "
               "original one")


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
      ``frequency_factors[i]`` (the short factors), or by ``long_factors[i]`` in a forward
      call whose sequence (its largest position + 1) is longer than
      ``original_max_position_embeddings`` (transformers' ``longrope_frequency_update``;
      keys already cached keep the rotation they were written with); cos and sin multiplied
      by ``attention_factor`` either way. Without ``long_factors`` the short ones serve every
      call, and an importer caps the context at the original one.
    """

    rope_type: str
    factor: float | None = None  # linear, llama3
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position_embeddings: int | None = None  # llama3; longrope's long factors
    frequency_factors: tuple[float, ...] | None = None  # factors, longrope: [head_dim / 2]
    attention_factor: float | None = None  # longrope
    long_factors: tuple[float, ...] | None = None  # longrope beyond the original: [head_dim / 2]

    def __post_init__(self) -> None:
        for name in ("frequency_factors", "long_factors"):  # a JSON list comes back a tuple
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
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
        if self.long_factors is not None:
            self._check_long_factors()
        if self.rope_type == "llama3" and self.low_freq_factor >= self.high_freq_factor:
            raise ExportError("llama3 RoPE scaling needs low_freq_factor < high_freq_factor",
                              path="config.rope_scaling.low_freq_factor",
                              value=(self.low_freq_factor, self.high_freq_factor))

    def _check_long_factors(self) -> None:
        """Long factors: longrope's, as many as the short ones, positive and finite, with
        the original context (an int >= 1) beyond which they serve."""
        original = self.original_max_position_embeddings
        if self.rope_type != "longrope" or len(self.long_factors) != len(
                self.frequency_factors) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                and x > 0 for x in self.long_factors):
            raise ExportError("long_factors are longrope's: one positive finite factor per "
                              "short one", path="config.rope_scaling.long_factors",
                              value=self.long_factors, remedy=LONG_REMEDY)
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ExportError("longrope's long factors need the original context",
                              path="config.rope_scaling.original_max_position_embeddings",
                              value=original, expected="an integer >= 1",
                              remedy=LONG_REMEDY)

    @property
    def long_after(self) -> int | None:
        """The sequence length beyond which a forward call rotates with the long factors
        (longrope with ``long_factors``), else None: one table serves every call."""
        return self.original_max_position_embeddings if self.long_factors is not None \
            else None


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None,
                        is_long: bool = False) -> np.ndarray:
    """``[head_dim / 2]`` float32: ``1 / theta ** (2i / head_dim)`` as transformers computes
    it in float32, rescaled as ``scaling`` says (None: plain RoPE); ``is_long``: longrope's
    long factors instead of its short ones."""
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
        factors = scaling.long_factors if is_long else scaling.frequency_factors
        return (np.float32(1.0) / (np.asarray(factors, np.float32)
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


def rope_tables(config, is_long: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin ``[max_position_embeddings, rotated_dim]`` float32 of ``config`` (a
    :class:`~speculant_tools.export.config.LlamaConfig`), as transformers' rotary embedding
    computes them (float32 frequencies times positions, halves duplicated; longrope's
    attention factor multiplied in); ``is_long``: with longrope's long factors."""
    inv_freq = inverse_frequencies(config.rotated_dim, config.rope_theta, config.rope_scaling,
                                   is_long)
    positions = np.arange(config.max_position_embeddings, dtype=np.float32)
    freqs = np.outer(positions, inv_freq).astype(np.float32)  # [max_ctx, dim / 2]
    angles = np.concatenate([freqs, freqs], axis=-1)  # [max_ctx, dim]
    scaling = config.rope_scaling
    factor = np.float32(scaling.attention_factor if scaling is not None
                        and scaling.rope_type == "longrope" else 1.0)
    return (np.cos(angles) * factor).astype(np.float32), \
        (np.sin(angles) * factor).astype(np.float32)
