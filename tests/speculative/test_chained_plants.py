"""The planted-defect table of evidence.md §3: every defect, planted with ``monkeypatch`` or a
fixture variant, makes the named checks fail, while the real runtime passes them.

Each test runs the real runtime and the planted one on the same prompt and width, then
evaluates the checks *after* the plant is removed (so the oracles are the real ones). The
checks are the ones test_chained_equality.py and test_chained_evidence.py run on every
width, dtype and format: a defect in the runtime fails those tests.

Most plants leave the committed stream intact (verification only ever commits the target's
tokens): that is asserted too, as the reason token equality alone proves nothing about the
chain.
"""

from __future__ import annotations

import pytest
from chain_helpers import (
    PROBE_PROMPT,
    check_carry_chain,
    check_cell_extents,
    check_e3,
    check_e6_leading_segment,
    check_exact_trace,
    check_fixed_bindings,
    check_identities,
    check_tokens_equal_greedy,
    fails,
    first_draft_acceptance,
    plant_borrowed_cache,
    plant_generic_borrowed_binding,
    plant_rollback_length,
    plant_skipped_bootstrap,
    plant_table_scale,
    plant_unchained_carry,
    plant_unseeded_controls,
    run_recorded,
)

import speculant
from builders import UNK_ID
from speculant.errors import AdmissionError, ChainError, ContractError, RequestError

K = 4


@pytest.fixture
def real(recorded):
    """The real run every plant is compared with; it passes every check."""
    rec = recorded(PROBE_PROMPT, K)
    for check in (check_exact_trace, check_e3, check_e6_leading_segment, check_carry_chain,
                  check_fixed_bindings, check_identities, check_cell_extents):
        check(rec)
    assert first_draft_acceptance(rec) > 0.6
    return rec


def assert_acceptance_collapsed(planted, real) -> None:
    """The drafter answers its designated wrong token: no first draft is ever confirmed."""
    assert planted.stats.rounds_with_first_draft_accepted == 0 < \
        real.stats.rounds_with_first_draft_accepted
    assert planted.stats.mean_accepted_length == 1.0
    assert planted.stats.trace != real.stats.trace
    check_tokens_equal_greedy(planted, real.tokens)  # the stream cannot see it


# -- borrowed KV cache --------------------------------------------------------------------
@pytest.mark.parametrize("how", ["incoming", "empty"])
def test_planted_stale_borrowed_cache(pair_engine, monkeypatch, real, how):
    """Borrowed caches bound to the pass's incoming cache (one round stale, empty after
    prefill) or to zeros, at the right extent: first-draft acceptance collapses, the exact
    trace and E3 fail."""
    with monkeypatch.context() as mp:
        plant_borrowed_cache(mp, how)
        planted = run_recorded(pair_engine(), mp, PROBE_PROMPT, K)
    assert {d for p in planted.proposals for d in p.drafts} == {UNK_ID}
    assert_acceptance_collapsed(planted, real)
    assert fails(check_exact_trace, planted)
    assert fails(check_e3, planted)
    assert fails(check_fixed_bindings, planted)


def test_borrowed_cache_from_the_declared_request_binding_fails_closed(pair_root, monkeypatch):
    """A package that binds the drafter's caches to the incoming request caches (as packages
    in circulation do). The runtime ignores that binding and still matches the reference;
    bound from ``latest.values[value_name]`` instead, the cache (extent C0) cannot be cut to
    C' and the proposal is refused with a ChainError naming the port."""
    engine = speculant.load(pair_root(borrowed_binding="past"))
    with monkeypatch.context() as mp:
        honest = run_recorded(engine, mp, PROBE_PROMPT, K)
    check_exact_trace(honest)
    check_e3(honest)
    with monkeypatch.context() as mp:
        plant_generic_borrowed_binding(mp, engine)
        planted = run_recorded(engine, mp, PROBE_PROMPT, K, catch=(ChainError,))
    assert isinstance(planted.error, ChainError)
    assert "shared_kv.attention.key" in str(planted.error)
    assert "request.past.key" in str(planted.error)
    assert planted.proposals == []  # refused at the first proposal, nothing drafted


def test_declared_present_binding_cut_to_kappa_equals_the_cells(pair_engine, monkeypatch, real):
    """Why the plant above needs the request binding: with the §8.2 binding (the target's
    present outputs), cutting the latest pass's present to C' *is* the rolled-back cell, so
    the generic path happens to be right. Documents the equivalence the runtime relies on
    for nothing (it always binds the cells)."""
    engine = pair_engine()
    with monkeypatch.context() as mp:
        plant_generic_borrowed_binding(mp, engine)
        generic = run_recorded(engine, mp, PROBE_PROMPT, K)
    assert generic.stats.trace == real.stats.trace
    check_fixed_bindings(generic)


