"""An EAGLE head as speculant's chained step, and the target pass that feeds it.

EAGLE drafts with one decoder layer that attends to a cache of its own: the entry of
position ``i`` is the layer's key and value for the pair ``(x[i+1], f[i])`` (the next token,
and the target's feature at ``i``: EAGLE-1 its final hidden state, EAGLE-3 ``fc`` of the
residual streams entering the ``eagle_aux_hidden_state_layer_ids`` layers), rotated at
position ``i``. Its first draft is the layer over ``(p, f[C-1])`` at position ``C - 1``, its
``j``-th over ``(d[j-1], h[j-1])`` at ``C - 2 + j``, ``h`` the layer's own last output, each
attending to the context's entries and to the earlier drafts' own (vLLM's EAGLE proposer).

The chained contract gives a drafter step ``concat(table[token], carry)``, the target's caches
through read-only aliases, and one position id (``C - 1``). So:

* **the target computes the head's cache** (:func:`extend_target`): three more cells of its
  own group, rolled back with it, written at the block's slots: ``eagle.feature`` [b, 1, T, H]
  (``f`` per position) and ``eagle.key``/``eagle.value`` [b, KV, T, d]; slot ``j`` holds the
  entry of the pair ``(x[j], f[j-1])`` at position ``j - 1`` (``f[j-1]`` from this pass, or
  from ``eagle.feature`` for the block's first row), so after rollback to ``C`` slots
  ``[1, C)`` are exactly EAGLE's context cache (slot 0 has no feature and is never read);
* **the carry holds what EAGLE keeps between drafts** [H + 1 + 2 * K * KV * d]:
  ``h`` (the seed: ``f``), the step count ``n`` (0 in the seed) and a window of the key and
  value of drafts ``1 .. K`` (``K = max_proposal_width``). The target's ``eagle_seed`` output
  is ``f`` padded with zeros. Step ``n`` runs the layer at position ``C - 2 + n`` over
  context slots ``[1, C)``, window slots ``< n - 1`` and itself, writes its key and value to
  window slot ``n - 1`` and hands on its output; the chain's bootstrap step (``n = 0``) hands
  on ``f`` itself, so step 1 is EAGLE's first draft exactly.

Both graphs run every head computation in the ``_Graph`` blocks of ``speculant_tools.export``
(float32 norms, RoPE and softmax), with the head's sizes and RoPE base.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from speculant_tools.export.config import EMBEDDING, LlamaConfig
from speculant_tools.export.graphs import CAPACITY, LENGTHS, _Graph, rope_tables
from speculant_tools.importers.speculators.checkpoint import EagleHead

FEATURE, KEY, VALUE = "eagle.feature", "eagle.key", "eagle.value"  # the target's new cells
SEED = "eagle_seed"  # the target output seeding the carry: [b, s, W_C]
CARRY = "projected_state"  # the drafter's carry output


@dataclasses.dataclass(frozen=True)
class Widths:
    """The head's widths in the chained contract."""

    hidden: int  # H: the feature and the embedding
    kv: int  # KV heads * head_dim: one key (or value) row
    window: int  # K: drafts whose keys and values the carry holds

    @property
    def carry(self) -> int:
        """W_C = H + 1 (the step count) + 2 * K * KV * d (the window)."""
        return self.hidden + 1 + 2 * self.window * self.kv


def widths(head: EagleHead, window: int) -> Widths:
    c = head.layer
    return Widths(c.hidden_size, c.num_key_value_heads * c.head_dim, window)


def head_config(head: EagleHead, target: LlamaConfig) -> LlamaConfig:
    """The head layer's sizes, with the target's context (the RoPE table's length)."""
    return dataclasses.replace(head.layer, max_position_embeddings=target.max_position_embeddings)


