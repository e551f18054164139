"""The target graph's blocks for the architecture variations of
:class:`~speculant_tools.export.config.LlamaConfig` (Gemma's scaled embeddings, offset and
sandwich norms, GeGLU, soft caps, QK norms, sliding layers with their own RoPE base, RoPE
tables and longrope's choice between two of them; the biases are ``_Graph.projection``'s):
a mixin
of the graph builder (``export/graphs.py``), each block the identity, or Llama's form, where
the configuration keeps Llama's default. The graphs read the fields, never a family name.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto

from speculant_tools.export.config import EMBEDDING, LlamaConfig, pre_mlp_norm
from speculant_tools.export.rope import rope_tables


def local_rope(config: LlamaConfig) -> LlamaConfig:
    """The configuration of a sliding layer's RoPE (Gemma 3): ``rope_local_base_freq``
    unscaled, as transformers rotates its local layers (the scaling is the global
    layers')."""
    return replace(config, rope_theta=config.rope_local_base_freq, rope_scaling=None)


class Variations:
    """Blocks of ``_Graph`` (``self`` has its ``config``, ``dtype``, ``op``, ``const``,
    ``weight``, ``unsqueeze``, ``rms_norm`` and ``mlp``)."""

    config: LlamaConfig
    dtype: str

    def norm_scale(self, weight: str) -> str:
        """An RMSNorm's scale: ``weight``, or ``norm_weight_offset + weight`` (Gemma's
        ``1 + w``; folded once when ONNX Runtime creates the session)."""
        offset = self.config.norm_weight_offset
        if offset == 0:
            return weight
        return self.op("Add", [weight, self.const("offset", offset, self.dtype)], "scale")

    def head_norm(self, x: str, weight: str) -> str:
        """``qk_norm``: RMSNorm over head_dim of ``x`` [b, heads, s, d], else ``x``."""
        return self.rms_norm(x, weight) if self.config.qk_norm else x

    def soft_cap(self, x: str, cap: float | None) -> str:
        """``cap * tanh(x / cap)`` in float32 (``x`` as it came), or ``x`` for no cap."""
        if cap is None:
            return x
        x32 = self.to_float32(x, self.dtype)
        capped = self.op("Tanh", [self.op("Div", [x32, self.const("cap", cap)])], "tanh")
        return self.from_float32(self.op("Mul", [capped, self.const("cap", cap)], "capped"),
                                 self.dtype)

    def gelu_tanh(self, x: str) -> str:
        """GELU's tanh approximation (``gelu_pytorch_tanh``) in float32:
        ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``."""
        x32 = self.to_float32(x, self.dtype)
        cube = self.op("Mul", [self.op("Mul", [x32, x32]), x32], "cube")
        inner = self.op("Add", [x32, self.op("Mul", [cube, self.const("k", 0.044715)])])
        tanh = self.op("Tanh", [self.op("Mul", [inner, self.const("c", (2 / np.pi) ** 0.5)])])
        half = self.op("Mul", [x32, self.const("half", 0.5)], "half_x")
        gelu = self.op("Mul", [half, self.op("Add", [tanh, self.const("one", 1.0)])], "gelu")
        return self.from_float32(gelu, self.dtype)

    def embed(self, input_ids: str) -> str:
        """The embeddings ``[b, s, hidden]`` of ``input_ids``, times ``embedding_multiplier``
        (rounded to the package dtype, as Gemma's scaled embedding does)."""
        x = self.op("Gather", [EMBEDDING, input_ids], "embeds")
        multiplier = self.config.embedding_multiplier
        if multiplier == 1.0:
            return x
        return self.op("Mul", [x, self.const("embed_scale", multiplier, self.dtype)], "scaled")

    def is_long_rope(self, config: LlamaConfig, ends: str, axis: int, keepdims: int
                     ) -> str | None:
        """bool: whether a forward call rotates with longrope's long table, ``ends`` (int64,
        each a sequence's length so far: its largest position + 1) reduced over ``axis``:
        true where one of them exceeds ``original_max_position_embeddings``
        (transformers' ``longrope_frequency_update``); None where ``config`` has one table.
        The one home of the choice: every graph form asks it."""
        original = None if config.rope_scaling is None else config.rope_scaling.long_after
        if original is None:
            return None
        beyond = self.op("Cast", [self.op("Greater", [ends, self.const(
            "original", original, "int64")], "beyond")], "beyond_n", to=TensorProto.INT64)
        count = self.op("ReduceSum", [beyond, self.const("axis", [axis], "int64")], "num_beyond",
                        keepdims=keepdims)
        return self.op("Greater", [count, self.const("zero", 0, "int64")], "is_long")

    def gathered_rope(self, position_ids: str, config: LlamaConfig | None = None,
                      suffix: str = "", ends: str | None = None) -> tuple[str, str]:
        """cos, sin ``[b, s, rotated]`` float32 gathered at ``position_ids`` [b, s]
        (``config``'s tables, default the graph's; ``suffix`` names a second pair). With
        longrope's long factors, row ``b``'s come from the long table where
        :meth:`is_long_rope` says so of its end ``ends[b]`` (int64 [b]; default
        ``max(position_ids[b]) + 1``), else from the short one."""
        c = config or self.config

        def gathered(is_long: bool) -> list[str]:
            name = "_".join(part for part in (suffix, "long" if is_long else "") if part)
            return [self.op("Gather", [self.weight(f"speculant.rope.{part}{name and '_' + name}",
                                                   table), position_ids], part)
                    for part, table in zip(("cos", "sin"), rope_tables(c, is_long), strict=True)]

        short = gathered(False)
        row_ends = self.op("Add", [position_ids, self.const("one", 1, "int64")], "ends") \
            if ends is None else self.unsqueeze(ends, [1], "ends")
        is_long = self.is_long_rope(c, row_ends, 1, 1)  # [b, 1]
        if is_long is None:
            return short[0], short[1]
        is_long = self.unsqueeze(is_long, [2], "is_long_rows")  # [b, 1, 1]
        cos, sin = (self.op("Where", [is_long, long, part], "rope_chosen")
                    for long, part in zip(gathered(True), short, strict=True))
        return cos, sin

    def rope_at(self, position_ids: str, config: LlamaConfig | None = None,
                suffix: str = "", ends: str | None = None) -> tuple[str, str]:
        """:meth:`gathered_rope` with a heads axis: cos, sin ``[b, 1, s, rotated]`` float32."""
        cos, sin = self.gathered_rope(position_ids, config, suffix, ends)
        return self.unsqueeze(cos, [1], "cos"), self.unsqueeze(sin, [1], "sin")

    def layer_ropes(self, position_ids: str, ends: str | None = None
                    ) -> list[tuple[str, str]]:
        """Per layer, :meth:`rope_at`'s cos and sin (``ends``: each row's sequence length,
        as it takes them): a sliding layer's at ``rope_local_base_freq`` where the
        configuration has one (:func:`local_rope`)."""
        c = self.config
        rope = self.rope_at(position_ids, ends=ends)
        local = rope
        if c.rope_local_base_freq is not None and any(c.sliding_layers):
            local = self.rope_at(position_ids, local_rope(c), "local", ends)
        return [local if sliding else rope for sliding in c.sliding_layers]

    def layer_masks(self, allowed: str, query_pos: str, key_pos: str) -> list[str]:
        """Per layer, the keys each query may see: ``allowed``, and for a sliding layer
        only the keys ``j > q - sliding_window`` among them (``query_pos`` [s], ``key_pos``
        [T] int64; ``allowed`` broadcasts against [s, T])."""
        c = self.config
        if not any(c.sliding_layers):
            return [allowed] * c.num_hidden_layers
        oldest = self.op("Sub", [query_pos, self.const("window", c.sliding_window, "int64")])
        inside = self.op("Greater", [self.unsqueeze(key_pos, [0]), self.unsqueeze(oldest, [1])],
                         "inside")  # [s, T]
        local = self.op("And", [allowed, inside], "allowed_local")
        return [local if sliding else allowed for sliding in c.sliding_layers]

    def layer_tail(self, x: str, attended: str, prefix: str) -> str:
        """The residual stream after a layer whose attention gave ``attended``: Llama's
        ``x + a``, then ``+ mlp(norm(.))``; with ``post_norms`` (Gemma) each branch's output
        normalized before it is added."""
        if self.config.post_norms:
            attended = self.rms_norm(attended, f"{prefix}.post_attention_layernorm.weight")
        x = self.op("Add", [x, attended], "resid")
        out = self.mlp(self.rms_norm(x, pre_mlp_norm(self.config, prefix)), prefix)
        if self.config.post_norms:
            out = self.rms_norm(out, f"{prefix}.post_feedforward_layernorm.weight")
        return self.op("Add", [x, out], "resid")