# -- embedding scale ------------------------------------------------------------------------
@pytest.mark.parametrize("times", [0, 2], ids=["unscaled", "scaled_twice"])
def test_planted_embedding_scale(pair_root, monkeypatch, real, times):
    """The table fed unscaled or scaled twice: the drafter's band check fails, acceptance
    collapses, E6's leading-segment check and the exact trace fail."""
    with monkeypatch.context() as mp:
        plant_table_scale(mp, times)
        planted = run_recorded(speculant.load(pair_root()), mp, PROBE_PROMPT, K)
    assert_acceptance_collapsed(planted, real)
    assert fails(check_e6_leading_segment, planted)
    assert fails(check_exact_trace, planted)
    assert fails(check_e3, planted)


def test_undeclared_scale_variant_collapses(pair_root, monkeypatch, real):
    """The same defect from the package side: ``token_embedding.scale`` not declared, so
    the runtime feeds the stored rows."""
    engine = speculant.load(pair_root(declare_scale=False))
    assert engine.package.plan.chain.scale is None
    with monkeypatch.context() as mp:
        planted = run_recorded(engine, mp, PROBE_PROMPT, K)
    assert_acceptance_collapsed(planted, real)
    assert fails(check_e6_leading_segment, planted)


# -- carry ----------------------------------------------------------------------------------
def test_planted_unchained_carry(pair_engine, monkeypatch, real):
    """Every step fed carry_0: the carry check fails from the first real draft on."""
    with monkeypatch.context() as mp:
        plant_unchained_carry(mp)
        planted = run_recorded(pair_engine(), mp, PROBE_PROMPT, K)
    assert_acceptance_collapsed(planted, real)
    assert fails(check_exact_trace, planted)
    assert fails(check_e3, planted)
    assert fails(check_carry_chain, planted)
    check_e6_leading_segment(planted)  # the embedding half is still right


def test_planted_skipped_bootstrap(pair_engine, monkeypatch, real):
    """The first step embeds p with carry_0 and is taken as d_1: k invocations instead of
    k + 1, acceptance collapses, the trace, E3 and the invocation identity fail."""
    with monkeypatch.context() as mp:
        plant_skipped_bootstrap(mp)
        planted = run_recorded(pair_engine(), mp, PROBE_PROMPT, K)
    assert_acceptance_collapsed(planted, real)
    assert fails(check_exact_trace, planted)
    assert fails(check_e3, planted)
    assert fails(check_identities, planted)
    assert fails(check_e6_leading_segment, planted)


# -- rollback length ------------------------------------------------------------------------
@pytest.mark.parametrize("delta", [1, -1], ids=["C+a+1", "C+a-1"])
def test_planted_rollback_length_breaks_equality(pair_engine, monkeypatch, real, delta):
    """The loop believes C' = C + a + delta after a rejection (cells cut there and the next
    pass starts there): the target reads the wrong previous token, the tokens differ from
    greedy (E1) and the cell-extent check fails."""
    with monkeypatch.context() as mp:
        plant_rollback_length(mp, delta, cut_only=False)
        planted = run_recorded(pair_engine(), mp, PROBE_PROMPT, K)
    assert planted.tokens != real.tokens
    assert fails(check_tokens_equal_greedy, planted, real.tokens)
    assert fails(check_cell_extents, planted)
    assert fails(check_exact_trace, planted)


@pytest.mark.parametrize("delta", [1, -1], ids=["C+a+1", "C+a-1"])
def test_planted_rollback_cut_only_is_refused(pair_engine, monkeypatch, real, delta):
    """Cells cut to C + a + delta while the state says C + a: the cell-extent check fails
    at the first rejection, and the next proposal's invocation-scope check refuses the
    mismatch between mask (C') and borrowed cache with a ContractError naming the symbol."""
    with monkeypatch.context() as mp:
        plant_rollback_length(mp, delta, cut_only=True)
        planted = run_recorded(pair_engine(), mp, PROBE_PROMPT, K, catch=(ContractError,))
    assert isinstance(planted.error, ContractError)
    assert "kv_sequence" in str(planted.error)
    assert fails(check_cell_extents, planted)
    assert fails(check_tokens_equal_greedy, planted, real.tokens)


# -- currency -------------------------------------------------------------------------------
def test_float16_table_against_float32_currency_is_refused_at_load(pair_root):
    root = pair_root(variant="mixed_currency")
    with pytest.raises(AdmissionError) as caught:
        speculant.load(root)
    message = str(caught.value)
    assert "float16" in message and "float32" in message
    assert "speculative.proposal_execution.token_embedding.table" in caught.value.paths


# -- serving controls -----------------------------------------------------------------------
def test_planted_unseeded_controls(pair_engine, monkeypatch):
    """Controls declared required with no default: generate succeeds without them. With
    admission not seeding them they are ordinary required inputs and the request fails."""
    engine = pair_engine()
    inputs = engine.package.document.workflow.inputs
    for control, name in engine.package.plan.serving.items():
        assert inputs[name].required and inputs[name].default is None, control
    assert engine.generate(list(PROBE_PROMPT), 8, speculative=True, k=K).token_ids
    with monkeypatch.context() as mp:
        plant_unseeded_controls(mp, engine)
        with pytest.raises(RequestError) as caught:
            engine.generate(list(PROBE_PROMPT), 8, speculative=True, k=K)
    assert "missing required input 'request.active'" in str(caught.value)
