from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speculant.errors import RequestError
from speculant.text import IncrementalDetokenizer, NoTokenizer, Tokenizer

REPLACEMENT_CHAR = "\ufffd"
MULTI_BYTE_TEXTS = [
    "héllo wörld, café naïve résumé",
    "日本語のテキストです。中文字符也可以",
    "emoji 😀🎉👍🏽 party 🚀 time",
    "Ça coûte 5 € — très cher 🧪 東京",
]


def stream(tokenizer, ids: Sequence[int], **kwargs) -> tuple[list[str], str]:
    """Push ``ids`` one by one; return the pieces and what flush() returned."""
    detokenizer = IncrementalDetokenizer(tokenizer, **kwargs)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    return pieces, detokenizer.flush()


def test_pieces_concatenate_to_the_text_and_never_break_a_character(bpe: Tokenizer) -> None:
    for text in MULTI_BYTE_TEXTS:
        ids = bpe.encode(text)
        pieces, tail = stream(bpe, ids)
        assert "".join(pieces) + tail == bpe.decode(ids) == text
        assert tail == ""  # valid text completes every character before the end
        for piece in pieces:
            assert REPLACEMENT_CHAR not in piece
            piece.encode("utf-8")  # strict: no lone surrogate


def test_an_emoji_split_across_tokens_is_held_until_complete(bpe: Tokenizer) -> None:
    ids = bpe.encode("🧪")  # unseen: the shared emoji lead bytes, then single bytes
    assert len(ids) >= 2
    detokenizer = IncrementalDetokenizer(bpe)
    assert [detokenizer.push(token_id) for token_id in ids[:-1]] == [""] * (len(ids) - 1)
    assert detokenizer.num_held_ids == len(ids) - 1
    assert detokenizer.push(ids[-1]) == "🧪"
    assert detokenizer.num_held_ids == 0
    assert detokenizer.flush() == ""


def test_something_is_held_back_for_multi_byte_text(bpe: Tokenizer) -> None:
    # The CJK text has merges that span a character boundary ("¥æ"), so some pushes
    # must return "" while the next character is open.
    pieces, _ = stream(bpe, bpe.encode(MULTI_BYTE_TEXTS[1]))
    assert "" in pieces


def test_an_unfinished_character_comes_out_at_flush_as_decode_renders_it(bpe: Tokenizer) -> None:
    lead_byte = bpe.encode("🧪")[0]
    ids = bpe.encode("ok ") + [lead_byte]
    pieces, tail = stream(bpe, ids)
    assert "".join(pieces) == "ok "
    assert tail == REPLACEMENT_CHAR == bpe.decode([lead_byte])


def test_a_broken_character_in_the_middle_is_emitted_once_text_follows(bpe: Tokenizer) -> None:
    lead_byte = bpe.encode("🧪")[0]
    ids = [lead_byte] + bpe.encode("abc")
    pieces, tail = stream(bpe, ids)
    assert pieces[0] == ""
    assert "".join(pieces) + tail == bpe.decode(ids) == REPLACEMENT_CHAR + "abc"


def test_word_level_pieces_carry_their_separating_space(word_level: Tokenizer) -> None:
    ids = word_level.encode("the cat sat on café 日本 😀")
    pieces, tail = stream(word_level, ids)
    assert pieces == ["the", " cat", " sat", " on", " café", " 日本", " 😀"]
    assert tail == ""


def test_special_tokens_are_skipped_like_decode_skips_them(word_level: Tokenizer) -> None:
    eos = word_level.eos_token_ids[0]
    ids = [2, 3, eos, 4]
    pieces, tail = stream(word_level, ids)
    assert "".join(pieces) + tail == word_level.decode(ids) == "the cat sat"
    pieces, tail = stream(word_level, ids, skip_special_tokens=False)
    assert "".join(pieces) + tail == word_level.decode(ids, skip_special_tokens=False)


def test_context_ids_give_left_context_but_are_not_emitted(word_level: Tokenizer) -> None:
    prompt = word_level.encode("the cat")
    pieces, tail = stream(word_level, word_level.encode("sat on"), context_ids=prompt)
    assert pieces == [" sat", " on"]  # the first word keeps its space after the prompt


def test_push_many_returns_the_text_of_a_block(bpe: Tokenizer) -> None:
    ids = bpe.encode("café 😀 日本")
    detokenizer = IncrementalDetokenizer(bpe)
    text = detokenizer.push_many(ids[:5]) + detokenizer.push_many(ids[5:])
    assert text + detokenizer.flush() == "café 😀 日本"


def test_a_package_without_tokenizer_is_refused_before_streaming() -> None:
    with pytest.raises(RequestError, match="needs a tokenizer"):
        IncrementalDetokenizer(NoTokenizer())


class RecordingDecoder:
    """Records how many ids each decode call sees."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    def decode(self, token_ids, *, skip_special_tokens: bool = True) -> str:
        self.lengths.append(len(token_ids))
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def test_work_per_token_is_bounded_by_the_window_not_the_stream(bpe: Tokenizer) -> None:
    recorder = RecordingDecoder(bpe)
    ids = bpe.encode(" ".join(MULTI_BYTE_TEXTS) * 20)
    assert len(ids) > 1000
    pieces, tail = stream(recorder, ids)
    assert "".join(pieces) + tail == bpe.decode(ids)
    assert max(recorder.lengths) <= 16  # a run of merges spanning characters, at most


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=319), max_size=40),
       skip_special_tokens=st.booleans())
def test_any_id_sequence_streams_to_exactly_its_decode(
    bpe: Tokenizer, ids: list[int], skip_special_tokens: bool
) -> None:
    # Random ids are mostly invalid UTF-8: stray continuation bytes, unfinished characters.
    pieces, tail = stream(bpe, ids, skip_special_tokens=skip_special_tokens)
    assert "".join(pieces) + tail == bpe.decode(ids, skip_special_tokens=skip_special_tokens)
    for piece in pieces:
        assert not piece.endswith(REPLACEMENT_CHAR)  # a held char is never cut in two
        piece.encode("utf-8")


@settings(max_examples=100, deadline=None)
@given(prompt=st.sampled_from(MULTI_BYTE_TEXTS),
       ids=st.lists(st.integers(min_value=0, max_value=319), max_size=20))
def test_with_context_pieces_are_the_decode_past_the_context(
    bpe: Tokenizer, prompt: str, ids: list[int]
) -> None:
    context = bpe.encode(prompt)
    pieces, tail = stream(bpe, ids, context_ids=context)
    tail_ids = context[-5:]
    assert "".join(pieces) + tail == bpe.decode(tail_ids + ids)[len(bpe.decode(tail_ids)):]
