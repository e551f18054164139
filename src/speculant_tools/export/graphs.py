"""The Llama target and the chained drafter as ONNX graphs, built node by node.

Weights are initializers under their Hugging Face names (``config`` lists them), stored as raw
bytes in the package dtype; IO is in the package dtype too. RMSNorm, RoPE, the attention
scores, the softmax and the attention-weighted sum run in float32 (Cast in, Cast out), so
float16 graphs stay stable. Linear layers multiply by the transpose of the HF weight
``[out, in]``; ONNX Runtime folds that transpose once when it creates the session.

Attention uses the GQA layout ``[batch, kv_heads, groups, sequence, head_dim]`` for queries
(query head ``h`` reads KV head ``h // groups``, as HF's ``repeat_kv``) against keys
``[batch, kv_heads, 1, kv, head_dim]``, so shared KV heads are never copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from speculant_tools.export.config import (
    EMBEDDING,
    LM_HEAD,
    SEED_FUSION,
    VARIATIONS,
    LlamaConfig,
)
from speculant_tools.export.rope import rope_tables
from speculant_tools.export.variations import Variations
from speculant_tools.onnx_build import ELEMENT_TYPES, NUMPY_TYPES, GraphBuilder

CONFIG_KEY = "speculant.export.llama_config"  # metadata_props entry: LlamaConfig JSON
ROLE_KEY = "speculant.export.role"  # metadata_props entry: target | drafter
PRODUCER = "speculant_tools.export"
MASKED = float(np.finfo(np.float32).min)  # score of a key a query may not see

MS_DOMAIN = "com.microsoft"
# Operators only ONNX Runtime defines in the default domain (the ONNX checker rejects them)
ORT_OPERATORS = frozenset({"SimplifiedLayerNormalization"})
# Operators that need opset 24 (Attention with nonpad_kv_seqlen; RotaryEmbedding is 23)
ONNX_24_OPERATORS = frozenset({"Attention", "RotaryEmbedding"})

CACHES = ("appended", "static")
LENGTHS = "cache_lengths"  # static form: [b] int64, the valid length of the caches read
CAPACITY = "capacity"  # static form: the symbol of the buffers' sequence axis

FUSED_SEED = "fused_hidden_states"  # the target's fused carry seed [b, s, hidden]
BORROWED_KEY = "shared_kv.key"
BORROWED_VALUE = "shared_kv.value"
# Initializer bytes above which a graph is written with external data (protobuf refuses
# messages over 2 GiB) and checked by path after writing instead of in memory.
INLINE_LIMIT = 1 << 30


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's inline initializers (raw data, as this module writes them)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def uses_ort_operators(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has an operator only ONNX Runtime defines (a contrib operator)."""
    return any(node.domain == MS_DOMAIN or node.op_type in ORT_OPERATORS
               for node in model.graph.node)


