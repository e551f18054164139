"""Request admission and the serving controls (runtime.md §2, §3, §4, §16, §19).

What a pass binds is observed through the ``passes`` recorder (conftest): every
``TargetPass.run`` and the target's ``ComponentSession.invoke`` inputs, copied when bound.
Variants are one edit of the decoder fixture's ``inference_metadata.yaml``.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import speculant
from builders import definition as fx
from builders.tokenizer import encode
from speculant import ContractError, RequestError, UnsupportedError

CONTROLS = ("request.active", "request.done", "request.accepted_len")
ALIGNED = {"kind": "request_aligned", "axis": 0}


def _inputs(document: dict) -> dict:
    return document["pipeline"]["workflow"]["inputs"]


def _application_input(name: str, shape: list, **extra) -> dict:
    return {"contract": {"dtype": "float32", "rank": len(shape), "shape": shape,
                         "batch_layout": dict(ALIGNED)},
            "role": {"kind": "opaque"}, "source": {"kind": "application", "name": name},
            **extra}


def with_extra_inputs(document: dict) -> None:
    """``request.extra`` [batch, feature] required, bound to nothing; ``request.extra2``
    [batch, feature] and ``request.extra3`` [batch, sequence] optional with default 0."""
    inputs = _inputs(document)
    inputs["request.extra"] = _application_input("extra", ["batch", "feature"], required=True)
    inputs["request.extra2"] = _application_input("extra2", ["batch", "feature"],
                                                  required=False, default=0.0)
    inputs["request.extra3"] = _application_input("extra3", ["batch", "sequence"],
                                                  required=False, default=0.0)


def with_control_defaults(document: dict) -> None:
    inputs = _inputs(document)
    inputs["request.accepted_len"]["default"] = 7
    inputs["request.active"]["default"] = True
    inputs["request.done"]["default"] = False


def with_request_budget(rank: int):
    def edit(document: dict) -> None:
        _inputs(document)["request.budget"] = {
            "contract": {"dtype": "int64", "rank": rank, "shape": [1] * rank},
            "role": {"kind": "runtime", "version": "1.0", "role": "max_output_tokens"},
            "source": {"kind": "request"}, "required": True}
    return edit


MINIMAL_STEPS = {"loop": {"steps": [], "continue_when": "c", "max_iterations": "n"},
                 "sequence": {"steps": []}, "branch": {"predicate": "p", "cases": {}}}


def with_step(kind: str):
    def edit(document: dict) -> None:
        document["pipeline"]["workflow"]["steps"].append({"kind": kind,
                                                          **MINIMAL_STEPS[kind]})
    return edit


def bound(recorded, name: str) -> list:
    """The value of ``name`` bound into each recorded pass, as Python scalars."""
    return [p.values[name].reshape(-1)[0].item() for p in recorded]


# -- serving controls (§2.2, §16) ------------------------------------------------------------
def test_required_controls_without_defaults_are_seeded(decoder_package, decoder_engine, passes):
    document = yaml.safe_load((decoder_package() / "inference_metadata.yaml").read_text())
    for name in CONTROLS:  # the fixture declares them required, with no default
        spec = _inputs(document)[name]
        assert spec["required"] is True and "default" not in spec, name
    result = decoder_engine().generate("def ", 3)
    assert len(result.token_ids) == 3
    first = passes[0].values
    assert first["request.active"].dtype == np.bool_ and first["request.active"].shape == (1,)
    assert first["request.done"].dtype == np.bool_ and first["request.done"].shape == (1,)
    assert first["request.accepted_len"].dtype == np.int64
    assert first["request.accepted_len"].shape == (1,)
    assert (first["request.active"][0], first["request.done"][0],
            first["request.accepted_len"][0]) == (True, False, 0)


@pytest.mark.parametrize("has_default, caller, expected", [
    (False, None, 0),  # the role seed
    (True, None, 7),  # the package default beats the seed
    (False, 5, 5),  # the caller beats the seed
    (True, 5, 5),  # the caller beats the package default
])
@pytest.mark.parametrize("key", ["request.accepted_len", "accepted_len"])
def test_control_precedence_caller_default_seed(decoder_engine, edited_package, passes,
                                                has_default, caller, expected, key):
    engine = (speculant.load(edited_package("control_defaults", with_control_defaults))
              if has_default else decoder_engine())
    inputs = {} if caller is None else {key: np.array([caller], np.int64)}
    engine.generate("def ", 2, inputs=inputs)
    assert bound(passes, "request.accepted_len")[0] == expected


def with_rank0_controls(document: dict) -> None:
    inputs = _inputs(document)
    for name in CONTROLS:
        contract = inputs[name]["contract"]
        contract.update(rank=0, shape=[])
        contract.pop("batch_layout")


def test_rank0_controls_are_seeded_at_rank0(edited_package, passes):
    """runtime.md §2.2: a seed is shaped [] at rank 0."""
    engine = speculant.load(edited_package("rank0_controls", with_rank0_controls))
    engine.generate("def ", 2)
    for name in CONTROLS:
        assert passes[0].values[name].shape == (), name
    assert bound(passes, "request.accepted_len") == [0, 4]


def test_caller_active_and_done_are_bound(decoder_engine, passes):
    decoder_engine().generate("def ", 2, inputs={"active": np.array([True]),
                                                  "request.done": np.array([False])})
    assert bound(passes, "request.active") == [True, True]
    assert bound(passes, "request.done") == [False, False]


@pytest.mark.parametrize("inputs", [
    {"request.active": np.array([False])},
    {"active": np.array([False])},
    {"request.done": np.array([True])},
    {"done": np.array([True])},
    {"active": np.array([False]), "done": np.array([True])},
], ids=["active-full-name", "active-source-name", "done-full-name", "done-source-name",
        "both"])
def test_inactive_or_done_caller_gets_an_empty_result_without_a_pass(decoder_engine, passes,
                                                                     inputs):
    engine = decoder_engine()
    result = engine.generate("def ", 5, inputs=inputs)
    assert result.token_ids == []
    assert not result.text
    assert passes == []
    assert result.stats.target_passes == 0 and result.stats.committed == 0
    assert list(engine.stream("def ", 5, inputs=inputs)) == []


@pytest.mark.parametrize("prompt", ["def ", "hello world", "a"])
def test_accepted_len_over_a_greedy_run(decoder_engine, passes, prompt):
    """runtime.md §16: 0 at admission, P after prefill, 1 after each greedy step; active and
    done stay true/false in every pass; no pass after the stop."""
    result = decoder_engine().generate(prompt, 6)
    num_prompt = len(encode(prompt))
    assert len(passes) == len(result.token_ids) == 6
    assert bound(passes, "request.accepted_len") == [0, num_prompt, 1, 1, 1, 1]
    assert bound(passes, "request.active") == [True] * 6
    assert bound(passes, "request.done") == [False] * 6
    assert [p.start for p in passes] == [0] + [num_prompt + i for i in range(5)]
    assert [len(p.tokens) for p in passes] == [num_prompt] + [1] * 5


def test_accepted_len_after_a_caller_value(decoder_engine, passes):
    """A caller's accepted_len is bound into the prefill only; the run then owns it."""
    decoder_engine().generate("def ", 3, inputs={"accepted_len": np.array([9], np.int64)})
    assert bound(passes, "request.accepted_len") == [9, 4, 1]


