"""Planted defects in speculant's static-cache driving, each caught by a named check (issue
12): a stale length after rollback (wrong tokens), a drafter borrowing the wrong layer's
buffers (tokens kept by verification, fewer drafts accepted), a plan replayed with the wrong
width (a typed ContractError, never a silent run)."""

from __future__ import annotations

import pytest

import speculant
from speculant.errors import ContractError
from speculant.workflow.cells import StaticPool
from speculant.workflow.state import DecodeState

PROMPT = [7, 3, 41, 12, 25, 9, 7, 3, 41, 12]
NEW = 24


def chained(engine, k: int = 4):
    return engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False, proposer="chained",
                           k=k)


@pytest.fixture
def appended(pairs):
    return speculant.load(pairs["scatter-float32", "appended"], threads=1)


@pytest.fixture
def engine(pairs):
    return speculant.load(pairs["scatter-float32", "static"], threads=1)


@pytest.fixture
def greedy_tokens(engine):
    return engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False).token_ids


def test_a_stale_length_after_rollback_is_caught(engine, greedy_tokens, monkeypatch):
    """Rollback that forgets to set L = C + a (L stays at the block's end, over the rejected
    drafts' slots): speculative leaves greedy, which test_speculative_equals_greedy_on_static
    _caches asserts."""
    assert chained(engine).token_ids == greedy_tokens
    advance = DecodeState.advance
    planted = []

    def stale(state, pass_result, num_kept):
        advance(state, pass_result, num_kept)
        if num_kept < len(pass_result.tokens) and not planted:  # the first rollback
            planted.append(num_kept)
            state.consumed = pass_result.end  # the defect: L stays at the block's end

    monkeypatch.setattr(DecodeState, "advance", stale)
    broken = chained(engine)
    assert planted and broken.token_ids != greedy_tokens


def test_a_borrowed_view_of_the_wrong_layer_is_caught(engine, appended, greedy_tokens,
                                                      monkeypatch):
    """The drafter bound to layer 0's buffers instead of the last layer's: verification keeps
    the tokens, but the drafts change, so the rounds leave the appended pair's, which
    test_speculative_equals_greedy_on_static_caches asserts. (On this random pair the wrong
    view may even accept more; on the trained demo pair it accepts fewer:
    docs/design/static-cache.md, *Evidence*.)"""
    right = chained(engine)
    assert right.stats.trace == chained(appended).stats.trace
    borrowed = engine.proposer.chain.borrowed
    assert borrowed == {"shared_kv.key": "kv.1.key", "shared_kv.value": "kv.1.value"}
    monkeypatch.setitem(borrowed, "shared_kv.key", "kv.0.key")
    monkeypatch.setitem(borrowed, "shared_kv.value", "kv.0.value")
    monkeypatch.setattr(engine, "static_pool", StaticPool())  # plans made anew, with the defect
    wrong = chained(engine)
    assert wrong.token_ids == right.token_ids == greedy_tokens
    assert wrong.stats.trace != right.stats.trace


def test_a_plan_replayed_with_the_wrong_width_is_caught(engine, monkeypatch):
    """A verify block of width 3 handed the plan made for width 1: the plan's write refuses
    the tokens (a ContractError naming the planned shape), nothing runs."""
    monkeypatch.setattr(engine, "static_pool", StaticPool())  # this test's own buffers
    engine.generate(PROMPT, NEW, stop_on_eos=False)  # greedy: the plan of width 1
    decode = engine.decode(PROMPT, max_new_tokens=NEW, stop_on_eos=False, proposer="chained",
                           k=2)
    cells = decode.state.cells
    next(decode)  # the prefill
    cells.plans[3] = cells.plans[1]  # the defect: the wrong plan for width 3
    runs = cells.plans[3].num_runs
    with pytest.raises(ContractError, match=r"'input_ids' was planned as \[1, 1\] int64"):
        list(decode)
    assert cells.plans[3].num_runs == runs


def test_the_wrong_layer_accepts_fewer_drafts_on_the_trained_pair(demo_static, monkeypatch):
    """On the trained demo pair the drafter borrowing layer 0 instead of the last layer
    keeps the target's tokens but accepts fewer drafts: a silent speed defect."""
    engine = speculant.load(demo_static, threads=1)
    prompt = engine.tokenizer.encode("def fibonacci(n):")
    options = dict(max_new_tokens=40, stop_on_eos=False, proposer="chained", k=4)
    greedy = engine.generate(prompt, max_new_tokens=40, stop_on_eos=False)
    right = engine.generate(prompt, **options)
    last = max(int(c.split(".")[1]) for c in engine.package.plan.cells)
    assert engine.proposer.chain.borrowed["shared_kv.key"] == f"kv.{last}.key"
    monkeypatch.setitem(engine.proposer.chain.borrowed, "shared_kv.key", "kv.0.key")
    monkeypatch.setitem(engine.proposer.chain.borrowed, "shared_kv.value", "kv.0.value")
    monkeypatch.setattr(engine, "static_pool", StaticPool())  # plans made anew, with the defect
    wrong = engine.generate(prompt, **options)
    assert wrong.token_ids == right.token_ids == greedy.token_ids
    assert wrong.stats.accepted_drafts < right.stats.accepted_drafts
