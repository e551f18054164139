"""The Llama target as a batched pass over per-row static caches (docs/design/batching.md).

One pass runs a right-padded block ``input_ids`` [B, W]: row ``b`` holds ``block_lengths[b]``
valid tokens (``W_b`` ≤ W; 0 for a row that only pads the batch) at its own length
``cache_lengths[b]`` (``L_b``) and positions ``position_ids[b]``. Invariants, per row ``b``:

* **written**: the slots ``[L_b, L_b + W_b)`` of every cache buffer [B, KV, capacity, d] hold
  the block's keys and values; every other byte of the buffer is the byte it held. ONNX's
  ``TensorScatter`` (opset 24) writes the whole window ``[L_b, L_b + W)`` at the row's cursor
  (it has no per-row write length), so the window's padding tail is first read back from the
  buffer and written unchanged: a padding slot is rewritten with its own bytes, never with
  new data. In place when the past and the present are bound to one buffer.
* **read**: query ``i`` of the row sees slot ``j`` iff ``j ≤ L_b + i``: ONNX's ``Attention``
  (opset 24) with ``is_causal=1`` and ``nonpad_kv_seqlen = L_b + W``, whose causal frontier is
  bottom-right aligned per row. A valid query (``i < W_b``) therefore never reads a padding
  slot (``≥ L_b + W_b``) nor anything past the row's length; padding queries read what they
  like and their logits are garbage the driver ignores.
* **bound**: ``L_b + W ≤ capacity`` for every row, padding rows included (the window is
  gathered and scattered whole): the driver keeps ``W`` of headroom in each row's reservation,
  or gives an idle row the cursor 0.

Rollback of a row is a change of its ``cache_lengths`` entry: zero bytes move. At ``B = 1``
with ``block_lengths = [W]`` the pass is the static target's (docs/design/static-cache.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from speculant_tools.export.config import LlamaConfig
from speculant_tools.export.errors import ExportError
from speculant_tools.export.graphs import _Graph

BLOCK_LENGTHS = "block_lengths"  # [B] int64: the valid tokens of each row's block


class _BatchedGraph(_Graph):
    """The graph builder at opset 24, where ``ReduceMean`` takes its axes as an input."""

    def rms_norm(self, x: str, weight: str) -> str:
        """HF LlamaRMSNorm, as :meth:`_Graph.rms_norm` computes it."""
        x32 = self.to_float32(x, self.dtype)
        mean_square = self.op("ReduceMean", [self.op("Mul", [x32, x32]),
                                             self.const("last", [-1], "int64")], "ms",
                              keepdims=1)
        eps = self.const("eps", self.config.rms_norm_eps)
        inv_rms = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [mean_square, eps])])])
        normed = self.from_float32(self.op("Mul", [x32, inv_rms], "normed"), self.dtype)
        return self.op("Mul", [self.norm_scale(weight), normed], weight.rsplit(".", 1)[0])


def batchable(config: LlamaConfig) -> bool:
    """Whether :func:`batched_target_graph` takes ``config``: no sliding layers (``Attention``
    opset 24 has no window; opset 25's would be the way)."""
    return not any(config.sliding_layers)


def batched_target_graph(config: LlamaConfig, weights: Mapping[str, np.ndarray], dtype: str,
                         name: str = "target") -> onnx.ModelProto:
    """The target of :func:`~speculant_tools.export.graphs.target_graph` (same weights, the
    static form's inputs and outputs (``fused_hidden_states`` included) plus
    ``block_lengths``) as the batched pass of the module
    docstring. RMSNorm, RoPE and the projections are the node-by-node graph's; the attention
    is ONNX's ``Attention`` in the package dtype, the cache writes ``TensorScatter``."""
    if not batchable(config):
        raise ExportError("the batched pass has no sliding-window attention",
                          path="config.sliding_window", value=config.sliding_window,
                          remedy="export this target without the batch axis (cache='static')")
    c = config
    g = _BatchedGraph(name, c, dtype, cache="static")
    input_ids, lengths, position_ids, pasts = g.decoder_inputs(weights)
    g.add_input(BLOCK_LENGTHS, "int64", ("batch",))

    block = g.slots(input_ids, 1, "block")  # [W]: 0 .. W - 1
    cursors = g.unsqueeze(lengths, [1], "cursor")  # [B, 1]
    window = g.op("Add", [cursors, g.unsqueeze(block, [0], "block_row")], "window")  # [B, W]
    window = g.unsqueeze(window, [1, 3], "window4")  # [B, 1, W, 1]
    keep = g.op("Less", [g.unsqueeze(block, [0], "block_col"),
                         g.unsqueeze(BLOCK_LENGTHS, [1], "valid")], "keep")  # [B, W]
    keep = g.unsqueeze(keep, [1, 3], "keep4")  # [B, 1, W, 1]
    # nonpad_kv_seqlen = L + W: with is_causal bottom-right, query i sees slots <= L + i
    ones = g.op("Add", [g.op("Mul", [input_ids, g.const("zero", 0, "int64")]),
                        g.const("one", 1, "int64")], "ones")  # [B, W], W counted on the device
    width = g.op("ReduceSum", [ones, g.const("axis", [1], "int64")], "width", keepdims=0)
    visible = g.op("Add", [lengths, width], "visible")  # [B]

    def written(past: str, new: str) -> str:
        """``past`` with ``new`` [B, KV, W, d] at each row's cursor, the padding tail of the
        window rewritten with the bytes it held."""
        at = g.op("Expand", [window, g.op("Shape", [new], "new_shape")], "at")
        held = g.op("GatherElements", [past, at], "held", axis=2)  # [B, KV, W, d]
        update = g.op("Where", [keep, new, held], "update")
        return g.op("TensorScatter", [past, update, lengths], "written", axis=2)

    # each row's sequence ends at L + W_b (its padding's positions run on past it)
    ropes = g.layer_ropes(position_ids, g.op("Add", [lengths, BLOCK_LENGTHS], "row_ends"))
    attrs = {"scale": c.attention_scale}
    if c.attn_logit_softcapping is not None:
        attrs["softcap"] = float(c.attn_logit_softcapping)
    x = g.embed(input_ids)  # [B, W, hidden]
    presents, streams = [], []  # streams[i]: the residual stream entering layer i
    for i, (past_key, past_value) in enumerate(pasts):
        prefix = f"model.layers.{i}"
        streams.append(x)
        h = g.rms_norm(x, f"{prefix}.input_layernorm.weight")
        q, k = ((g.from_float32(g.rotate(g.to_float32(g.head_norm(
            g.heads(g.projection(h, prefix, part), heads), f"{prefix}.self_attn.{part}_norm"
            ".weight"), dtype), ropes[i]), dtype))
            for part, heads in (("q", c.num_attention_heads), ("k", c.num_key_value_heads)))
        v = g.heads(g.projection(h, prefix, "v"), c.num_key_value_heads)
        key, value = written(past_key, k), written(past_value, v)  # [B, KV, capacity, d]
        presents.append((key, value))
        context = g.op("Attention", [q, key, value, "", "", "", visible], "attend",
                       is_causal=1, **attrs)  # [B, H, W, d]
        context = g.op("Transpose", [context], "bshd", perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, g.const("merge", [0, 0, -1], "int64")])
        x = g.layer_tail(x, g.projection(context, prefix, "o"), prefix)
    g.decoder_outputs(g.rms_norm(x, "model.norm.weight"), presents)
    g.seed_output([*streams, x])
    return g.finish("target")
