"""Tiny speculators checkpoints with random weights, written as the format stores them
(``config.json`` + ``model.safetensors``, without the speculators package), and EAGLE's
drafting in plain numpy (float64), written from vLLM's EAGLE proposer, not from the graphs:
the oracle the imported drafter is compared with.

    folder = write_eagle3(tmp, TARGET_CONFIG, draft_vocab=24)
    drafts = eagle_drafts(read_speculators(folder), TARGET_CONFIG, target_weights, stream, k)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from export.export_reference import attend, mlp, rms_norm, rope, split_heads
from speculant_tools.export import LlamaConfig, target_shapes
from speculant_tools.importers.speculators import EagleHead

TARGET_CONFIG = LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=40,
                            max_position_embeddings=64, head_dim=16, rms_norm_eps=1e-5)
# The head's own layer: other heads, head_dim and RoPE base than the target's
LAYER = {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
         "intermediate_size": 24, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
         "rope_theta": 5000.0, "hidden_act": "silu", "attention_bias": False,
         "mlp_bias": False, "tie_word_embeddings": False}
AUX_LAYERS = [1, 2, 3]


def random_arrays(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Norm weights near 1, linear weights ~ N(0, 4 / in), the table ~ N(0, 4)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            arrays[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            arrays[name] = 2.0 * rng.standard_normal(shape)
        else:
            arrays[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
    return {name: array.astype(np.float32) for name, array in arrays.items()}


TARGET_WEIGHTS = random_arrays(target_shapes(TARGET_CONFIG), seed=123)


def _layer_shapes(prefix: str, width: int) -> dict[str, tuple[int, ...]]:
    h, q, kv, f = 16, 2 * 8, 1 * 8, 24
    return {f"{prefix}.self_attn.q_proj.weight": (q, width),
            f"{prefix}.self_attn.k_proj.weight": (kv, width),
            f"{prefix}.self_attn.v_proj.weight": (kv, width),
            f"{prefix}.self_attn.o_proj.weight": (h, q),
            f"{prefix}.post_attention_layernorm.weight": (h,),
            f"{prefix}.mlp.gate_proj.weight": (f, h), f"{prefix}.mlp.up_proj.weight": (f, h),
            f"{prefix}.mlp.down_proj.weight": (h, f)}


def write_checkpoint(folder: Path, algorithm: str, weights: dict[str, np.ndarray],
                     layer: dict | None = None, **fields) -> Path:
    """``config.json`` as speculators writes it, and ``model.safetensors``."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Eagle3Speculator" if algorithm == "eagle3" else "EagleSpeculator"],
        "speculators_model_type": algorithm, "speculators_version": "0.9.0",
        "speculators_config": {
            "algorithm": algorithm, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}},
        "transformer_layer_config": layer or LAYER, "torch_dtype": "float32", **fields}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def eagle3_weights(draft_vocab: int | None, seed: int = 7, norm_before_fc: bool = False,
                   fc_norm: bool = False) -> dict[str, np.ndarray]:
    """A one-layer EAGLE-3 head over the 16-wide target; a draft vocabulary of the given size
    (random ascending target ids, d2t and t2d) or the whole one (None)."""
    vocab = draft_vocab or 50
    shapes = {"fc.weight": (16, 48), "layers.0.hidden_norm.weight": (16,),
              "layers.0.input_layernorm.weight": (16,), "norm.weight": (16,),
              "lm_head.weight": (vocab, 16), **_layer_shapes("layers.0", 32)}
    if norm_before_fc:
        shapes["input_norm.weight"] = (48,)
    if fc_norm:
        shapes.update({f"fc_norm.{i}.weight": (16,) for i in range(3)})
    weights = random_arrays(shapes, seed)
    weights["embed_tokens.weight"] = TARGET_WEIGHTS["model.embed_tokens.weight"]
    if draft_vocab is not None:
        ids = np.sort(np.random.default_rng(seed).choice(50, draft_vocab, replace=False))
        weights["d2t"] = (ids - np.arange(draft_vocab)).astype(np.int64)
        t2d = np.zeros(50, np.bool_)
        t2d[ids] = True
        weights["t2d"] = t2d
    return weights


