"""Plain greedy decoding equals a reference loop written from the fixture's definition
(runtime.md §5–§7, §13; evidence.md E2), in float32 and float16, from `.onnx` and
`.onnx.textproto` artifacts, with every stop condition and its `stats.stop_reason`.

The reference below reads only `builders.definition` (the function the graphs embed);
it does not use the engine, the numpy mirror or `fixtures.trace`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from builders import definition as fx
from builders.tokenizer import decode, encode

DTYPES = ("float32", "float16")
FORMATS = ("onnx", "textproto")
SPEC = fx.FixtureSpec()

# Prompts chosen from the definition: "a" reaches EOS after 46 tokens, "a(a" after 32, ")\n"
# at once (")" then "\n" is an EOS state); the others run past 40 tokens without EOS.
EOS_PROMPTS = {"a": 46, "a(a": 32, ")\n": 1}
PROMPTS = ("def ", "hello world", "print(x) ", *EOS_PROMPTS)


def reference_greedy(prompt: Sequence[int], max_new_tokens: int, *,
                     spec: fx.FixtureSpec = SPEC, stop_ids: Iterable[int] = (fx.EOS_ID,),
                     stop_sequences: Iterable[Sequence[int]] = (),
                     max_context: int | None = None) -> tuple[list[int], str]:
    """Greedy decoding by the definition: the token after position ``i`` is
    ``next_token(code(x[i-1]) or 0 at i = 0, x[i], is_deviation(i))``; stops are checked after
    each token in the order of runtime.md §13. Returns (generated tokens, stop reason)."""
    cap = spec.max_context if max_context is None else min(spec.max_context, max_context)
    stop_ids, stop_sequences = set(stop_ids), [list(s) for s in stop_sequences]
    stream, generated = list(prompt), []
    while True:
        i = len(stream) - 1
        prev_code = fx.code(stream[i - 1]) if i > 0 else 0
        token = fx.next_token(prev_code, stream[i], spec.is_deviation(i))
        stream.append(token)
        generated.append(token)
        if len(generated) == max_new_tokens:
            return generated, "max_new_tokens"
        if token in stop_ids:
            return generated, "eos"
        if any(s and stream[-len(s):] == s for s in stop_sequences):
            return generated, "stop_string"
        if len(stream) >= cap:
            return generated, "context_full"


def test_reference_reaches_eos_where_the_prompts_say():
    """The prompt table above is right: the EOS cases really end in EOS."""
    for prompt, length in EOS_PROMPTS.items():
        tokens, reason = reference_greedy(encode(prompt), 60)
        assert (len(tokens), reason, tokens[-1]) == (length, "eos", fx.EOS_ID), prompt
    for prompt in set(PROMPTS) - set(EOS_PROMPTS):
        assert fx.EOS_ID not in reference_greedy(encode(prompt), 40)[0], prompt


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_reference(decoder_engine, dtype, fmt, prompt):
    engine = decoder_engine(dtype, fmt)
    ids = encode(prompt)
    expected, reason = reference_greedy(ids, 50)
    result = engine.generate(prompt, 50)
    assert result.token_ids == expected
    assert result.stats.stop_reason == reason
    assert result.stats.committed == len(expected)
    assert result.stats.target_passes == len(expected)  # prefill + one pass per later token
    assert result.text == decode([t for t in expected if t != fx.EOS_ID])
    assert engine.generate(ids, 50).token_ids == expected  # token ids in, same tokens out


@pytest.mark.parametrize("dtype", DTYPES)
def test_onnx_and_textproto_give_identical_tokens(decoder_engine, dtype):
    for prompt in PROMPTS:
        a = decoder_engine(dtype, "onnx").generate(prompt, 40, stop_on_eos=False)
        b = decoder_engine(dtype, "textproto").generate(prompt, 40, stop_on_eos=False)
        assert a.token_ids == b.token_ids, prompt


def test_float16_and_float32_give_identical_tokens(decoder_engine):
    for prompt in PROMPTS:
        a = decoder_engine("float32").generate(prompt, 40, stop_on_eos=False)
        b = decoder_engine("float16").generate(prompt, 40, stop_on_eos=False)
        assert a.token_ids == b.token_ids, prompt


@pytest.mark.parametrize("dtype", DTYPES)
def test_prompt_with_special_ids_decodes_by_the_definition(decoder_engine, dtype):
    """<unk> (0) and EOS (1) inside the prompt are ordinary inputs of the function."""
    prompt = [2, 0, 1, 5, 1]
    expected, reason = reference_greedy(prompt, 12)
    result = decoder_engine(dtype).generate(prompt, 12)
    assert (result.token_ids, result.stats.stop_reason) == (expected, reason)


# -- stop conditions (runtime.md §13) ----------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [1, 2, 7, 30])
def test_stop_max_new_tokens(decoder_engine, dtype, budget):
    result = decoder_engine(dtype).generate("def ", budget)
    assert result.token_ids == reference_greedy(encode("def "), budget)[0]
    assert len(result.token_ids) == budget
    assert result.stats.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stop_eos_is_included(decoder_engine, dtype):
    result = decoder_engine(dtype).generate("a", 60)
    assert len(result.token_ids) == EOS_PROMPTS["a"]
    assert result.token_ids[-1] == fx.EOS_ID
    assert fx.EOS_ID not in result.token_ids[:-1]
    assert result.stats.stop_reason == "eos"


def test_stop_eos_at_prefill(decoder_engine):
    result = decoder_engine().generate(")\n", 10)
    assert result.token_ids == [fx.EOS_ID]
    assert result.stats.stop_reason == "eos"
    assert result.stats.target_passes == 1


def test_budget_wins_over_eos_on_the_same_token(decoder_engine):
    """Stops are checked in commit order: budget first (runtime.md §13)."""
    result = decoder_engine().generate("a", EOS_PROMPTS["a"])
    assert result.token_ids[-1] == fx.EOS_ID
    assert result.stats.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stop_on_eos_off_decodes_past_eos(decoder_engine, dtype):
    expected, reason = reference_greedy(encode("a"), 60, stop_ids=())
    result = decoder_engine(dtype).generate("a", 60, stop_on_eos=False)
    assert expected[EOS_PROMPTS["a"] - 1] == fx.EOS_ID and len(expected) == 60
    assert result.token_ids == expected
    assert result.stats.stop_reason == reason == "max_new_tokens"


def test_stop_token_ids_are_extra_eos_ids(decoder_engine):
    """A request's stop ids join the EOS ids (runtime.md §13): included, reason "eos"."""
    full, _ = reference_greedy(encode("def "), 30)
    stop_id = full[5]
    assert stop_id not in full[:5]
    result = decoder_engine().generate("def ", 30, stop_token_ids=[stop_id])
    assert result.token_ids == full[:6]
    assert result.stats.stop_reason == "eos"


