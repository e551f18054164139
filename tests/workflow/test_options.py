"""`GenerationOptions`: the one source of defaults, and every field checked by type and range
at admission with a RequestError naming the field (issue 15) — before any pass runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import speculant
from speculant import GenerationOptions, RequestError
from speculant.workflow.options import DEFAULTS, FIELD_NAMES, parse_width

BAD_FIELDS = [
    ("max_new_tokens", math.nan), ("max_new_tokens", 2.5), ("max_new_tokens", "8"),
    ("max_new_tokens", True), ("max_new_tokens", 0),
    ("temperature", math.inf), ("temperature", math.nan), ("temperature", -0.1),
    ("temperature", "hot"),
    ("top_k", 2.5), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan),
    ("min_p", -0.1), ("min_p", 2.0), ("seed", -1), ("seed", 1.0),
    ("k", 0), ("k", 2.5), ("k", "4"), ("proposer", 3), ("proposer", b"chained"),
    ("stop_on_eos", 1), ("stop_on_eos", "yes"), ("max_context", 0), ("max_context", 9.5),
    ("stop_token_ids", 3), ("stop_token_ids", "ab"),
]


@pytest.mark.parametrize(("name", "value"), BAD_FIELDS)
def test_a_bad_field_is_a_request_error_naming_it(decoder_engine, passes, name, value):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate("def ", GenerationOptions.of(**{name: value}))
    assert caught.value.paths == [name], caught.value
    assert name in str(caught.value)
    assert passes == []  # refused before any pass


@pytest.mark.parametrize(("stop", "path"), [
    (("ok", "\ud800"), "stop[1]"), ((b"ab",), "stop[0]"), (("",), "stop"), ((3,), "stop[0]"),
])
def test_bad_stop_strings(decoder_engine, stop, path):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate("def ", 4, stop=stop)
    assert caught.value.paths == [path]


@pytest.mark.parametrize(("ids", "path"), [([2.0, 3.0], "prompt_ids"), ([2, True], "prompt_ids"),
                                           ([2, None], "prompt_ids"),
                                           (np.array([2.0, 3.0]), "prompt_ids")])
def test_token_ids_must_be_integers(decoder_engine, ids, path):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate(ids, 4)
    assert caught.value.paths == [path]


def test_numpy_integer_ids_and_fields_are_accepted(decoder_engine):
    engine = decoder_engine()
    plain = engine.generate([5, 9, 3], 6)
    assert engine.generate(np.array([5, 9, 3]), np.int64(6)).token_ids == plain.token_ids
    assert engine.generate([np.int32(5), 9, 3], max_new_tokens=np.int16(6)).token_ids == \
        plain.token_ids


@pytest.mark.parametrize(("prompt", "path"), [(b"def ", "prompt"), ("de\udc80f", "prompt"),
                                              (None, "prompt_ids"), (3, "prompt_ids"),
                                              ({"a": 1}, "prompt_ids")])
def test_bad_prompts(decoder_engine, prompt, path):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate(prompt, 4)
    assert caught.value.paths[0].startswith(path)


def test_bytes_prompt_names_the_remedy(decoder_engine):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate(b"def ", 4)
    assert "decode bytes first" in str(caught.value)


def test_unknown_option_and_bad_options_object(decoder_engine):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate("def ", 4, temprature=1.0)
    assert caught.value.paths == ["temprature"]
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate("def ", "64")
    assert caught.value.paths == ["options"]
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate("def ", 4, inputs=[1, 2])
    assert caught.value.paths == ["inputs"]


def test_one_stop_string_may_be_given_bare(decoder_engine):
    engine = decoder_engine()
    assert engine.generate("def ", 30, stop="gn").text == \
        engine.generate("def ", 30, stop=["gn"]).text


def test_options_object_and_keywords_agree(decoder_engine):
    engine = decoder_engine()
    options = GenerationOptions(max_new_tokens=12, temperature=2.0, top_k=5, seed=3)
    assert engine.generate("def ", options).token_ids == engine.generate(
        "def ", 12, temperature=2.0, top_k=5, seed=3).token_ids
    assert engine.generate("def ", options, seed=4).token_ids == engine.generate(
        "def ", 12, temperature=2.0, top_k=5, seed=4).token_ids


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_the_command_line_options_default_to_the_options_fields(command):
    """generate, chat and serve build their options from GenerationOptions' fields, so their
    defaults cannot drift from the API's."""
    import typer

    from speculant.cli import full_app

    click_command = typer.main.get_command(full_app()).commands[command]
    defaults = {p.name: p.default for p in click_command.params}
    offered = FIELD_NAMES & defaults.keys()
    required = {"max_new_tokens", "proposer", "k", "temperature", "top_k", "top_p", "min_p",
                "seed"}
    if command == "serve":  # its --max-tokens is a server limit: the remaining context
        required.remove("max_new_tokens")
    assert required <= offered
    for name in offered:
        if command == "chat" and name == "max_new_tokens":  # an answer: the rest of the
            assert defaults[name] is None  # context, unless capped
            continue
        assert defaults[name] == getattr(DEFAULTS, name), name


