"""The fixtures' tokenizer: one token per character of :data:`definition.TOKENS`."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models

from builders import definition as fx


def build_tokenizer() -> Tokenizer:
    """A BPE model with no merges over the 32 tokens (ids = positions in ``TOKENS``):
    text splits into characters; unknown characters become ``<unk>`` (0); ``</s>`` (1) is
    the special EOS; decoding concatenates tokens."""
    vocab = {token: token_id for token_id, token in enumerate(fx.TOKENS)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=fx.TOKENS[fx.UNK_ID]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(fx.TOKENS[fx.UNK_ID], special=True),
                                  AddedToken(fx.TOKENS[fx.EOS_ID], special=True)])
    return tokenizer


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (what the written ``tokenizer.json`` gives)."""
    return build_tokenizer().encode(text).ids


def decode(ids: list[int]) -> str:
    return "".join(fx.TOKENS[i] for i in ids)