def eagle1_weights(seed: int = 11, layernorms: bool = False,
                   fusion_bias: bool = False) -> dict[str, np.ndarray]:
    shapes = {"fusion_fc.weight": (16, 32), **_layer_shapes("transformer", 16)}
    if fusion_bias:
        shapes["fusion_fc.bias"] = (16,)
    if layernorms:
        shapes.update({name: (16,) for name in (
            "embedding_layernorm.weight", "pre_lm_head_layernorm.weight",
            "transformer.input_layernorm.weight")})
    return random_arrays(shapes, seed)


def echo_weights() -> dict[str, np.ndarray]:
    """An EAGLE-1 head whose drafts repeat their token: ``fusion_fc`` passes the embedding
    through and the layer adds nothing (o_proj and down_proj zero), so the tied table scores
    the token itself highest. The tiny target repeats tokens greedily, so most are accepted."""
    weights = eagle1_weights()
    weights["fusion_fc.weight"] = np.eye(16, 32, dtype=np.float32)
    for name in ("transformer.self_attn.o_proj.weight", "transformer.mlp.down_proj.weight"):
        weights[name] = np.zeros_like(weights[name])
    return weights


def write_eagle3(folder: Path, draft_vocab: int | None = 24, **fields) -> Path:
    extra = {"draft_vocab_size": draft_vocab or 50, "eagle_aux_hidden_state_layer_ids":
             AUX_LAYERS, "norm_before_residual": False, "target_hidden_size": None, **fields}
    weights = eagle3_weights(draft_vocab, norm_before_fc=extra.get("norm_before_fc", False),
                             fc_norm=extra.get("fc_norm", False))
    return write_checkpoint(folder, "eagle3", weights, **extra)


def write_eagle1(folder: Path, **flags) -> Path:
    return write_checkpoint(folder, "eagle", eagle1_weights(**flags), **flags)


# -- the reference -------------------------------------------------------------------------
def _w(weights, name: str) -> np.ndarray:
    return np.asarray(weights[name], np.float64)


def target_streams(config: LlamaConfig, weights, ids) -> tuple[list[np.ndarray], np.ndarray]:
    """The residual stream entering each layer [T, H] and the final hidden state [T, H] of
    ``ids`` from empty caches."""
    c, eps = config, config.rms_norm_eps
    positions = np.arange(len(ids))
    visible = positions[None, :] <= positions[:, None]
    x = _w(weights, "model.embed_tokens.weight")[np.asarray(ids)]
    streams = []
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        streams.append(x)
        h = rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
        q = rope(split_heads(h @ _w(weights, f"{p}.self_attn.q_proj.weight").T,
                             c.num_attention_heads), positions, c)
        k = rope(split_heads(h @ _w(weights, f"{p}.self_attn.k_proj.weight").T,
                             c.num_key_value_heads), positions, c)
        v = split_heads(h @ _w(weights, f"{p}.self_attn.v_proj.weight").T,
                        c.num_key_value_heads)
        x = x + attend(q, k, v, visible, c) @ _w(weights, f"{p}.self_attn.o_proj.weight").T
        x = x + mlp(rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), eps),
                    weights, p)
    return streams, rms_norm(x, _w(weights, "model.norm.weight"), eps)


def features(head: EagleHead, config: LlamaConfig, weights, ids) -> np.ndarray:
    """EAGLE's target feature per position [T, H]."""
    streams, hidden = target_streams(config, weights, ids)
    if head.algorithm == "eagle":
        return hidden
    eps = head.layer.rms_norm_eps
    aux = [streams[i] for i in (head.aux_layer_ids or (2, config.num_hidden_layers // 2,
                                                        config.num_hidden_layers - 3))]
    if head.flags["fc_norm"]:
        aux = [rms_norm(a, _w(head.weights, f"fc_norm.{i}.weight"), eps)
               for i, a in enumerate(aux)]
    fused = np.concatenate(aux, axis=-1)
    if head.flags["norm_before_fc"]:
        fused = rms_norm(fused, _w(head.weights, "input_norm.weight"), eps)
    return fused @ _w(head.weights, "fc.weight").T