@pytest.mark.parametrize(("text", "value"), [("four", "four"), ("4.5", "4.5"), ("-1", "-1"),
                                            ("", ""), ("Auto", "Auto"), ("0", 0)])
def test_a_bad_width_from_the_command_line_is_a_request_error_naming_k(text, value):
    with pytest.raises(RequestError) as caught:
        parse_width(text, is_text=True)
    problem = caught.value.problems[0]
    assert (problem.path, problem.value) == ("k", value)
    assert problem.expected in ("'auto', None or an int >= 1", ">= 1")


def test_parse_width_forms():
    assert [parse_width(v) for v in (None, "auto", 1, np.int64(7))] == [None, "auto", 1, 7]
    assert [parse_width(t, is_text=True) for t in ("auto", "3", " 12 ")] == ["auto", 3, 12]
    with pytest.raises(RequestError, match="k = '4' is not a width"):
        parse_width("4")  # the API takes numbers, not digits


def test_the_api_and_the_cli_agree_on_the_default_k(tmp_path):
    """--speculative without --k and proposer="chained": one default, k="auto" (the width
    controller); k=None is the kind's default width, fixed."""
    from builders.writers import write_chained_package
    from speculant.cli import options_of

    assert DEFAULTS.k == "auto"
    assert GenerationOptions.of(proposer="chained").k == "auto"
    fields = {"max_new_tokens": 20, "proposer": None, "k": DEFAULTS.k}
    cli = options_of(fields, speculative=True)
    assert cli == GenerationOptions.of(max_new_tokens=20, speculative=True)
    assert options_of({**fields, "k": "3"}, speculative=True).k == 3
    engine = speculant.load(write_chained_package(tmp_path / "pair"))
    width = engine.package.document.speculative.max_proposal_width
    fixed = engine.generate([5, 9, 3], 20, proposer="chained", k=None)
    assert max(k for k, _ in fixed.stats.trace) == width
    assert fixed.stats.trace == engine.generate([5, 9, 3], 20, proposer="chained",
                                                k=width).stats.trace
    auto = engine.generate([5, 9, 3], 20, speculative=True)
    assert auto.token_ids == fixed.token_ids
    assert max(k for k, _ in auto.stats.trace) <= width


def test_a_zero_dimensional_array_prompt(decoder_engine):
    with pytest.raises(RequestError) as caught:
        decoder_engine().generate(np.array(3), 4)
    assert caught.value.paths == ["prompt_ids"]


def test_a_budget_the_request_role_cannot_hold(edited_package):
    """max_new_tokens is bound into an int32 request-role input: too large is typed."""
    def budget_input(document: dict) -> None:
        document["pipeline"]["workflow"]["inputs"]["request.budget"] = {
            "contract": {"dtype": "int32", "rank": 1, "shape": [1]},
            "role": {"kind": "runtime", "version": "1.0", "role": "max_output_tokens"},
            "source": {"kind": "request"}, "required": True}

    engine = speculant.load(edited_package("budget-int32", budget_input))
    with pytest.raises(RequestError) as caught:
        engine.generate("def ", 2**40)
    assert caught.value.paths == ["request.budget"] and "int32" in str(caught.value)
    assert len(engine.generate("def ", 3).token_ids) == 3
