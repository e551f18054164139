from __future__ import annotations

import pytest

from speculant.errors import MetadataError, RequestError
from speculant.text import NoTokenizer, Tokenizer, load_tokenizer

SAMPLE_TEXTS = [
    "héllo wörld, café naïve résumé",  # seen in training
    "日本語のテキストです。",
    "emoji 😀🎉👍🏽 party",
    "naïveté 🧪 東京",  # characters the merges never saw: single-byte tokens
    "",
    "  spaces  ",
    "z" * 50,
]


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_byte_level_round_trip(bpe: Tokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


def test_word_level_round_trip(word_level: Tokenizer) -> None:
    ids = word_level.encode("the cat sat on café 日本 😀")
    assert word_level.decode(ids) == "the cat sat on café 日本 😀"
    assert word_level.encode("the dog") == [2, 0]  # unknown word -> <unk>


def test_vocab_size_and_eos_come_through(bpe: Tokenizer, word_level: Tokenizer) -> None:
    assert bpe.vocab_size == 320
    assert bpe.eos_token_ids == (bpe.backend.token_to_id("</s>"),)
    assert word_level.vocab_size == 10
    assert word_level.eos_token_ids == (1,)


def test_decode_skips_special_tokens_unless_asked(word_level: Tokenizer) -> None:
    ids = [2, 3, 1]
    assert word_level.decode(ids) == "the cat"
    assert word_level.decode(ids, skip_special_tokens=False) == "the cat </s>"


def test_decode_refuses_negative_ids(bpe: Tokenizer) -> None:
    with pytest.raises(RequestError, match="token ids must be >= 0"):
        bpe.decode([5, -1])


def test_encode_refuses_non_text(bpe: Tokenizer) -> None:
    with pytest.raises(RequestError, match="encode takes a string"):
        bpe.encode([1, 2])  # type: ignore[arg-type]


def test_from_file_round_trips_through_disk(bpe: Tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    bpe.backend.save(str(path))
    loaded = Tokenizer.from_file(path, eos_token_ids=[0])
    assert loaded.encode("café 😀") == bpe.encode("café 😀")
    assert loaded.eos_token_ids == (0,)
    assert str(path) in repr(loaded)


def test_unreadable_file_is_a_metadata_error_naming_it(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(MetadataError) as caught:
        Tokenizer.from_file(path)
    assert caught.value.problems[0].file == str(path)


def test_package_without_tokenizer_refuses_text_apis_only(tmp_path) -> None:
    tokenizer = load_tokenizer(None, eos_token_ids=[1], package=str(tmp_path))
    assert isinstance(tokenizer, NoTokenizer)
    assert not tokenizer.has_text
    assert tokenizer.eos_token_ids == (1,)  # stop rules on ids still work
    with pytest.raises(RequestError, match="needs a tokenizer") as caught:
        tokenizer.encode("hello")
    assert str(tmp_path) in str(caught.value)
    assert "pass token ids instead of text" in str(caught.value)
    with pytest.raises(RequestError, match="needs a tokenizer"):
        tokenizer.decode([1, 2])


def test_load_tokenizer_with_a_path(bpe: Tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    bpe.backend.save(str(path))
    tokenizer = load_tokenizer(path, eos_token_ids=[0])
    assert isinstance(tokenizer, Tokenizer) and tokenizer.has_text