class _Head(_Graph):
    """``_Graph`` with the head's sizes; its fresh value names start with ``eagle.`` (free
    in a target graph it extends)."""

    def __init__(self, name: str, config: LlamaConfig, head: EagleHead, dtype: str,
                 cache: str) -> None:
        super().__init__(name, config, dtype, cache=cache)
        self.head = head

    def _fresh(self, hint: str) -> str:
        return super()._fresh(f"eagle.{hint}")

    def rope_rows(self, positions: str) -> tuple[str, str]:
        """cos, sin gathered at ``positions`` (any shape, int64) from the head's tables,
        with a leading heads axis: [b, 1, s, d] for [b, s], [1, s, d] for [s]."""
        cos_table, sin_table = rope_tables(self.config)
        cos = self.op("Gather", [self.weight("eagle.rope.cos", cos_table), positions])
        sin = self.op("Gather", [self.weight("eagle.rope.sin", sin_table), positions])
        return self.unsqueeze(cos, [-3], "cos"), self.unsqueeze(sin, [-3], "sin")

    def layer_input(self, embedding: str, hidden: str) -> tuple[str, str]:
        """(the layer's attention input, its residual) for ``embedding`` and ``hidden``
        [b, s, H]: EAGLE-3 ``concat(input_layernorm(e), hidden_norm(h))`` with residual ``h``
        (its norm with ``norm_before_residual``); EAGLE-1 ``u = fusion_fc(concat(e', h))``
        (``e'`` the embedding norm's where ``layernorms``), residual ``u``."""
        head, p = self.head, self.head.prefix
        if head.algorithm == "eagle3":
            normed = self.rms_norm(hidden, f"{p}.hidden_norm.weight")
            fused = self.op("Concat", [self.rms_norm(embedding, f"{p}.input_layernorm.weight"),
                                       normed], "cat", axis=-1)
            return fused, normed if head.flags["norm_before_residual"] else hidden
        if head.flags["layernorms"]:
            embedding = self.rms_norm(embedding, "embedding_layernorm.weight")
        fused = self.linear(self.op("Concat", [embedding, hidden], "cat", axis=-1),
                            "fusion_fc.weight")
        if head.flags["fusion_bias"]:
            fused = self.op("Add", [fused, "fusion_fc.bias"], "biased")
        normed = self.rms_norm(fused, f"{p}.input_layernorm.weight") \
            if head.flags["layernorms"] else fused
        return normed, fused

    def key_value(self, layer_in: str, rope: tuple[str, str]) -> tuple[str, str]:
        """The layer's key (rotated) and value [b, KV, s, d] in the package dtype."""
        c, p = self.config, self.head.prefix
        key = self.heads(self.linear(layer_in, f"{p}.self_attn.k_proj.weight"),
                         c.num_key_value_heads)
        key = self.from_float32(self.rotate(self.to_float32(key, self.dtype), rope), self.dtype)
        value = self.heads(self.linear(layer_in, f"{p}.self_attn.v_proj.weight"),
                           c.num_key_value_heads)
        return key, value

    def cell_dims(self, symbol: str, width: int, heads: int = 1) -> tuple:
        return ("batch", heads, symbol, width)


def _arrays(head: EagleHead, dtype: np.dtype, names: list[str]) -> dict[str, np.ndarray]:
    return {name: np.ascontiguousarray(head.weights[name], dtype) for name in names}


def extend_target(model: onnx.ModelProto, taps: dict[str, Any], head: EagleHead,
                  target: LlamaConfig, dtype: str, cache: str, window: int) -> None:
    """Add the head's cells and the carry's seed to the target graph ``model`` (built by
    ``target_graph`` with ``taps``): inputs ``past_eagle.{feature,key,value}``, outputs
    ``present_eagle.{feature,key,value}`` and ``eagle_seed``."""
    config, w = head_config(head, target), widths(head, window)
    g = _Head("target", config, head, dtype, cache)
    past = CAPACITY if g.is_static else "past_sequence"
    total = CAPACITY if g.is_static else "total_sequence"
    numpy_dtype = np.dtype(np.float16 if dtype == "float16" else np.float32)
    names = [n for n in head.weights if n.startswith(("fc.", "fc_norm.", "input_norm.",
                                                      "fusion_fc.", "embedding_layernorm."))
             or n in (f"{head.prefix}.{part}.weight" for part in (
                 "hidden_norm", "input_layernorm", "self_attn.k_proj", "self_attn.v_proj"))]
    for name, array in _arrays(head, numpy_dtype, names).items():
        g.weight(name, array)
    layer_inputs, query_pos = taps["layer_inputs"], taps["query_pos"]
    feature = _feature(g, head, layer_inputs)  # [b, s, H]
    inputs = {part: g.add_input(f"past_eagle.{part}", dtype, dims) for part, dims in (
        ("feature", g.cell_dims(past, w.hidden)),
        ("key", g.cell_dims(past, config.head_dim, config.num_key_value_heads)),
        ("value", g.cell_dims(past, config.head_dim, config.num_key_value_heads)))}

    def write(part: str, block: str) -> str:  # the block at the pass's slots
        if g.is_static:
            return g.scatter_block(inputs[part], block, query_pos)
        return g.op("Concat", [inputs[part], block], f"present_{part}", axis=2)

    features = write("feature", g.unsqueeze(feature, [1]))  # [b, 1, T, H]
    zero = g.op("Mul", [g.slice_last(features, 0, 1, 2, "first"), g.const("zero", 0, dtype)])
    padded = g.op("Concat", [zero, features], "padded", axis=2)  # row j + 1 holds f[j]
    previous = g.squeeze(g.op("Gather", [padded, query_pos], "prev", axis=2), [1])  # f[q - 1]
    pair_pos = g.op("Max", [g.op("Sub", [query_pos, g.const("one", 1, "int64")]),
                            g.const("zero_i", 0, "int64")], "pair_pos")  # [s]
    layer_in, _ = g.layer_input(layer_inputs[0], previous)
    key, value = g.key_value(layer_in, g.rope_rows(pair_pos))
    presents = {"feature": features, "key": write("key", key), "value": write("value", value)}
    for part, value_name in presents.items():
        dims = g.cell_dims(total, w.hidden) if part == "feature" else \
            g.cell_dims(total, config.head_dim, config.num_key_value_heads)
        if g.is_static:
            g.own_output(f"present_eagle.{part}", value_name, dims)
        else:
            g.add_output(f"present_eagle.{part}", value_name, dtype, dims)
    pads = g.const("seed_pads", [0, 0, 0, 0, 0, w.carry - w.hidden], "int64")
    g.add_output(SEED, g.op("Pad", [feature, pads], "seed"), dtype,
                 ("batch", "sequence", w.carry))
    graph = model.graph
    graph.input.extend(g.inputs)
    graph.node.extend(g.nodes)
    graph.initializer.extend(g.initializers)
    graph.output.extend(g.outputs)


