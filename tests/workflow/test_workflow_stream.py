"""`Engine.stream`: the pieces concatenate to the text of `generate`'s tokens, and arrive as
tokens are committed (more than one piece)."""

from __future__ import annotations

import pytest

from builders import definition as fx

PROMPTS = ("def ", "hello world", "a", ")\n", "print(x) ")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_stream_concatenates_to_the_generated_text(decoder_engine, dtype, prompt):
    engine = decoder_engine(dtype)
    result = engine.generate(prompt, 50)
    stream = engine.stream(prompt, 50)
    pieces = list(stream)
    assert "".join(pieces) == engine.tokenizer.decode(result.token_ids) == result.text
    assert stream.result.stats.stop_reason == result.stats.stop_reason
    assert stream.result.token_ids == result.token_ids
    if len(result.token_ids) > 2:
        assert len(pieces) > 1
    assert all(pieces)  # no empty pieces


def test_stream_through_eos_with_eos_stopping_off(decoder_engine):
    engine = decoder_engine()
    result = engine.generate("a", 60, stop_on_eos=False)
    assert fx.EOS_ID in result.token_ids
    assert "".join(engine.stream("a", 60, stop_on_eos=False)) == result.text


def test_stream_with_stop_string_and_context_cap(decoder_engine):
    engine = decoder_engine()
    for options in ({"stop": ["gn"]}, {"max_context": 12}, {"stop_token_ids": [9]}):
        result = engine.generate("def ", 30, **options)
        assert "".join(engine.stream("def ", 30, **options)) == result.text, options


@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_stream_concatenates_to_the_generated_text(chained_engine, k):
    engine = chained_engine()
    result = engine.generate("def ", 40, speculative=True, k=k)
    stream = engine.stream("def ", 40, speculative=True, k=k)
    pieces = list(stream)
    assert "".join(pieces) == engine.tokenizer.decode(result.token_ids) == result.text
    assert stream.result.stats.trace == result.stats.trace
    greedy = engine.generate("def ", 40)
    assert result.token_ids == greedy.token_ids


def test_stream_is_lazy(decoder_engine, passes):
    """A piece is yielded after its token's pass, before the next pass runs."""
    stream = decoder_engine().stream("def ", 5)
    next(stream)
    assert len(passes) == 1
    next(stream)
    assert len(passes) == 2
    stream.close()


def test_a_stream_closed_early_leaves_the_engine_usable(decoder_engine):
    engine = decoder_engine()
    stream = engine.stream("def ", 20)
    head = next(stream) + next(stream)
    stream.close()
    result = engine.generate("def ", 20)
    assert result.text.startswith(head) and len(result.token_ids) == 20
