"""A tiny random Llama target with a ChatML template, written as a speculant package in code.

One token per character (letters, digits, a few marks, space, newline) plus the specials
``<|endoftext|>`` (also the unknown token), ``<|im_start|>`` and ``<|im_end|>`` (the EOS and the
end of a turn). The weights are random (fixed seed, scaled so greedy streams vary); the
package is what ``speculant import`` writes (float32, static caches), with the chat template
in ``tokenizer_config.json``.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models

from speculant_tools.export import LlamaConfig, target_shapes
from speculant_tools.importers import Checkpoint, write_checkpoint
from speculant_tools.importers.checkpoint import tokenizer_config

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2
CHARACTERS = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + " \n.,:?!'-")
TOKENS = SPECIALS + CHARACTERS
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
CONFIG = LlamaConfig(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                     max_position_embeddings=512, head_dim=8, rms_norm_eps=1e-5,
                     rope_theta=10000.0)


def tokenizer_json() -> str:
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[],
                                     unk_token=SPECIALS[0]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    return tokenizer.to_str()


def random_weights(seed: int = 11) -> dict[str, np.ndarray]:
    """Norms near 1 (the final one with random signs), linear weights ~ N(0, 4 / in), the
    table ~ N(0, 4): varied greedy streams with clear margins."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in target_shapes(CONFIG).items():
        if len(shape) == 1:
            weights[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            if name == "model.norm.weight":
                weights[name] *= rng.choice([-1.0, 1.0], shape)
        elif name == "model.embed_tokens.weight":
            weights[name] = 2.0 * rng.standard_normal(shape)
        else:
            weights[name] = 2.0 * rng.standard_normal(shape) / np.sqrt(shape[1])
    return {name: array.astype(np.float32) for name, array in weights.items()}


def checkpoint(chat_template: str | None = CHAT_TEMPLATE) -> Checkpoint:
    return Checkpoint(config=CONFIG, weights=random_weights(), tokenizer_json=tokenizer_json(),
                      tokenizer_config=tokenizer_config(chat_template, SPECIALS[1],
                                                        SPECIALS[2]),
                      eos_id=EOS_ID, source="tiny")


def write_tiny_package(folder: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """The tiny target as a greedy decoder package in ``folder``."""
    return write_checkpoint(checkpoint(chat_template), folder, dtype="float32",
                            cache="static")
