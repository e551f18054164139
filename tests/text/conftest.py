"""Small tokenizers built in code: a byte-level BPE trained on multi-byte text, and a
WordLevel one. No files, no downloads."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from speculant.text import Tokenizer

EOS = "</s>"

# Emoji (4 bytes, one with a skin-tone modifier), CJK (3 bytes), accented letters (2 bytes).
TRAINING_TEXTS = [
    "héllo wörld, café naïve résumé",
    "日本語のテキストです。中文字符也可以",
    "emoji 😀🎉👍🏽 party 🚀 time",
    "plain ascii text here, nothing fancy",
    "Ça coûte 5 € — très cher",
]


def build_byte_level_bpe(vocab_size: int = 320) -> Backend:
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOS],
        show_progress=False,
    )
    backend.train_from_iterator(TRAINING_TEXTS * 4, trainer)
    return backend


def build_word_level() -> Backend:
    words = ["<unk>", EOS, "the", "cat", "sat", "on", "mat", "café", "日本", "😀"]
    backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([EOS])
    return backend


@pytest.fixture(scope="session")
def bpe() -> Tokenizer:
    backend = build_byte_level_bpe()
    return Tokenizer(backend, eos_token_ids=[backend.token_to_id(EOS)])


@pytest.fixture(scope="session")
def word_level() -> Tokenizer:
    backend = build_word_level()
    return Tokenizer(backend, eos_token_ids=[backend.token_to_id(EOS)])
