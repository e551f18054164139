"""Serving controls over a speculative run (runtime.md §2.2, §16): seeded when the caller and
the package give nothing, caller > default > seed, the values bound into every pass, and
every other required input still required.
"""

from __future__ import annotations

import numpy as np
import pytest
from chain_helpers import PROBE_PROMPT, SPEC, check_tokens_equal_greedy, run_recorded

import speculant
from builders import greedy_stream
from speculant.errors import RequestError

K = 4


def _inputs(document: dict) -> dict:
    return document["pipeline"]["workflow"]["inputs"]


def _default_accepted_len(document: dict) -> None:
    _inputs(document)["request.accepted_len"]["default"] = 3


def _extra_required_input(document: dict) -> None:
    _inputs(document)["request.user_bias"] = {
        "contract": {"dtype": "float32", "rank": 1, "shape": ["batch"],
                     "batch_layout": {"kind": "request_aligned", "axis": 0}},
        "role": {"kind": "opaque"},
        "source": {"kind": "application", "name": "user_bias"},
        "required": True}


def _first_pass_controls(engine, monkeypatch, **options) -> dict[str, np.ndarray]:
    with monkeypatch.context() as mp:
        rec = run_recorded(engine, mp, PROBE_PROMPT, K, max_new_tokens=8, **options)
    assert rec.error is None and rec.tokens
    return rec.bound_controls[0]


def test_controls_are_seeded_when_nothing_supplies_them(pair_engine, monkeypatch):
    engine = pair_engine()
    controls = _first_pass_controls(engine, monkeypatch)
    assert controls["active"].tolist() == [True] and controls["active"].dtype == np.bool_
    assert controls["done"].tolist() == [False] and controls["done"].dtype == np.bool_
    assert controls["accepted_len"].tolist() == [0]
    assert controls["accepted_len"].dtype == np.int64


@pytest.mark.parametrize(
    ("package", "caller", "expected"),
    [("seeded", None, 0),
     ("default", None, 3),
     ("default", {"accepted_len": np.array([5], np.int64)}, 5),
     ("default", {"request.accepted_len": np.array([6], np.int64)}, 6),
     ("seeded", {"accepted_len": np.array([5], np.int64)}, 5)],
    ids=["seed", "default_over_seed", "caller_over_default", "caller_by_workflow_name",
         "caller_over_seed"])
def test_control_precedence_caller_over_default_over_seed(pair_engine, edited_pair,
                                                          monkeypatch, package, caller,
                                                          expected):
    """What the first pass binds for ``accepted_len`` (seed 0; the edited package declares
    ``default: 3``)."""
    engine = pair_engine() if package == "seeded" else \
        speculant.load(edited_pair("accepted_len_default", _default_accepted_len))
    controls = _first_pass_controls(engine, monkeypatch, inputs=caller or {})
    assert controls["accepted_len"].tolist() == [expected]


def test_accepted_len_bound_into_each_pass_is_the_latest_growth(recorded):
    """§16: 0 into prefill, then P, then a_r of each round (1 after a greedy step)."""
    rec = recorded(PROBE_PROMPT, K)
    bound = [int(c["accepted_len"][0]) for c in rec.bound_controls]
    assert bound == [0] + [adv.keep for adv in rec.advances[:-1]]
    assert bound[1] == len(PROBE_PROMPT)
    assert all(c["active"].tolist() == [True] and c["done"].tolist() == [False]
               for c in rec.bound_controls)


@pytest.mark.parametrize("caller", [{"active": np.array([False])}, {"done": np.array([True])}],
                         ids=["inactive", "done"])
def test_inactive_or_done_caller_gets_an_empty_result(pair_engine, caller):
    result = pair_engine().generate(list(PROBE_PROMPT), 8, speculative=True, k=K, inputs=caller)
    assert result.token_ids == []
    assert result.stats.target_passes == 0 and result.stats.proposer_invocations == 0


def test_non_control_required_input_still_fails_with_the_stable_prefix(edited_pair, monkeypatch):
    engine = speculant.load(edited_pair("extra_required_input", _extra_required_input))
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, speculative=True, k=K)
    problem = caught.value.problems[0]
    assert problem.message.startswith("missing required input 'request.user_bias'")
    assert problem.path == "request.user_bias"
    # Supplied under its application name, it decodes as before.
    with monkeypatch.context() as mp:
        rec = run_recorded(engine, mp, PROBE_PROMPT, K, max_new_tokens=8,
                           inputs={"user_bias": np.array([0.5], np.float32)})
    check_tokens_equal_greedy(rec, greedy_stream(SPEC, list(PROBE_PROMPT), 8))


def test_caller_value_for_a_driver_bound_input_is_refused(pair_engine):
    with pytest.raises(RequestError) as caught:
        pair_engine().generate(list(PROBE_PROMPT), 8, speculative=True, k=K,
                               inputs={"attention_mask": np.ones((1, 3), np.int64)})
    assert caught.value.paths == ["request.attention_mask"]


def test_undeclared_caller_input_is_refused_with_its_name(pair_engine):
    with pytest.raises(RequestError) as caught:
        pair_engine().generate(list(PROBE_PROMPT), 8, speculative=True, k=K,
                               inputs={"temperature": np.array([1.0], np.float32)})
    assert "temperature" in str(caught.value)
