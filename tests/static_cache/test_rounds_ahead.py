"""Chained rounds queued behind one another (speculative/round.py's ``launch_queued_round``): each
round's start, ``s``, ``p``, ``carry_0`` and the drafter's positions and length advanced where
the round runs from the last round's acceptance, before the host reads it. Driven on the CPU
by setting the target's depth (a device's default is 1, the host's 0): greedy's tokens at
every k and auto; at a fixed k the same drafts and so the same trace as rounds one at a time;
rounds actually queued; a stop with rounds queued leaves the state exact; the budget queues
no round it does not need; sampling stays one round at a time. Planted: a stale start, a
stale pending token, the carry taken from the wrong row, each fails a test here."""

from __future__ import annotations

import pytest

import speculant
from speculant.speculative.chained import ChainedProposer
from speculant.tensors.seam import TensorSeam

PROMPT = [7, 3, 41, 12, 25, 9, 7, 3, 41, 12]
NEW = 40


def engine_at(root, depth: int):
    engine = speculant.load(root, threads=1)
    engine.target.queue_depth = depth
    return engine


def queued_calls(monkeypatch) -> list[bool]:
    """For every ``propose_after``: whether it was queued behind an unread round."""
    calls: list[bool] = []
    propose_after = ChainedProposer.propose_after

    def recording(self, state, after, cursor, k):
        calls.append(after is not None)
        return propose_after(self, state, after, cursor, k)

    monkeypatch.setattr(ChainedProposer, "propose_after", recording)
    return calls


@pytest.fixture(scope="module")
def demo(demo_static):
    """The trained demo pair on static caches (drafts land), its prompt and greedy stream."""
    engine = engine_at(demo_static, 0)
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    return demo_static, prompt, engine.generate(prompt, NEW, stop_on_eos=False).token_ids


def one_at_a_time(root, prompt, k):
    return engine_at(root, 0).generate(prompt, NEW, speculative=True, k=k, stop_on_eos=False)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_queued_rounds_decode_greedy_with_the_drafts_of_rounds_one_at_a_time(
        demo, k, monkeypatch):
    root, prompt, greedy = demo
    reference = one_at_a_time(root, prompt, k)
    calls = queued_calls(monkeypatch)
    engine = engine_at(root, 1)
    target = engine.sessions[engine.package.plan.target]
    result = engine.generate(prompt, NEW, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy == reference.token_ids
    assert result.stats.trace == reference.stats.trace  # the same drafts, round by round
    assert result.stats.accepted_drafts > 0
    assert sum(calls) >= result.stats.rounds // 2 > 0  # most rounds were queued behind one
    assert result.stats.queued_passes == sum(calls) and reference.stats.queued_passes == 0
    assert result.stats.rollback_bytes_moved == 0
    # the budget ends the stream: no round is queued past the last it needs
    assert target.num_invocations == result.stats.target_passes


@pytest.mark.parametrize("form", ["scatter-float32", "gqa-float16"])
def test_every_static_form_decodes_greedy(pairs, form, monkeypatch):
    want = speculant.load(pairs[form, "appended"], threads=1).generate(
        PROMPT, NEW, stop_on_eos=False).token_ids
    calls = queued_calls(monkeypatch)
    result = engine_at(pairs[form, "static"], 1).generate(PROMPT, NEW, speculative=True, k=4,
                                                          stop_on_eos=False)
    assert result.token_ids == want and sum(calls) > 0


@pytest.mark.parametrize("depth", [1, 2])
def test_auto_k_and_deeper_queues_decode_greedy(demo, depth, monkeypatch):
    root, prompt, greedy = demo
    calls = queued_calls(monkeypatch)
    result = engine_at(root, depth).generate(prompt, NEW, speculative=True, k="auto",
                                             stop_on_eos=False)
    assert result.token_ids == greedy and sum(calls) > 0


def test_a_stop_with_rounds_queued_leaves_the_state_exact(demo):
    """Stop at greedy's 20th token: the round queued behind the one that found it ran and is
    dropped; the next request on the same pooled buffers and plans decodes as a fresh
    engine does."""
    root, prompt, greedy = demo
    stop = greedy[19]
    engine = engine_at(root, 1)
    stopped = engine.generate(prompt, NEW, speculative=True, k=4, stop_token_ids=[stop])
    assert stopped.token_ids == greedy[:greedy.index(stop) + 1]
    assert stopped.stats.stop_reason == "eos"
    again = engine.generate(prompt[2:], NEW, speculative=True, k=4, stop_on_eos=False)
    fresh = one_at_a_time(root, prompt[2:], 4)
    assert again.token_ids == fresh.token_ids and again.stats.trace == fresh.stats.trace


def test_sampling_runs_one_round_at_a_time(demo, monkeypatch):
    root, prompt, _ = demo
    calls = queued_calls(monkeypatch)
    result = engine_at(root, 1).generate(prompt, 16, speculative=True, k=4, temperature=0.8,
                                         seed=3, stop_on_eos=False)
    assert len(result.token_ids) == 16 and calls == []


def _planted(root, prompt):
    return engine_at(root, 1).generate(prompt, NEW, speculative=True, k=4, stop_on_eos=False)


def test_a_stale_start_is_caught(demo, monkeypatch):
    """Planted: the cursor is never advanced (each queued round verifies at the first's C)."""
    root, prompt, greedy = demo
    monkeypatch.setattr(TensorSeam, "add_first", lambda self, total, counts: total)
    assert _planted(root, prompt).token_ids != greedy


def test_a_stale_pending_token_is_caught(demo, monkeypatch):
    """Planted: ``p`` is taken from the count one slot early (``c_{a-1}``; for a = 1: a)."""
    root, prompt, greedy = demo
    take_at = TensorSeam.take_at

    def early(self, dst, src, axis, index, offset=0):
        if src.kind == "token_ids" and src.size > 2 and offset == 0:
            offset = -1
        return take_at(self, dst, src, axis, index, offset)

    monkeypatch.setattr(TensorSeam, "take_at", early)
    assert _planted(root, prompt).token_ids != greedy


def test_a_carry_from_the_wrong_row_is_caught(demo, monkeypatch):
    """Planted: ``carry_0`` is the seed's row ``a`` instead of ``a − 1``: drafts only decide
    what is verified, so the tokens stay greedy's; the rounds are what differ."""
    root, prompt, greedy = demo
    reference = one_at_a_time(root, prompt, 4)
    take_at = TensorSeam.take_at

    def wrong_row(self, dst, src, axis, index, offset=0):
        if src.dtype == "float32" and offset == -1:
            offset = 0
        return take_at(self, dst, src, axis, index, offset)

    monkeypatch.setattr(TensorSeam, "take_at", wrong_row)
    planted = _planted(root, prompt)
    assert planted.token_ids == greedy
    assert planted.stats.trace != reference.stats.trace