def _feature(g: _Head, head: EagleHead, layer_inputs: list[str]) -> str:
    """``f`` [b, s, H]: EAGLE-1 the target's final hidden state (its ``hidden_states``
    output); EAGLE-3 ``fc`` of the residual streams entering the aux layers (normed first
    with ``norm_before_fc``, each with ``fc_norm``)."""
    if head.algorithm == "eagle":
        return "hidden_states"
    ids = head.aux_layer_ids or aux_layer_ids(len(layer_inputs))
    streams = [layer_inputs[i] for i in ids]
    if head.flags["fc_norm"]:
        streams = [g.rms_norm(s, f"fc_norm.{i}.weight") for i, s in enumerate(streams)]
    fused = g.op("Concat", streams, "aux", axis=-1)
    if head.flags["norm_before_fc"]:
        fused = g.rms_norm(fused, "input_norm.weight")
    return g.linear(fused, "fc.weight")


def aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """speculators' and vLLM's default: ``[2, N // 2, N - 3]``."""
    return (2, num_layers // 2, num_layers - 3)


def drafter_graph(head: EagleHead, target: LlamaConfig, embedding: np.ndarray, dtype: str,
                  cache: str, window: int) -> onnx.ModelProto:
    """The chained step of the head (see the module): inputs ``inputs_embeds``
    [b, 1, H + W_C], ``position_ids`` [b, 1] (``C - 1``), ``attention_mask`` [b, K] (static:
    ``cache_lengths`` [b]), the borrowed ``eagle.key``/``eagle.value``; outputs ``logits``
    [b, 1, V_q] and the carry ``projected_state`` [b, 1, W_C]. One row per run (the chain's
    steps)."""
    config, w = head_config(head, target), widths(head, window)
    c, p = config, head.prefix
    g = _Head("assistant", config, head, dtype, cache)
    numpy_dtype = np.dtype(np.float16 if dtype == "float16" else np.float32)
    skip = {"d2t", "t2d", "embed_tokens.weight", "verifier_lm_head.weight",
            "verifier_norm.weight", "lm_head.weight" if head.algorithm == "eagle" else ""}
    skip.update(n for n in head.weights if n.startswith(("fc.", "fc_norm.", "input_norm.")))
    for name, array in _arrays(head, numpy_dtype, [n for n in head.weights
                                                   if n not in skip]).items():
        g.weight(name, array)
    if head.algorithm == "eagle":  # the verifier's LM head: its tied table
        g.weight(EMBEDDING, np.ascontiguousarray(embedding, numpy_dtype))
    borrowed = CAPACITY if g.is_static else "kv_sequence"
    fused = g.add_input("inputs_embeds", dtype, ("batch", "sequence", w.hidden + w.carry))
    position_ids = g.add_input("position_ids", "int64", ("batch", "sequence"))
    if g.is_static:
        lengths = g.add_input(LENGTHS, "int64", ("batch",))
    else:
        mask = g.add_input("attention_mask", "int64", ("batch", "kv_sequence"))
    keys = g.add_input(KEY, dtype, g.cell_dims(borrowed, c.head_dim, c.num_key_value_heads))
    values = g.add_input(VALUE, dtype, g.cell_dims(borrowed, c.head_dim, c.num_key_value_heads))

    h, span = w.hidden, w.window * w.kv
    embedding_row = g.slice_last(fused, 0, h, 2, "embedding")
    carried = g.slice_last(fused, 2 * h, 2 * h + 1, 2, "count")  # n [b, 1, 1]
    hidden = g.slice_last(fused, h, 2 * h, 2, "hidden")
    count = g.op("Cast", [carried], "n", to=TensorProto.INT64)
    step = g.op("Sub", [count, g.const("one", 1, "int64")], "step")  # n - 1: the window slot
    offset = g.squeeze(g.op("Max", [step, g.const("zero_i", 0, "int64")]), [2])
    rope = g.rope_rows(g.op("Add", [position_ids, offset], "position"))  # C - 2 + n

    def window_of(start: int) -> str:  # [b, KV, K, d] from the carry's [b, 1, K * KV * d]
        rows = g.op("Reshape", [g.slice_last(fused, start, start + span, 2, "window"),
                                g.const("rows", [-1, w.window, c.num_key_value_heads,
                                                 c.head_dim], "int64")])
        return g.op("Transpose", [rows], "bksd", perm=[0, 2, 1, 3])

    window_keys, window_values = window_of(2 * h + 1), window_of(2 * h + 1 + span)
    layer_in, residual = g.layer_input(embedding_row, hidden)
    key, value = g.key_value(layer_in, rope)
    slots = g.const("local", np.arange(w.window + 1), "int64")  # window slots, then the step
    local = g.op("Or", [g.op("Less", [slots, step]),
                        g.op("Equal", [slots, g.const("self", w.window, "int64")])])
    context = g.op("GreaterOrEqual", [g.slots(keys, 2, "slots"), g.const("one", 1, "int64")])
    if g.is_static:  # slots [1, cache_lengths)
        context = g.op("And", [context, g.op("Less", [g.slots(keys, 2, "slots"),
                                                      g.unsqueeze(lengths, [1])])])
    else:  # slots [1, K) whose mask entry is 1
        context = g.op("And", [context, g.op("Cast", [mask], "visible", to=TensorProto.BOOL)])
    allowed = g.unsqueeze(g.op("Concat", [context, g.squeeze(local, [1])], "allowed",
                               axis=-1), [1, 2, 3])  # [b, 1, 1, 1, K + K_w + 1]
    all_keys = g.op("Concat", [keys, window_keys, key], "keys", axis=2)
    all_values = g.op("Concat", [values, window_values, value], "values", axis=2)
    x = g.op("Add", [residual, g.attention(layer_in, p, rope, all_keys, all_values, allowed)],
             "resid")
    x = g.op("Add", [x, g.mlp(g.rms_norm(x, f"{p}.post_attention_layernorm.weight"), p)],
             "resid")
    if head.algorithm == "eagle3":
        normed = g.rms_norm(x, "norm.weight")
        logits = g.linear(normed, "lm_head.weight")
        out = normed if head.flags["norm_output"] else x
    else:
        normed = g.rms_norm(x, "pre_lm_head_layernorm.weight") if head.flags["layernorms"] \
            else x
        logits, out = g.lm_head(normed), x
    out = g.op("Where", [g.op("Equal", [count, g.const("zero_i", 0, "int64")]), hidden, out],
               "handed_on")  # the bootstrap step hands on f itself

    def written(window_value: str, new: str) -> str:  # slot n - 1 := this step's, flattened
        at = g.op("Equal", [g.const("slot", np.arange(w.window).reshape(1, 1, -1, 1),
                                    "int64"),
                            g.op("Reshape", [step, g.const("b111", [-1, 1, 1, 1], "int64")])])
        kept = g.op("Where", [at, new, window_value], "kept")
        rows = g.op("Transpose", [kept], "bksd", perm=[0, 2, 1, 3])
        return g.op("Reshape", [rows, g.const("flat", [0, 1, span], "int64")], "flat")

    count_out = g.op("Add", [carried, g.const("one_f", 1, dtype)], "next_n")
    carry = g.op("Concat", [out, count_out, written(window_keys, key),
                            written(window_values, value)], "carry", axis=-1)
    vocab = head.draft_vocab_size or target.vocab_size if head.algorithm == "eagle3" \
        else target.vocab_size
    g.own_output("logits", logits, ("batch", "sequence", vocab))
    g.own_output(CARRY, carry, ("batch", "sequence", w.carry))
    return g.finish("drafter")