def test_accepted_len_after_speculative_rounds(chained_engine, passes):
    """After a round accepted_len is the round's a (runtime.md §16)."""
    result = chained_engine().generate("def ", 20, speculative=True, k=4)
    accepted = [a for _, a in result.stats.trace]
    assert len(passes) == 1 + len(accepted) + result.stats.greedy_steps
    assert result.stats.greedy_steps == 0
    assert bound(passes, "request.accepted_len") == [0, 4] + accepted[:-1]


# -- required inputs, driver-bound inputs, undeclared inputs (§2.1) ---------------------------
def test_missing_required_input_has_the_stable_prefix(edited_package, passes):
    engine = speculant.load(edited_package("extra_inputs", with_extra_inputs))
    with pytest.raises(RequestError) as error:
        engine.generate("def ", 3)
    assert error.value.problems[0].message.startswith("missing required input 'request.extra'")
    assert error.value.paths == ["request.extra"]
    assert passes == []


@pytest.mark.parametrize("key", ["request.extra", "extra"])
def test_required_input_supplied_by_either_name(edited_package, passes, key):
    engine = speculant.load(edited_package("extra_inputs", with_extra_inputs))
    result = engine.generate("def ", 3, inputs={key: np.ones((1, 3), np.float32)})
    assert len(result.token_ids) == 3
    for recorded in passes:
        np.testing.assert_array_equal(recorded.values["request.extra"], np.ones((1, 3)))
        # rule 4: a default is materialized at the shape the pass's other inputs resolve
        assert recorded.values["request.extra2"].shape == (1, 3)
        assert not recorded.values["request.extra2"].any()
        assert recorded.values["request.extra3"].shape == (1, len(recorded.tokens))


