"""Load-time checks that were silently skipped (review §2 cases 19 and 38, D4): an EOS id the
target cannot emit, a tokenizer that cannot decode ids the package calls tokens, and text
that is not valid Unicode."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models

from builders import definition as fx
from speculant import load
from speculant.errors import MetadataError, RequestError


def small_tokenizer(num_tokens: int) -> Tokenizer:
    """The fixtures' tokenizer cut to its first ``num_tokens`` tokens."""
    vocab = {token: token_id for token_id, token in enumerate(fx.TOKENS[:num_tokens])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=fx.TOKENS[fx.UNK_ID]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(fx.TOKENS[fx.EOS_ID], special=True)])
    return tokenizer


def edit_metadata(root, old: str, new: str) -> None:
    path = root / "inference_metadata.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_an_eos_id_outside_the_logits_is_refused_at_load(decoder_copy):
    root = decoder_copy()
    edit_metadata(root, "eos: {id: 1,", "eos: {id: 99999,")
    with pytest.raises(MetadataError) as caught:
        load(root)
    assert caught.value.paths == ["package.tokenizer.special_tokens.eos.id"]
    assert "99999" in str(caught.value) and "[0, 32)" in str(caught.value)


def test_a_tokenizer_smaller_than_its_declared_vocabulary_is_refused(decoder_copy):
    root = decoder_copy()
    small_tokenizer(30).save(str(root / "tokenizer.json"))
    with pytest.raises(MetadataError) as caught:
        load(root)
    message = str(caught.value)
    assert "tokenizer.json" in message and "holds 30 ids" in message
    assert "package.tokenizer.vocab_size declares 32" in message


def test_a_padded_vocabulary_loads_and_its_padding_decodes_to_nothing(decoder_copy):
    """Logits wider than the declared vocabulary are padding rows: allowed (module rule V2)."""
    root = decoder_copy()
    small_tokenizer(30).save(str(root / "tokenizer.json"))
    edit_metadata(root, "    vocab_size: 32\n", "    vocab_size: 30\n")
    engine = load(root)
    assert engine.tokenizer.vocab_size == 30 and engine.vocab_size == 32
    assert engine.tokenizer.decode([30, 31]) == ""


def test_a_tokenizer_without_a_declaration_must_cover_the_logits(decoder_copy):
    root = decoder_copy()
    small_tokenizer(30).save(str(root / "tokenizer.json"))
    path = root / "inference_metadata.yaml"
    text = path.read_text()
    start, end = text.index("package:\n"), text.index("pipeline:\n")
    path.write_text(text[:start] + text[end:])
    with pytest.raises(MetadataError, match="the target's logits are 32"):
        load(root)


@pytest.mark.parametrize("text", ["a\ud800b", "def \udcff"])
def test_text_with_a_lone_surrogate_is_a_request_error(decoder_template, text):
    engine = load(decoder_template)
    with pytest.raises(RequestError, match="not valid Unicode"):
        engine.tokenizer.encode(text)
