"""The tiny random models of the export tests (fixed seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models

from speculant_tools.export import LlamaConfig, drafter_shapes, target_shapes

CONFIG = LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=40, max_position_embeddings=64,
                     head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0)
DRAFT_CONFIG = LlamaConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=24,
                           max_position_embeddings=64)
EOS_ID = 1
TOKENS = ["<unk>", "</s>"] + [chr(c) for c in range(ord("0"), ord("0") + 48)]


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Norm weights near 1 (the final norms with random signs, so a token does not simply
    predict itself through the tied table), linear weights ~ N(0, 4/in), the table
    ~ N(0, 4): varied greedy streams with clear top-2 margins."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            weights[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            if name in ("model.norm.weight", "drafter.norm.weight"):
                weights[name] *= rng.choice([-1.0, 1.0], shape)
        elif name == "model.embed_tokens.weight":
            weights[name] = 2.0 * rng.standard_normal(shape)
        else:
            weights[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
    return {name: array.astype(np.float32) for name, array in weights.items()}


# Seed 123: the smallest top-2 margin on the greedy paths of the tests' prompts is 0.62
# (searched over seeds 60-159 for head_dim 16, the smallest the fused float16 graph takes).
TARGET_WEIGHTS = random_weights(target_shapes(CONFIG), seed=123)
DRAFTER_WEIGHTS = random_weights(drafter_shapes(CONFIG), seed=2)
DRAFT_WEIGHTS = random_weights(target_shapes(DRAFT_CONFIG), seed=3)


def write_tokenizer(path: Path) -> Path:
    """One token per character of :data:`TOKENS`; ``</s>`` is the special EOS."""
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[],
                                     unk_token="<unk>"))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken("<unk>", special=True),
                                  AddedToken("</s>", special=True)])
    tokenizer.save(str(path))
    return path