@pytest.mark.parametrize("key", [
    "request.input_ids", "request.attention_mask", "attention_mask", "request.position_ids",
    "position_ids", "request.past.key", "past.value"])
def test_caller_value_for_a_driver_bound_input(decoder_engine, passes, key):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate("def ", 3, inputs={key: np.zeros((1, 4), np.int64)})
    name = key if key.startswith("request.") else f"request.{key}"
    assert error.value.paths == [name]
    assert name in str(error.value)
    assert passes == []


def test_undeclared_caller_input(decoder_engine, passes):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate("def ", 3, inputs={"bogus": np.zeros(1, np.float32),
                                                     "request.active": np.array([True])})
    assert "bogus" in str(error.value)
    assert "request.active" not in error.value.problems[0].message  # only the undeclared one
    assert passes == []


def test_caller_control_of_the_wrong_dtype(decoder_engine):
    with pytest.raises((RequestError, ContractError)) as error:
        decoder_engine().generate("def ", 3, inputs={"active": np.array([1], np.int64)})
    assert "request.active" in str(error.value)


@pytest.mark.parametrize("rank, shape", [(0, ()), (1, (1,))])
def test_request_role_takes_max_new_tokens(edited_package, passes, rank, shape):
    """runtime.md §2.1 rule 3: shaped [] at rank 0 and [1] at rank 1."""
    engine = speculant.load(edited_package(f"budget_rank{rank}", with_request_budget(rank)))
    engine.generate("def ", 3)
    assert passes[0].values["request.budget"].shape == shape
    assert bound(passes, "request.budget") == [3, 3, 3]


def test_request_role_of_rank_two_is_refused(edited_package):
    engine = speculant.load(edited_package("budget_rank2", with_request_budget(2)))
    with pytest.raises(RequestError) as error:
        engine.generate("def ", 3)
    assert "request.budget" in str(error.value)


# -- shape symbols (§3) -----------------------------------------------------------------------
def test_caller_extent_contradicting_another_caller_input(edited_package):
    engine = speculant.load(edited_package("extra_inputs", with_extra_inputs))
    with pytest.raises(ContractError) as error:
        engine.generate("def ", 3, inputs={"extra": np.zeros((1, 3), np.float32),
                                           "extra2": np.zeros((1, 4), np.float32)})
    message = str(error.value)
    assert "'feature'" in message and "3" in message and "4" in message
    assert "request.extra" in message and "request.extra2" in message


def test_caller_extent_contradicting_a_driver_bound_symbol(edited_package):
    """``sequence`` is bound by the token ids (4 at prefill); a caller's 2 contradicts it."""
    engine = speculant.load(edited_package("extra_inputs", with_extra_inputs))
    with pytest.raises(ContractError) as error:
        engine.generate("def ", 3, inputs={"extra": np.zeros((1, 3), np.float32),
                                           "extra3": np.zeros((1, 2), np.float32)})
    message = str(error.value)
    assert "'sequence'" in message and "2" in message and "4" in message
    assert "request.extra3" in message and "request.input_ids" in message


def test_caller_control_with_two_rows_breaks_the_request_axis(decoder_engine):
    with pytest.raises(ContractError) as error:
        decoder_engine().generate("def ", 3, inputs={"active": np.array([True, True])})
    assert "request.active" in str(error.value)


# -- request checks (§2.4) --------------------------------------------------------------------
@pytest.mark.parametrize("prompt, bad", [([2, 32, 3], 32), ([-1, 3], -1), ([2, 3, 1000], 1000)])
def test_prompt_id_outside_the_vocabulary(decoder_engine, passes, prompt, bad):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate(prompt, 3)
    assert error.value.paths == ["prompt_ids"]
    assert str(bad) in str(error.value) and str(fx.VOCAB_SIZE) in str(error.value)
    assert passes == []


@pytest.mark.parametrize("prompt", ["", []], ids=["text", "ids"])
def test_empty_prompt(decoder_engine, passes, prompt):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate(prompt, 3)
    assert error.value.paths == ["prompt_ids"]
    assert passes == []


