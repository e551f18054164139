"""speculant driving static caches (docs/design/static-cache.md, *Driving*): the same tokens
as the appended form, speculative == greedy for every proposer and k, the buffers allocated
once and bound as past and present, the drafter reading them in place, rollback moving no
byte (and the appended form's truncation bytes counted)."""

from __future__ import annotations

import pytest

import speculant
from export.export_models import CONFIG

PROMPT = [7, 3, 41, 12, 25, 9, 7, 3, 41, 12]  # repeats: prompt lookup finds drafts
NEW = 24
KS = (1, 2, 4, 8)


def generate(root, draft=None, **options):
    engine = speculant.load(root, draft=draft, threads=1)
    return engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False, **options)


@pytest.fixture(scope="module")
def static_root(pairs):
    return pairs["scatter-float32", "static"]


@pytest.fixture(scope="module")
def greedy_tokens(pairs):
    return generate(pairs["scatter-float32", "appended"]).token_ids


@pytest.mark.parametrize("form", ["scatter-float32", "gqa-float32", "gqa-float16"])
def test_static_greedy_equals_appended_greedy(pairs, form):
    static = generate(pairs[form, "static"])
    assert static.token_ids == generate(pairs[form, "appended"]).token_ids
    assert len(static.token_ids) == NEW


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("proposer", ["chained", "draft", "prompt_lookup", "lookup_chained"])
def test_speculative_equals_greedy_on_static_caches(pairs, draft_packages, static_root,
                                                    greedy_tokens, proposer, k):
    """Token for token the appended greedy decode, with the same rounds as the appended
    pair's speculative decode (so the drafter reads the right caches), and rollback by
    length: zero bytes moved."""
    draft = draft_packages["static"] if proposer == "draft" else None
    static = generate(static_root, draft, proposer=proposer, k=k)
    assert static.token_ids == greedy_tokens
    appended = generate(pairs["scatter-float32", "appended"],
                        draft_packages["appended"] if draft else None, proposer=proposer, k=k)
    assert static.stats.trace == appended.stats.trace
    assert static.stats.rollback_bytes_moved == 0
    if proposer != "prompt_lookup":
        assert static.stats.rounds > 0 and static.stats.rollbacks > 0


def test_rollback_moves_bytes_only_in_the_appended_form(pairs, draft_packages):
    """The appended form's truncations are strided copies of the kept positions: counted."""
    appended = generate(pairs["scatter-float32", "appended"], proposer="chained", k=4)
    assert appended.stats.rollbacks > 0 and appended.stats.rollback_bytes_moved > 0
    draft = generate(pairs["scatter-float32", "appended"], draft_packages["appended"],
                     proposer="draft", k=4)
    static_draft = generate(pairs["scatter-float32", "static"], draft_packages["static"],
                            proposer="draft", k=4)
    assert draft.stats.rollback_bytes_moved > 0 and static_draft.stats.rollback_bytes_moved == 0


@pytest.mark.parametrize("proposer", [None, "chained", "draft", "prompt_lookup"])
@pytest.mark.parametrize("form", ["scatter-float32", "gqa-float32"])
def test_sampling_on_static_caches_equals_the_appended_form(pairs, draft_packages, form,
                                                            proposer):
    options = dict(temperature=0.9, seed=11)
    if proposer is not None:
        options.update(proposer=proposer, k=4)
    draft = proposer == "draft"
    static = generate(pairs[form, "static"], draft_packages["static"] if draft else None,
                      **options)
    appended = generate(pairs[form, "appended"], draft_packages["appended"] if draft else None,
                        **options)
    assert static.token_ids == appended.token_ids
    assert static.stats.trace == appended.stats.trace
    assert static.stats.sampled_rows > 0 and static.stats.rollback_bytes_moved == 0


def test_buffers_are_allocated_once_and_bound_as_past_and_present(static_root):
    """The decode state's buffers stay the same objects from admission to the end; each
    width's plan binds them as the past and the present; the drafter's plan binds the last
    layer's as its shared_kv (the same memory)."""
    engine = speculant.load(static_root, threads=1)
    decode = engine.decode(PROMPT, max_new_tokens=NEW, stop_on_eos=False, proposer="chained",
                           k=4)
    cells = decode.state.cells
    buffers = dict(cells)
    assert cells.capacity >= len(PROMPT) + NEW + 4 + 1  # rounded up by the engine's pool
    list(decode)
    assert decode.state.cells is cells and all(cells[n] is b for n, b in buffers.items())
    assert {b.shape for b in buffers.values()} == {
        (1, CONFIG.num_key_value_heads, cells.capacity, CONFIG.head_dim)}
    widths = {k_r + 1 for k_r, _ in decode.stats.trace} | (
        {1} if decode.stats.greedy_steps else set())  # a greedy step: the pending token alone
    assert set(cells.plans) == widths  # the prefill's plan is one-off: not kept
    for plan in cells.plans.values():
        for i in range(2):
            for part in ("key", "value"):
                assert plan.inputs[f"past_key_values.{i}.{part}"] is cells[f"kv.{i}.{part}"]
                assert plan.outputs[f"present.{i}.{part}"] is cells[f"kv.{i}.{part}"]
    steps = cells.chain_steps  # one plan per step index, after one checked run
    assert steps is not None
    assert sum(p.num_runs for p in steps.plans) == decode.stats.proposer_invocations
    assert len(steps.plans) == 5  # steps 0 … 4 at k = 4
    for plan in steps.plans:
        for part in ("key", "value"):
            assert plan.inputs[f"shared_kv.{part}"] is cells[f"kv.1.{part}"]


def test_slots_past_the_length_are_never_read(static_root, greedy_tokens):
    """Buffers filled with 7.0 before the prefill: the same tokens, the same rounds."""
    engine = speculant.load(static_root, threads=1)
    zeros = engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False,
                            proposer="chained", k=4)
    decode = engine.decode(PROMPT, max_new_tokens=NEW, stop_on_eos=False, proposer="chained",
                           k=4)
    for buffer in decode.state.cells.values():
        buffer.data[...] = 7.0
    list(decode)
    assert decode.result.token_ids == zeros.token_ids == greedy_tokens
    assert decode.stats.trace == zeros.stats.trace