def test_stop_token_ids_work_with_eos_stopping_off(decoder_engine):
    """EOS stopping off: the stream runs through EOS; the request's stop ids still stop it."""
    full, _ = reference_greedy(encode("a"), 60, stop_ids=())
    unused = next(t for t in range(2, fx.VOCAB_SIZE) if t not in full)
    result = decoder_engine().generate("a", 60, stop_on_eos=False, stop_token_ids=[unused])
    assert result.token_ids == full and fx.EOS_ID in full
    assert result.stats.stop_reason == "max_new_tokens"
    stop_id = full[-3]
    result = decoder_engine().generate("a", 60, stop_on_eos=False, stop_token_ids=[stop_id])
    assert result.token_ids == full[:full.index(stop_id) + 1]
    assert result.stats.stop_reason == "eos"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stop_string_through_the_tokenizer(decoder_engine, dtype):
    full, _ = reference_greedy(encode("def "), 30)
    stop = decode(full[4:6])  # two characters generated at positions 4 and 5
    expected, reason = reference_greedy(encode("def "), 30, stop_sequences=[encode(stop)])
    assert reason == "stop_string"
    result = decoder_engine(dtype).generate("def ", 30, stop=[stop])
    assert result.token_ids == expected  # the token that completes the stop string is kept
    assert result.text == decode(expected)[:-len(stop)]  # the stop text is not
    assert result.stats.stop_reason == "stop_string" and result.finish_reason == "stop"


