"""The Llama target with ONNX Runtime's fused kernels (float16 by default; float32 on request).

On a GPU a decode pass of the node-by-node graph
(:func:`speculant_tools.export.graphs.target_graph`,
about 70 kernels per layer) is bound by ONNX Runtime launching kernels, not by reading the
weights: the ~1B cost-scaled target took 6.9 ms per pass in float16 on an H200, where its
2 GB of weights take 0.5 ms to read. This graph computes the same function with about ten
kernels per layer, the contrib operators ONNX Runtime ships for exactly this:

* ``SimplifiedLayerNormalization`` (RMSNorm, float32 statistics) for the first norm, and
  ``com.microsoft.SkipSimplifiedLayerNormalization`` for every later one, which adds the
  residual and normalizes in one kernel (output 0: the normed value, output 3: the sum);
* one ``MatMul`` against q, k and v packed (the packing is a ``Concat`` of the transposed
  initializers, folded once when the session is created), plus the packed q/k/v biases
  where the configuration declares them;
* ``com.microsoft.GroupQueryAttention`` with rotary embedding inside (``do_rotary``,
  half-rotation as HF's ``rotate_half``), ``past_key``/``past_value`` ``[b, KV, P, d]`` in
  and ``present`` ``[b, KV, P + s, d]`` out: the same cache cells as the explicit graph. It
  takes ``seqlens_k`` (= total length − 1) and ``total_sequence_length``, both computed in
  the graph from ``attention_mask``, and places rotary at positions ``P + i``.

With ``cache="static"`` (onnxruntime-genai's ``past_present_share_buffer`` form) the pasts are
fixed-capacity buffers ``[b, KV, capacity, d]`` and each present is the GroupQueryAttention
node's own output with the capacity shape, so a driver that binds a layer's past and present
to one buffer gets the block written in place at ``[P, P + s)`` (ONNX Runtime's kernel sees
equal addresses and skips its copy). ``seqlens_k`` = ``cache_lengths + s − 1`` and
``total_sequence_length`` = the capacity (a shape, so it is fixed for a CUDA graph; it is a
host input of the kernel). Every other value is computed on the device from device inputs, so
no host-to-device copy sits inside the graph (ONNX Runtime refuses to capture one).

What it assumes: the attention mask is all ones (what speculant's driver binds: no padding
in a one-sequence pass) and ``position_ids`` = ``P + i`` (speculant binds exactly that; the
input stays in the graph's signature, GroupQueryAttention derives the positions itself).
Weights keep their Hugging Face names and layout, so :func:`~speculant_tools.export.read_weights`
reads a fused package like any other. ONNX Runtime's GroupQueryAttention has CUDA kernels
for float16 and bfloat16 only and CPU kernels for float32 and float16, so ``graph="auto"``
fuses float16 only (it runs everywhere); ``graph="fused"`` also fuses float32, for a package
meant for the CPU (on CUDA its session is refused, with that remedy); bfloat16 stays node by
node, for want of CPU kernels.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto

from speculant_tools.export.config import EMBEDDING, ExportError, LlamaConfig, pre_mlp_norm
from speculant_tools.export.graphs import MS_DOMAIN, _Graph
from speculant_tools.export.rope import rope_tables
from speculant_tools.export.variations import local_rope

FUSED_DTYPES = ("float16", "float32")  # bfloat16: ONNX Runtime's CPU kernels lack it
GRAPHS = ("auto", "fused", "explicit")


def fusable(config: LlamaConfig, dtype: str) -> bool:
    """Whether ONNX Runtime's fused kernels take this target: float16 or float32, and a head
    size and a turned width that GroupQueryAttention with rotary accepts (multiples of 16:
    its cos/sin caches' width, half the turned values, a multiple of 8)."""
    return dtype in FUSED_DTYPES and config.head_dim % 16 == 0 and config.rotated_dim % 16 == 0


def use_fused(config: LlamaConfig, dtype: str, graph: str = "auto") -> bool:
    """``graph`` ``auto``: fused for float16 where the kernels take it (it runs on the CPU
    and on CUDA), node by node otherwise (float32 GroupQueryAttention has no CUDA kernel, and
    a package does not know its device); ``fused``: fused or an ExportError; ``explicit``:
    node by node."""
    if graph not in GRAPHS:
        raise ExportError(f"graph must be one of {GRAPHS}", path="graph", value=graph)
    if graph == "fused" and not fusable(config, dtype):
        raise ExportError(
            f"no fused target for {dtype} with head_dim {config.head_dim} (rotary "
            f"{config.rotated_dim})", path="graph", value=graph, expected=f"a dtype in "
            f"{FUSED_DTYPES}, head_dim and rotary_dim multiples of 16",
            remedy="use graph='explicit' (or 'auto')")
    return graph == "fused" or (graph == "auto" and dtype == "float16"
                                and fusable(config, dtype))


def fused_target_graph(config: LlamaConfig, weights: Mapping[str, np.ndarray], dtype: str,
                       name: str = "target", *, cache: str = "appended") -> onnx.ModelProto:
    """The target of :func:`~speculant_tools.export.graphs.target_graph` (same inputs,
    outputs (``fused_hidden_states`` included), weights and cells) with fused kernels;
    ``dtype`` float16 or float32 (float32 runs on the CPU only: ONNX Runtime has no float32
    GroupQueryAttention for CUDA)."""
    if not fusable(config, dtype):
        raise ValueError(f"no fused target for {dtype} with head_dim {config.head_dim}: "
                         f"needs one of {FUSED_DTYPES} and a head_dim multiple of 16")
    c = config
    g = _Graph(name, c, dtype, fused_norms=True, cache=cache)
    # position_ids stays in the signature: GroupQueryAttention places rotary at P + i itself
    input_ids, mask, _, pasts = g.decoder_inputs(weights)

    if g.is_static:  # seqlens_k [b] = P + s - 1; total_sequence_length = the capacity
        # s counted on the device (a host scalar from Shape would need a copy: no CUDA graph)
        ones = g.op("Add", [g.op("Mul", [input_ids, g.const("zero", 0, "int64")]),
                            g.const("one", 1, "int64")], "ones")  # [b, s]
        num_new = g.op("ReduceSum", [ones, g.const("axis", [1], "int64")], "num_new",
                       keepdims=0)  # [b]
        valid = g.op("Add", [mask, num_new], "valid")  # [b] P + s
    else:  # seqlens_k [b] int32 = ones in the mask - 1; total_sequence_length int32 = T
        valid = g.op("ReduceSum", [mask, g.const("axis", [1], "int64")], "valid", keepdims=0)
    seqlens_k = g.op("Cast", [g.op("Sub", [valid, g.const("one", 1, "int64")])], "seqlens_k",
                     to=TensorProto.INT32)
    total = g.op("Cast", [g.dim(pasts[0][0], 2, "capacity") if g.is_static
                          else g.dim(mask, 1, "total")], "total_len", to=TensorProto.INT32)
    caches = _rotary_caches(g, weights[EMBEDDING].dtype, valid)  # per layer: (cos, sin)

    x = g.embed(input_ids)  # [b, s, hidden]
    h = g.norm(x, "model.layers.0.input_layernorm.weight")
    presents, streams = [], []  # streams[i]: the residual stream entering layer i
    for i, (past_key, past_value) in enumerate(pasts):
        prefix = f"model.layers.{i}"
        streams.append(x)
        context, key, value = g.node(
            "GroupQueryAttention", [*_qkv(g, h, prefix), past_key, past_value, seqlens_k,
                                    total, *caches[i]], 3, "gqa", MS_DOMAIN,
            num_heads=c.num_attention_heads, kv_num_heads=c.num_key_value_heads,
            scale=c.attention_scale, do_rotary=1, rotary_interleaved=0,
            **_window_and_cap(c, i))  # context [b, s, H d]; key, value [b, KV, P + s, d]
        presents.append((key, value))
        attended = g.projection(context, prefix, "o")
        if c.post_norms:
            attended = g.norm(attended, f"{prefix}.post_attention_layernorm.weight")
        h, x = g.add_norm(x, attended, pre_mlp_norm(c, prefix))
        mlp = g.mlp(h, prefix)
        if c.post_norms:
            mlp = g.norm(mlp, f"{prefix}.post_feedforward_layernorm.weight")
        following = (f"model.layers.{i + 1}.input_layernorm.weight"
                     if i + 1 < c.num_hidden_layers else "model.norm.weight")
        h, x = g.add_norm(x, mlp, following)
    hidden = h  # [b, s, hidden]: the final norm's output

    g.decoder_outputs(hidden, presents)
    g.seed_output([*streams, x])
    return g.finish("target")


def _rotary_caches(g: _Graph, storage: np.dtype, ends: str) -> list[tuple[str, str]]:
    """Per layer, GroupQueryAttention's ``cos_cache`` and ``sin_cache`` [max_pos,
    rotated / 2] in the package dtype (the kernel turns as many values as they say): a
    sliding layer's at ``rope_local_base_freq`` where one is set. With longrope's long
    factors, the long tables where :meth:`_Graph.is_long_rope` says so of the rows' ends
    (``ends`` [b] int64: the kernel takes one cache for the batch, so the longest row
    chooses; speculant runs this graph one sequence at a time)."""
    c = g.config

    def caches(config: LlamaConfig, suffix: str) -> tuple[str, str]:
        half = c.rotated_dim // 2

        def pair(is_long: bool) -> list[str]:
            name = f"{suffix}_long" if is_long else suffix
            return [g.weight(f"speculant.rope.{part}_cache{name}", table[:, :half].astype(
                storage)) for part, table in zip(("cos", "sin"), rope_tables(config, is_long),
                                                 strict=True)]  # [max_pos, rotated / 2]

        is_long = g.is_long_rope(config, ends, 0, 0)  # [] bool
        short = pair(False)
        if is_long is None:
            return short[0], short[1]
        cos, sin = (g.op("Where", [is_long, long, part], "rope_chosen")
                    for long, part in zip(pair(True), short, strict=True))
        return cos, sin

    full = caches(c, "")
    local = full
    if c.rope_local_base_freq is not None and any(c.sliding_layers):
        local = caches(local_rope(c), "_local")
    return [local if sliding else full for sliding in c.sliding_layers]


def _qkv(g: _Graph, h: str, prefix: str) -> list[str]:
    """GroupQueryAttention's query, key and value inputs from ``h`` [b, s, hidden] for layer
    ``prefix``: q, k and v packed in one MatMul ([b, s, (H + 2 KV) d], the weights' Concat
    folded at load), plus the packed biases where ``attention_bias``; or with ``qk_norm`` q
    and k each (biased where declared) normalized per head (RMSNorm over head_dim) before the
    kernel rotates them, v apart."""
    c, attn = g.config, f"{prefix}.self_attn"
    if not c.qk_norm:
        qkv_weight = g.op("Concat", [g.transposed(f"{attn}.{p}_proj.weight") for p in "qkv"],
                          "qkv_wt", axis=1)  # [hidden, (H + 2 KV) d], folded at load
        qkv = g.op("MatMul", [h, qkv_weight], "qkv")
        if c.attention_bias:  # [(H + 2 KV) d], folded at load
            bias = g.op("Concat", [f"{attn}.{p}_proj.bias" for p in "qkv"], "qkv_b", axis=0)
            qkv = g.op("Add", [qkv, bias], "qkv_biased")
        return [qkv, "", ""]
    normed = []
    for part, num_heads in (("q", c.num_attention_heads), ("k", c.num_key_value_heads)):
        x = g.op("Reshape", [g.projection(h, prefix, part),
                             g.const("heads", [0, 0, num_heads, c.head_dim], "int64")])
        x = g.norm(x, f"{attn}.{part}_norm.weight")  # [b, s, heads, d]
        normed.append(g.op("Reshape", [x, g.const("merge", [0, 0, -1], "int64")], part))
    return [*normed, g.projection(h, prefix, "v")]


def _window_and_cap(c: LlamaConfig, layer: int) -> dict[str, float | int]:
    """GroupQueryAttention's ``local_window_size`` (a sliding layer's query ``q`` sees keys
    ``q - sliding_window < j <= q``, as Hugging Face's sliding mask; -1: all of them) and,
    where the scores are capped, ``softcap`` (``cap * tanh(scores / cap)``, after the
    scale)."""
    attrs: dict[str, float | int] = {"local_window_size": c.sliding_window
                                     if c.sliding_layers[layer] else -1}
    if c.attn_logit_softcapping is not None:
        attrs["softcap"] = float(c.attn_logit_softcapping)
    return attrs