class _Graph(GraphBuilder, Variations):
    """GraphBuilder plus raw-bytes weights and the decoder-layer blocks (the architecture
    variations' in :class:`~speculant_tools.export.variations.Variations`). With
    ``fused_norms`` the RMSNorms (and the residual add before one) are ONNX Runtime's fused
    kernels."""

    def __init__(self, name: str, config: LlamaConfig, dtype: str, *,
                 fused_norms: bool = False, cache: str = "appended") -> None:
        super().__init__(name)
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, not {cache!r}")
        self.config, self.dtype, self.fused_norms = config, dtype, fused_norms
        self.is_static = cache == "static"
        self._arange: str | None = None  # static form: the `speculant.slots` initializer

    def own_output(self, name: str, value: str, dims: tuple) -> None:
        """Expose ``value`` as the graph output ``name`` (package dtype) by renaming it
        wherever it appears: produced by its node directly, without an Identity, so ONNX
        Runtime writes it into the buffer bound to that output."""
        for node in self.nodes:
            node.input[:] = [name if v == value else v for v in node.input]
            node.output[:] = [name if v == value else v for v in node.output]
        self.outputs.append(onnx.helper.make_tensor_value_info(name, ELEMENT_TYPES[self.dtype],
                                                               dims))

    def node(self, op_type: str, inputs: list[str], num_outputs: int, hint: str,
             domain: str = "", keep: tuple[int, ...] | None = None, **attrs) -> list[str]:
        """A node with several outputs; those not in ``keep`` are left unnamed (unused)."""
        outputs = [self._fresh(f"{hint}_o{j}") if keep is None or j in keep else ""
                   for j in range(num_outputs)]
        self.nodes.append(onnx.helper.make_node(op_type, inputs, outputs,
                                                name=self._fresh(hint), domain=domain, **attrs))
        return outputs

    def norm(self, x: str, weight: str) -> str:
        """RMSNorm(x) * weight: ``SimplifiedLayerNormalization`` (float32 statistics) when
        the norms are fused, else :meth:`rms_norm` node by node."""
        if not self.fused_norms:
            return self.rms_norm(x, weight)
        return self.node("SimplifiedLayerNormalization", [x, self.norm_scale(weight)], 1, "norm",
                         epsilon=self.config.rms_norm_eps, axis=-1, stash_type=1)[0]

    def add_norm(self, x: str, delta: str, weight: str) -> tuple[str, str]:
        """(RMSNorm(x + delta) * weight, x + delta): one
        ``com.microsoft.SkipSimplifiedLayerNormalization`` when the norms are fused (its
        output 0 is the normed value, output 3 the sum)."""
        if not self.fused_norms:
            total = self.op("Add", [x, delta], "resid")
            return self.rms_norm(total, weight), total
        out = self.node("SkipSimplifiedLayerNormalization", [x, delta, self.norm_scale(weight)],
                        4, "skipnorm",
                        MS_DOMAIN, keep=(0, 3), epsilon=self.config.rms_norm_eps)
        return out[0], out[3]

    def transposed(self, weight: str) -> str:
        """``weight.T`` (folded once when ONNX Runtime creates the session)."""
        return self.op("Transpose", [weight], "wt", perm=[1, 0])

    def linear(self, x: str, weight: str) -> str:
        """``x @ weight.T`` for an HF weight ``[out, in]``."""
        return self.op("MatMul", [x, self.transposed(weight)], weight.rsplit(".", 1)[0])

    def projection(self, h: str, prefix: str, part: str) -> str:
        """``self_attn.{part}_proj`` of layer ``prefix`` applied to ``h`` (``part``: q, k, v
        or o), plus its bias where the configuration declares one (``attention_bias`` for
        q, k and v, ``attention_output_bias`` for o)."""
        name = f"{prefix}.self_attn.{part}_proj"
        out = self.linear(h, f"{name}.weight")
        c = self.config
        has_bias = c.attention_output_bias if part == "o" else c.attention_bias
        return self.op("Add", [out, f"{name}.bias"], f"{part}_bias") if has_bias else out

    def rms_norm(self, x: str, weight: str) -> str:
        """HF LlamaRMSNorm: normalize in float32, cast back, then scale by the weight."""
        x32 = self.to_float32(x, self.dtype)
        mean_square = self.op("ReduceMean", [self.op("Mul", [x32, x32])], "ms", axes=[-1],
                              keepdims=1)
        eps = self.const("eps", self.config.rms_norm_eps)
        inv_rms = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [mean_square, eps])])])
        normed = self.from_float32(self.op("Mul", [x32, inv_rms], "normed"), self.dtype)
        return self.op("Mul", [self.norm_scale(weight), normed], weight.rsplit(".", 1)[0])

    def rotate(self, x32: str, rope: tuple[str, str]) -> str:
        """``x * cos + rotate_half(x) * sin`` on ``[b, heads, s, head_dim]`` float32: on the
        first ``rotated_dim`` values, the rest passed as they are."""
        d, r = self.config.head_dim, self.config.rotated_dim
        turned = x32 if r == d else self.slice_last(x32, 0, r, -1, "x_rot")
        first = self.slice_last(turned, 0, r // 2, -1, "x1")
        second = self.slice_last(turned, r // 2, r, -1, "x2")
        rotated = self.op("Concat", [self.op("Neg", [second]), first], "rot", axis=-1)
        roped = self.op("Add", [self.op("Mul", [turned, rope[0]]),
                                self.op("Mul", [rotated, rope[1]])], "roped")
        return roped if r == d else self.op(
            "Concat", [roped, self.slice_last(x32, r, d, -1, "x_pass")], "roped_all", axis=-1)

    def heads(self, x: str, num_heads: int) -> str:
        """``[b, s, heads * head_dim]`` -> ``[b, heads, s, head_dim]``."""
        split = self.op("Reshape", [x, self.const("dims", [0, 0, num_heads,
                                                           self.config.head_dim], "int64")])
        return self.op("Transpose", [split], "bhsd", perm=[0, 2, 1, 3])

    def attention(self, h: str, prefix: str, rope: tuple[str, str], keys: str, values: str,
                  allowed: str) -> str:
        """Self-attention output ``[b, s, hidden]`` (after o_proj) of queries from ``h``
        against ``keys``/``values`` ``[b, kv_heads, T, head_dim]`` (keys already rotated);
        ``allowed`` ``[b | 1, 1, 1, s | 1, T]`` bool."""
        c = self.config
        q = self.heads(self.projection(h, prefix, "q"), c.num_attention_heads)
        q = self.head_norm(q, f"{prefix}.self_attn.q_norm.weight")
        q = self.rotate(self.to_float32(q, self.dtype), rope)  # [b, H, s, d] float32
        q = self.op("Reshape", [q, self.const("gqa", [0, c.num_key_value_heads, c.num_groups,
                                                      -1, c.head_dim], "int64")], "q5")
        k = self.unsqueeze(self.to_float32(keys, self.dtype), [2], "k5")  # [b, KV, 1, T, d]
        v = self.unsqueeze(self.to_float32(values, self.dtype), [2], "v5")
        scores = self.op("MatMul", [q, self.op("Transpose", [k], "kt", perm=[0, 1, 2, 4, 3])])
        scores = self.op("Mul", [scores, self.const("scaling", c.attention_scale)], "scores")
        scores = self.soft_cap(scores, c.attn_logit_softcapping)
        scores = self.op("Where", [allowed, scores, self.const("masked", MASKED)], "masked")
        probs = self.op("Softmax", [scores], "probs", axis=-1)  # [b, KV, G, s, T]
        context = self.op("MatMul", [probs, v], "context")  # [b, KV, G, s, d]
        context = self.op("Transpose", [context], "bs5", perm=[0, 3, 1, 2, 4])
        context = self.op("Reshape", [context, self.const("merge", [0, 0, -1], "int64")])
        return self.projection(self.from_float32(context, self.dtype), prefix, "o")

    def fused_attention(self, h: str, prefix: str, position_ids: str, keys: str, values: str,
                        lengths: str) -> str:
        """:meth:`attention` against static ``keys``/``values`` ``[b, KV, capacity, d]`` of
        which each query sees the slots ``< lengths`` [b] int64, in two ONNX operators:
        ``RotaryEmbedding`` (opset 23, half rotation, the package dtype) on the queries and
        ``Attention`` (opset 24) with ``nonpad_kv_seqlen`` = ``lengths``: query head ``h``
        reads KV head ``h // groups``, scaled by ``1 / sqrt(d)``, no causal term (each node
        one kernel where the graph runs; the explicit form is ~25)."""
        c = self.config
        half = c.rotated_dim // 2
        if c.rope_scaling is not None and c.rope_scaling.long_after is not None:
            # each row's own table: cos, sin [b, s, rotated / 2] with no position_ids
            cos, sin = (self.from_float32(self.slice_last(part, 0, half, -1, "half"),
                                          self.dtype) for part in self.gathered_rope(position_ids))
            position_ids = ""
        else:
            cos_table, sin_table = rope_tables(c)  # [max_ctx, rotated], halves duplicated
            dtype = NUMPY_TYPES[self.dtype]
            cos = self.weight("speculant.rope.cos_half", cos_table[:, :half].astype(dtype))
            sin = self.weight("speculant.rope.sin_half", sin_table[:, :half].astype(dtype))
        q = self.linear(h, f"{prefix}.self_attn.q_proj.weight")  # [b, s, H * d]
        partial = {} if c.rotary_dim is None else {"rotary_embedding_dim": c.rotary_dim}
        q = self.op("RotaryEmbedding", [q, cos, sin, position_ids], "rope",
                    num_heads=c.num_attention_heads, **partial)
        context = self.op("Attention", [self.heads(q, c.num_attention_heads), keys, values,
                                        "", "", "", lengths], "attend", is_causal=0)
        context = self.op("Transpose", [context], "bshd", perm=[0, 2, 1, 3])
        context = self.op("Reshape", [context, self.const("merge", [0, 0, -1], "int64")])
        return self.linear(context, f"{prefix}.self_attn.o_proj.weight")  # [b, s, hidden]

    def mlp(self, h: str, prefix: str) -> str:
        gate = self.linear(h, f"{prefix}.mlp.gate_proj.weight")
        up = self.linear(h, f"{prefix}.mlp.up_proj.weight")
        if self.config.hidden_act == "gelu_pytorch_tanh":
            act = self.gelu_tanh(gate)
        else:
            act = self.op("Mul", [gate, self.op("Sigmoid", [gate])], "silu")
        return self.linear(self.op("Mul", [act, up]), f"{prefix}.mlp.down_proj.weight")

    def lm_head(self, h: str) -> str:
        """Tied LM head: ``h @ embed_tokens.T`` (the drafter's: the rows its graph carries);
        untied: ``h @ lm_head.T``; then the final soft cap, where the configuration has one."""
        if self.config.tie_word_embeddings:
            logits = self.op("MatMul", [h, self.op("Transpose", [EMBEDDING], "et",
                                                   perm=[1, 0])], "logits")
        else:
            logits = self.linear(h, LM_HEAD)
        return self.soft_cap(logits, self.config.final_logit_softcapping)

    def decoder_inputs(self, weights: Mapping[str, np.ndarray]
                       ) -> tuple[str, str, str, list[tuple[str, str]]]:
        """The target's inputs: ``input_ids`` [b, s], ``attention_mask`` [b, T] (static:
        ``cache_lengths`` [b] int64 instead), ``position_ids`` [b, s], each layer's past key
        and value [b, KV, P, d] (static: [b, KV, capacity, d]); and its weights as
        initializers."""
        c, dtype = self.config, self.dtype
        input_ids = self.add_input("input_ids", "int64", ("batch", "sequence"))
        if self.is_static:
            mask = self.add_input(LENGTHS, "int64", ("batch",))
        else:
            mask = self.add_input("attention_mask", "int64", ("batch", "total_sequence"))
        position_ids = self.add_input("position_ids", "int64", ("batch", "sequence"))
        past = CAPACITY if self.is_static else "past_sequence"
        pasts = [(self.add_input(f"past_key_values.{i}.key", dtype, _cache_dims(c, past)),
                  self.add_input(f"past_key_values.{i}.value", dtype, _cache_dims(c, past)))
                 for i in range(c.num_hidden_layers)]
        for weight_name, array in weights.items():
            self.weight(weight_name, array)
        return input_ids, mask, position_ids, pasts

    def decoder_outputs(self, hidden: str, presents: list[tuple[str, str]]) -> None:
        """``logits`` (tied head), ``hidden_states`` (after the final norm), and each layer's
        present key and value [b, KV, T, d] (static: the buffers [b, KV, capacity, d], each
        the output of the node that writes it)."""
        c, dtype = self.config, self.dtype
        self.add_output("logits", self.lm_head(hidden), dtype,
                        ("batch", "sequence", c.vocab_size))
        self.add_output("hidden_states", hidden, dtype, ("batch", "sequence", c.hidden_size))
        total = CAPACITY if self.is_static else "total_sequence"
        for i, cells in enumerate(presents):
            for part, value in zip(("key", "value"), cells, strict=True):
                name = f"present.{i}.{part}"
                if self.is_static:
                    self.own_output(name, value, _cache_dims(c, total))
                else:
                    self.add_output(name, value, dtype, _cache_dims(c, total))

    def seed_output(self, streams: list[str]) -> None:
        """With ``seed_feature_layers`` (else nothing): the output ``fused_hidden_states``
        [b, s, hidden] = ``norm(fc(concat(stream_norms[j](streams[i_j]))))`` over the layers
        ``i_j`` it names; ``streams[i]`` is the residual stream entering layer ``i``,
        ``streams[num_hidden_layers]`` the last layer's output (before the final norm). The
        norms are the target's RMSNorms (``norm_weight_offset`` included)."""
        layers = self.config.seed_feature_layers
        if layers is None:
            return
        normed = [self.norm(streams[i], f"{SEED_FUSION}stream_norms.{j}.weight")
                  for j, i in enumerate(layers)]
        fused = self.linear(self.op("Concat", normed, "seed_streams", axis=-1),
                            f"{SEED_FUSION}fc.weight")  # [b, s, hidden]
        self.add_output(FUSED_SEED, self.norm(fused, f"{SEED_FUSION}norm.weight"), self.dtype,
                        ("batch", "sequence", self.config.hidden_size))

    def slots(self, value: str, axis: int, hint: str) -> str:
        """``[0, extent)`` int64 for the extent of ``value`` on ``axis``: a window of one
        ``arange`` initializer sliced by the shape, so it is computed on the device that runs
        the graph (no host scalar feeds a device node: nothing breaks a CUDA graph)."""
        if self._arange is None:
            self._arange = self.weight("speculant.slots", np.arange(
                self.config.max_position_embeddings, dtype=np.int64))
        extent = self.op("Shape", [value], f"{hint}_extent", start=axis, end=axis + 1)
        return self.op("Slice", [self._arange, self.const("zero", [0], "int64"), extent], hint)

    def static_positions(self, lengths: str, input_ids: str, buffer: str) -> tuple[str, str]:
        """Static form: the block's positions ``P + [0, s)`` [s] and the key slots
        ``[0, capacity)`` [capacity], int64, from ``cache_lengths`` [b] (one sequence)."""
        query_pos = self.op("Add", [lengths, self.slots(input_ids, 1, "block")], "query_pos")
        return query_pos, self.slots(buffer, 2, "key_pos")

    def scatter_block(self, buffer: str, block: str, query_pos: str) -> str:
        """Static form: ``buffer`` [b, KV, capacity, d] with ``block`` [b, KV, s, d] written
        at slots ``query_pos`` [s] of axis 2 (``ScatterElements``, in place when the output
        is bound to the input's buffer)."""
        slots = self.op("Reshape", [query_pos, self.const("slots", [1, 1, -1, 1], "int64")])
        indices = self.op("Expand", [slots, self.op("Shape", [block], "block_shape")], "at")
        return self.op("ScatterElements", [buffer, indices, block], "written", axis=2)

    def finish(self, role: str) -> onnx.ModelProto:
        inline = (not self.has_weights_apart  # checked by path once written
                  and sum(len(t.raw_data) for t in self.initializers) <= INLINE_LIMIT)
        model = self.model(check=False)
        if any(node.op_type in ONNX_24_OPERATORS and not node.domain for node in self.nodes):
            model.opset_import[0].version = 24  # Attention's nonpad_kv_seqlen
            model.ir_version = 11
        if any(node.domain == MS_DOMAIN for node in self.nodes):
            model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
        if inline and not uses_ort_operators(model):  # a larger one: checked by path once
            onnx.checker.check_model(model, full_check=True)  # written; ORT's ops: by ORT
        model.producer_name = PRODUCER
        onnx.helper.set_model_props(model, {CONFIG_KEY: self.config.to_json(), ROLE_KEY: role})
        return model


def _cache_dims(config: LlamaConfig, symbol: str) -> tuple:
    return ("batch", config.num_key_value_heads, symbol, config.head_dim)


def target_graph(config: LlamaConfig, weights: Mapping[str, np.ndarray], dtype: str,
                 name: str = "target", *, cache: str = "appended",
                 taps: dict[str, Any] | None = None) -> onnx.ModelProto:
    """The Llama decoder with explicit past/present KV (``weights`` from
    :func:`~speculant_tools.export.config.checked_weights`, already in ``dtype``).

    Query ``q`` of the pass (absolute position ``past + q``) sees keys ``<= past + q`` whose
    attention-mask entry is 1 (static: every key slot ``<= P + q``, ``P`` = ``cache_lengths``).
    ``hidden_states`` is the output of the final norm; with ``config.seed_feature_layers``
    ``fused_hidden_states`` follows (:meth:`_Graph.seed_output`). ``taps`` (for a graph
    extended after: importers/speculators) receives the value names ``layer_inputs`` (the
    residual stream entering each layer, [b, s, hidden]; 0: the embeddings) and
    ``query_pos`` ([s] int64).
    """
    c = config
    g = _Graph(name, c, dtype, cache=cache)
    input_ids, mask, position_ids, pasts = g.decoder_inputs(weights)

    if g.is_static:  # allowed[q, j] = j <= P + q over the capacity's slots
        query_pos, key_pos = g.static_positions(mask, input_ids, pasts[0][0])
        allowed = g.op("LessOrEqual", [g.unsqueeze(key_pos, [0]), g.unsqueeze(query_pos, [1])],
                       "allowed")  # [s, capacity]
    else:  # causal mask and padding mask: allowed[b, 1, 1, q, j] = j <= P + q and mask[b, j]
        num_new = g.dim(input_ids, 1, "num_new")
        past_len = g.dim(pasts[0][0], 2, "past_len")
        total_len = g.op("Add", [past_len, num_new], "total_len")
        one = g.const("one", 1, "int64")
        query_pos = g.op("Range", [past_len, total_len, one], "query_pos")  # [s]
        key_pos = g.op("Range", [g.const("zero", 0, "int64"), total_len, one], "key_pos")
        causal = g.op("LessOrEqual", [g.unsqueeze(key_pos, [0]), g.unsqueeze(query_pos, [1])],
                      "causal")  # [s, T]
        visible = g.unsqueeze(g.op("Cast", [mask], "visible", to=TensorProto.BOOL), [1, 2, 3])
        allowed = g.op("And", [causal, visible], "allowed")  # [b, 1, 1, s, T]
    ropes = g.layer_ropes(position_ids)
    masks = g.layer_masks(allowed, query_pos, key_pos)

    x = g.embed(input_ids)  # [b, s, hidden]
    presents, layer_inputs = [], []
    for i, (past_key, past_value) in enumerate(pasts):
        prefix = f"model.layers.{i}"
        layer_inputs.append(x)
        h = g.rms_norm(x, f"{prefix}.input_layernorm.weight")
        k = g.heads(g.projection(h, prefix, "k"), c.num_key_value_heads)
        k = g.head_norm(k, f"{prefix}.self_attn.k_norm.weight")
        k = g.from_float32(g.rotate(g.to_float32(k, dtype), ropes[i]), dtype)
        v = g.heads(g.projection(h, prefix, "v"), c.num_key_value_heads)
        if g.is_static:  # [b, KV, capacity, d], the block at [P, P + s)
            key, value = (g.scatter_block(past, new, query_pos)
                          for past, new in ((past_key, k), (past_value, v)))
        else:
            key = g.op("Concat", [past_key, k], f"present_{i}_key", axis=2)  # [b, KV, T, d]
            value = g.op("Concat", [past_value, v], f"present_{i}_value", axis=2)
        presents.append((key, value))
        x = g.layer_tail(x, g.attention(h, prefix, ropes[i], key, value, masks[i]), prefix)
    hidden = g.rms_norm(x, "model.norm.weight")  # [b, s, hidden]
    if taps is not None:
        taps.update(layer_inputs=layer_inputs, query_pos=query_pos)

    g.decoder_outputs(hidden, presents)
    g.seed_output([*layer_inputs, x])
    return g.finish("target")


def drafter_graph(config: LlamaConfig, weights: Mapping[str, np.ndarray],
                  embedding: np.ndarray, dtype: str, name: str = "assistant", *,
                  fused_norms: bool = False, cache: str = "appended",
                  fused_attention: bool | None = None) -> onnx.ModelProto:
    """The cacheless chained drafter: ``x = in_proj(inputs_embeds)``, one decoder layer whose
    attention reads the borrowed last-layer KV of the target (every key whose mask entry is
    1; no causal term), ``drafter.norm`` -> ``projected_state``; logits through the tied
    table, carried in this graph under the target's name ``model.embed_tokens.weight``: its
    first ``config.draft_vocab_size`` rows (all of them unless a subset vocabulary), so the
    logits are ``draft_vocab_size`` wide.
    ``fused_norms``: its three norms and two residual adds as ONNX Runtime's fused kernels
    (with the fused target: the same function in three nodes instead of ~29).
    ``cache="static"``: the borrowed caches are the target's buffers [b, KV, capacity, d]
    (bound as they are, no copy) and ``cache_lengths`` [b] int64 replaces the mask: every
    query sees the slots ``< cache_lengths``. ``fused_attention`` (None: with the fused norms
    on static caches, the only form it takes): the attention as ONNX's RotaryEmbedding and
    Attention (:meth:`_Graph.fused_attention`). Its outputs are the nodes' own (no Identity:
    a step writes straight into the buffers bound to them)."""
    c = replace(config, **VARIATIONS)  # the drafter is a Llama layer whatever the target
    g = _Graph(name, c, dtype, fused_norms=fused_norms, cache=cache)
    if fused_attention is None:
        fused_attention = fused_norms and g.is_static
    if fused_attention and not g.is_static:
        raise ValueError("fused_attention needs the static cache form (cache_lengths)")
    fused = g.add_input("inputs_embeds", dtype, ("batch", "sequence", 2 * c.hidden_size))
    position_ids = g.add_input("position_ids", "int64", ("batch", "sequence"))  # [b, s]
    borrowed = CAPACITY if g.is_static else "kv_sequence"
    if g.is_static:
        lengths = g.add_input(LENGTHS, "int64", ("batch",))  # [b]
    else:
        mask = g.add_input("attention_mask", "int64", ("batch", "kv_sequence"))  # [b, K]
    key = g.add_input(BORROWED_KEY, dtype, _cache_dims(c, borrowed))  # [b, KV, K, d]
    value = g.add_input(BORROWED_VALUE, dtype, _cache_dims(c, borrowed))
    g.weight(EMBEDDING, embedding[:c.draft_vocab_size])  # [N, hidden]: the LM head's rows
    for weight_name, array in weights.items():
        g.weight(weight_name, array)

    x = g.linear(fused, "drafter.in_proj.weight")  # [b, s, hidden]
    prefix = "drafter.layer"
    h = g.norm(x, f"{prefix}.input_layernorm.weight")
    if fused_attention:
        attended = g.fused_attention(h, prefix, position_ids, key, value, lengths)
    else:
        if g.is_static:  # allowed[b, 1, 1, 1, j] = j < cache_lengths[b]
            slots = g.slots(key, 2, "slots")  # [capacity]
            allowed = g.unsqueeze(g.op("Less", [g.unsqueeze(slots, [0]),
                                                g.unsqueeze(lengths, [1])], "valid"),
                                  [1, 2, 3])
        else:
            allowed = g.unsqueeze(g.op("Cast", [mask], "visible", to=TensorProto.BOOL),
                                  [1, 2, 3])
        attended = g.attention(h, prefix, g.rope_at(position_ids), key, value, allowed)
    h, x = g.add_norm(x, attended, f"{prefix}.post_attention_layernorm.weight")
    state, _ = g.add_norm(x, g.mlp(h, prefix), "drafter.norm.weight")  # [b, s, hidden]

    g.own_output("logits", g.lm_head(state), ("batch", "sequence", c.draft_vocab_size))
    g.own_output("projected_state", state, ("batch", "sequence", c.hidden_size))
    return g.finish("drafter")
