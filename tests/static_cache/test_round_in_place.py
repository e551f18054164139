"""The round verified in place (issue 12 item 4). On static caches a greedy chained proposal
keeps its drafts where the chain runs (``Proposal.drafts``: each step's argmax is the next
step's token there) and the round compares them with the target's choices there
(``seam.accept_greedy``), so the host reads back only ``a`` and the committed ids, once per
round. On the host the same code runs over numpy; tests/cuda/test_round_in_place_cuda.py
counts the bytes on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

import speculant
from speculant.speculative import round as round_module
from speculant.speculative.chain_graph import TOKEN
from speculant.speculative.chain_steps import ChainSteps
from speculant.speculative.verify import greedy_accept
from speculant.tensors import Value, make_seam
from speculant.tensors.acceptance import accept_greedy
from speculant.workflow.cells import StaticPool

PROMPT = [7, 3, 41, 12, 25, 9, 7, 3, 41, 12]
NEW = 24


@pytest.mark.parametrize("seed", range(40))
def test_accept_greedy_is_greedy_accept(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    choices = rng.integers(0, 4, size=k + 1).astype(np.int32)  # a small alphabet: matches
    drafts = np.where(rng.random(k) < 0.7, choices[:k], rng.integers(0, 4, size=k))
    drafts = drafts.astype(np.int32)
    out = accept_greedy(np, drafts, choices)
    block = [99, *drafts.tolist()]
    num_accepted = greedy_accept(block, [99, *choices.tolist()])
    assert out.dtype == np.int32 and out.shape == (k + 2,)
    assert out[0] == num_accepted
    assert out[1:1 + num_accepted].tolist() == [*block[1:num_accepted],
                                                int(choices[num_accepted - 1])]


def test_the_seam_refuses_what_it_cannot_compare():
    seam = make_seam()
    drafts = Value.host(np.zeros(3, np.int32), "int32")
    with pytest.raises(speculant.ContractError, match="accept_greedy"):
        seam.accept_greedy(drafts, Value.host(np.zeros(3, np.int32), "int32"))  # not k + 1
    with pytest.raises(speculant.ContractError, match="owned int32 or int64"):
        seam.write_ints(Value.host(np.zeros(2, np.float32), "float32"), [1])
    with pytest.raises(speculant.ContractError, match="outside"):
        seam.write_ints(seam.zeros((2,), "int64", "host"), [1, 2, 3])


@pytest.fixture
def engines(pairs):
    return {cache: speculant.load(pairs["scatter-float32", cache], threads=1)
            for cache in ("appended", "static")}


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_static_chained_greedy_verifies_in_place_and_equals_greedy(engines, k, monkeypatch):
    calls = []
    in_place = round_module.verify_in_place

    def counted(seam, drafts, logits):
        calls.append(drafts.size)
        return in_place(seam, drafts, logits)

    monkeypatch.setattr(round_module, "verify_in_place", counted)
    greedy = engines["appended"].generate(PROMPT, NEW, stop_on_eos=False).token_ids
    result = engines["static"].generate(PROMPT, NEW, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy
    assert calls == [k_r for k_r, _ in result.stats.trace if k_r > 0]  # every round in place
    if k != "auto":  # the same drafts as the appended pair's read-back ones: the same rounds
        appended = engines["appended"].generate(PROMPT, NEW, speculative=True, k=k,
                                                stop_on_eos=False)
        assert result.stats.trace == appended.stats.trace


def test_a_draft_fed_back_wrong_changes_the_rounds_not_the_tokens(demo_static, monkeypatch):
    """The planted defect: every step after the bootstrap reads token 0 instead of the
    previous step's argmax. Verification keeps the tokens; on the trained demo pair fewer
    drafts land."""
    engine = speculant.load(demo_static, threads=1)
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    right = engine.generate(prompt, NEW, speculative=True, k=4, stop_on_eos=False)
    step_inputs = ChainSteps.step_inputs

    def token_zero(self, j):
        inputs = step_inputs(self, j)
        if j > 1:  # steps 0 and 1 read s and p, written by the proposal itself
            inputs[TOKEN] = self.session.seam.zeros((1,), "int32", self.ids.residency)
        return inputs

    monkeypatch.setattr(ChainSteps, "step_inputs", token_zero)
    monkeypatch.setattr(engine, "static_pool", StaticPool())  # plans made anew, with the defect
    wrong = engine.generate(prompt, NEW, speculative=True, k=4, stop_on_eos=False)
    assert wrong.token_ids == right.token_ids
    assert wrong.stats.accepted_drafts < right.stats.accepted_drafts


def test_sampling_reads_each_draft_back(engines, monkeypatch):
    """Under sampling the drafts are draws whose q the verifier needs: read back one by one,
    never verified in place."""
    monkeypatch.setattr(round_module, "verify_in_place", pytest.fail)
    result = engines["static"].generate(PROMPT, NEW, speculative=True, k=4, temperature=0.8,
                                        seed=3, stop_on_eos=False)
    assert result.stats.rounds > 0