def test_first_of_several_stop_strings_ends_the_stream(decoder_engine):
    full, _ = reference_greedy(encode("def "), 30)
    late, early = decode(full[10:12]), decode(full[3:5])
    expected, _ = reference_greedy(encode("def "), 30,
                                   stop_sequences=[encode(late), encode(early)])
    result = decoder_engine().generate("def ", 30, stop=[late, early])
    assert result.token_ids == expected
    assert result.stats.stop_reason == "stop_string"
    assert result.text == decode(expected)[:-len(early)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_context", [5, 10, 33])
def test_stop_request_context_cap(decoder_engine, dtype, max_context):
    expected, reason = reference_greedy(encode("def "), 60, max_context=max_context)
    assert reason == "context_full"
    result = decoder_engine(dtype).generate("def ", 60, max_context=max_context)
    assert result.token_ids == expected
    assert len("def ") + len(result.token_ids) == max_context
    assert result.stats.stop_reason == "context_full"


def test_request_cap_above_the_package_cap_changes_nothing(decoder_engine):
    result = decoder_engine().generate("def ", 100, max_context=1000, stop_on_eos=False)
    assert len("def ") + len(result.token_ids) == fx.MAX_CONTEXT
    assert result.stats.stop_reason == "context_full"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stop_package_context_cap(decoder_engine, dtype):
    """A package whose max_sequence_length (and recurrence max) is 16."""
    spec = fx.make_spec(deviation_positions={3, 7, 8, 13}, max_context=16)
    engine = decoder_engine(dtype, spec=spec)
    expected, reason = reference_greedy(encode("def "), 60, spec=spec)
    assert reason == "context_full" and len(expected) == 12
    result = engine.generate("def ", 60)
    assert result.token_ids == expected
    assert result.stats.stop_reason == "context_full"
    smaller = engine.generate("def ", 60, max_context=9)  # the smallest cap wins
    assert smaller.token_ids == expected[:5]


def test_default_package_context_cap(decoder_engine):
    expected, reason = reference_greedy(encode("a"), 100, stop_ids=())
    assert reason == "context_full"
    result = decoder_engine().generate("a", 100, stop_on_eos=False)
    assert result.token_ids == expected
    assert 1 + len(result.token_ids) == fx.MAX_CONTEXT
    assert result.stats.stop_reason == "context_full"


def test_budget_wins_over_context_full_on_the_same_token(decoder_engine):
    result = decoder_engine().generate("def ", 6, max_context=10)
    assert len(result.token_ids) == 6
    assert result.stats.stop_reason == "max_new_tokens"


def test_eos_wins_over_context_full_on_the_same_token(decoder_engine):
    cap = 1 + EOS_PROMPTS["a"]  # the EOS is the token that fills the context
    expected, reason = reference_greedy(encode("a"), 100, max_context=cap)
    assert reason == "eos"
    result = decoder_engine().generate("a", 100, max_context=cap)
    assert result.token_ids == expected
    assert result.stats.stop_reason == "eos"


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("prompt, options", [
    ("def ", {"max_new_tokens": 13}),
    ("a", {"max_new_tokens": 60}),
    ("def ", {"max_new_tokens": 40, "stop": ["gn"]}),
    ("def ", {"max_new_tokens": 40, "max_context": 17}),
    ("a", {"max_new_tokens": 60, "stop_token_ids": [9]}),
], ids=["budget", "eos", "stop-string", "context", "stop-id"])
def test_speculative_stops_where_greedy_stops(chained_engine, prompt, options, k):
    """A stop inside a round discards the round's later tokens (runtime.md §13)."""
    options = dict(options)
    budget = options.pop("max_new_tokens")
    stop_ids = (fx.EOS_ID, *options.get("stop_token_ids", ()))
    expected, reason = reference_greedy(
        encode(prompt), budget, stop_ids=stop_ids, max_context=options.get("max_context"),
        stop_sequences=[encode(s) for s in options.get("stop", ())])
    result = chained_engine().generate(prompt, budget, speculative=True, k=k, **options)
    assert result.token_ids == expected
    assert result.stats.stop_reason == reason