def layer_input(head: EagleHead, embedding: np.ndarray,
                hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the layer's attention input, its residual) for one pair."""
    w, p, eps = head.weights, head.prefix, head.layer.rms_norm_eps
    if head.algorithm == "eagle3":
        normed = rms_norm(hidden, _w(w, f"{p}.hidden_norm.weight"), eps)
        cat = np.concatenate([rms_norm(embedding, _w(w, f"{p}.input_layernorm.weight"), eps),
                              normed], axis=-1)
        return cat, normed if head.flags["norm_before_residual"] else hidden
    if head.flags["layernorms"]:
        embedding = rms_norm(embedding, _w(w, "embedding_layernorm.weight"), eps)
    fused = np.concatenate([embedding, hidden], axis=-1) @ _w(w, "fusion_fc.weight").T
    if head.flags["fusion_bias"]:
        fused = fused + _w(w, "fusion_fc.bias")
    if head.flags["layernorms"]:
        return rms_norm(fused, _w(w, f"{p}.input_layernorm.weight"), eps), fused
    return fused, fused


def eagle_drafts(head: EagleHead, config: LlamaConfig, weights, stream, k: int) -> list[int]:
    """EAGLE's ``k`` greedy drafts after ``stream`` (its last token the pending one, ``p``):
    the context entries are the layer's keys and values of the pairs ``(x[i+1], f[i])`` at
    position ``i < C - 1``; draft 1 is the layer over ``(p, f[C-1])`` at ``C - 1``, draft
    ``j`` over ``(d[j-1], h[j-1])`` at ``C - 2 + j``, each attending to the context, the
    earlier drafts and itself."""
    c, w, p, eps = head.layer, head.weights, head.prefix, head.layer.rms_norm_eps
    table = _w(weights, "model.embed_tokens.weight")
    consumed = len(stream) - 1
    f = features(head, config, weights, stream[:consumed])

    def project(h_in: np.ndarray, positions: np.ndarray):  # q, key, value [heads, s, d]
        def split(x: np.ndarray, heads: int) -> np.ndarray:
            return x.reshape(len(x), heads, c.head_dim).transpose(1, 0, 2)

        weight = {part: _w(w, f"{p}.self_attn.{part}_proj.weight").T for part in "qkv"}
        return (rope(split(h_in @ weight["q"], c.num_attention_heads), positions, c),
                rope(split(h_in @ weight["k"], c.num_key_value_heads), positions, c),
                split(h_in @ weight["v"], c.num_key_value_heads))

    successors = np.asarray(stream[1:consumed], np.int64)  # x[i + 1] of each context pair
    context_in, _ = layer_input(head, table[successors], f[:consumed - 1])
    _, keys, values = project(context_in, np.arange(consumed - 1))  # [KV, C - 1, d]
    ids = head.draft_to_target()
    token, hidden, position, drafts = stream[consumed], f[consumed - 1], consumed - 1, []
    for _ in range(k):
        h_in, residual = layer_input(head, table[token][None], hidden[None])
        q, key, value = project(h_in, np.array([position]))
        keys, values = np.concatenate([keys, key], 1), np.concatenate([values, value], 1)
        visible = np.ones((1, keys.shape[1]), bool)
        x = residual + attend(q, keys, values, visible, c) @ \
            _w(w, f"{p}.self_attn.o_proj.weight").T
        x = x + mlp(rms_norm(x, _w(w, f"{p}.post_attention_layernorm.weight"), eps), w, p)
        if head.algorithm == "eagle3":
            normed = rms_norm(x, _w(w, "norm.weight"), eps)
            choice = int(np.argmax(normed @ _w(w, "lm_head.weight").T))
            token = int(ids[choice]) if ids is not None else choice
            hidden = (normed if head.flags["norm_output"] else x)[0]
        else:
            normed = rms_norm(x, _w(w, "pre_lm_head_layernorm.weight"), eps) \
                if head.flags["layernorms"] else x
            token, hidden = int(np.argmax(normed @ table.T)), x[0]
        drafts.append(token)
        position += 1
    return drafts