def test_prompt_of_more_than_one_row(decoder_engine):
    """An array of rows is refused; a list of lists is a list of prompts
    (tests/workflow/test_engine_api.py)."""
    with pytest.raises(RequestError):
        decoder_engine().generate(np.array([[2, 3], [4, 5]]), 3)


@pytest.mark.parametrize("prompt_len, max_context", [
    (fx.MAX_CONTEXT, None), (fx.MAX_CONTEXT + 5, None), (4, 4), (6, 5)])
def test_prompt_filling_the_context(decoder_engine, passes, prompt_len, max_context):
    prompt = [2 + i % 30 for i in range(prompt_len)]
    with pytest.raises(RequestError) as error:
        decoder_engine().generate(prompt, 3, max_context=max_context)
    assert "prompt fills the context" in str(error.value)
    assert passes == []


def test_prompt_filling_the_package_cap(decoder_engine):
    engine = decoder_engine(spec=fx.make_spec(deviation_positions={3, 7, 8, 13}, max_context=16))
    with pytest.raises(RequestError, match="prompt fills the context"):
        engine.generate([2] * 16, 3)
    assert len(engine.generate([2] * 15, 3).token_ids) == 1  # one token fits


@pytest.mark.parametrize("budget", [0, -1])
def test_max_new_tokens_below_one(decoder_engine, passes, budget):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate("def ", budget)
    assert error.value.paths == ["max_new_tokens"]
    assert passes == []


def test_speculating_without_a_speculative_contract(decoder_engine):
    with pytest.raises(RequestError) as error:
        decoder_engine().generate("def ", 3, speculative=True, k=2)
    assert error.value.paths == ["speculative"]


@pytest.mark.parametrize("k", [0, 5])
def test_k_outside_the_rollback_bound(chained_engine, k):
    with pytest.raises(RequestError) as error:
        chained_engine().generate("def ", 3, speculative=True, k=k)
    assert error.value.paths[0] in ("k", "speculative.max_proposal_width")


# -- load: unsupported step kinds (metadata.md §4.8) ------------------------------------------
@pytest.mark.parametrize("kind", ["loop", "sequence", "branch"])
def test_unsupported_step_kind_at_load(edited_package, kind):
    with pytest.raises(UnsupportedError) as error:
        speculant.load(edited_package(f"step_{kind}", with_step(kind)))
    assert error.value.paths == ["pipeline.workflow.steps.2.kind"]
    assert f"unsupported step kind '{kind}' at pipeline.workflow.steps.2" in str(error.value)


# -- caches start empty (§2.3) and hold what the passes wrote (§4) -----------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cells_start_empty_then_hold_the_stream(decoder_engine, passes, dtype):
    engine = decoder_engine(dtype)
    prompt = encode("def ")
    result = engine.generate(prompt, 5)
    stream = prompt + result.token_ids
    np_dtype = np.dtype(dtype)
    first = passes[0]
    for name, port in (("request.past.key", "past_key_values.0.key"),
                       ("request.past.value", "past_key_values.0.value")):
        assert first.values[name].shape == (1, fx.NUM_HEADS, 0, fx.HEAD_DIM)
        assert first.values[name].dtype == np_dtype
        assert first.port_inputs[port].shape == (1, fx.NUM_HEADS, 0, fx.HEAD_DIM)
    for recorded in passes[1:]:
        key, value = recorded.values["request.past.key"], recorded.values["request.past.value"]
        assert key.shape == value.shape == (1, fx.NUM_HEADS, recorded.start, fx.HEAD_DIM)
        for position in range(recorded.start):
            entry_key, entry_value = fx.cache_entry(stream[position])
            np.testing.assert_array_equal(key[0, :, position].astype(np.float32), entry_key)
            np.testing.assert_array_equal(value[0, :, position].astype(np.float32),
                                          entry_value)
        mask = recorded.values["request.attention_mask"]
        assert mask.shape == (1, recorded.start + 1) and mask.all()
        np.testing.assert_array_equal(recorded.values["request.position_ids"],
                                      [[recorded.start]])


def test_controls_do_not_leak_between_requests(decoder_engine, passes):
    engine = decoder_engine()
    engine.generate("def ", 3)
    engine.generate("hello", 2)
    assert bound(passes, "request.accepted_len") == [0, 4, 1, 0, 5]
    assert passes[3].values["request.past.key"].shape[2] == 0  # fresh empty caches
