"""E3, E4 and E6 on the real runtime: chain-context equivalence, the accounting identities of
evidence.md §2, the cells' extents after every step, what each drafter step is fed, and the
embedding table read once per runtime.

The planted-defect tests (test_chained_plants.py) show that each check here fails when its
defect is planted.
"""

from __future__ import annotations

import pytest
from chain_helpers import (
    MAX_NEW,
    PROBE_PROMPT,
    PROMPTS,
    WIDTHS,
    check_carry_chain,
    check_cell_extents,
    check_e3,
    check_e6_leading_segment,
    check_fixed_bindings,
    check_identities,
    run_recorded,
)

import speculant

DTYPES = ("float32", "float16")
E3_PROMPTS = (PROBE_PROMPT, (7, 8, 9, 10, 11, 12))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_e3_drafts_equal_the_chain_of_a_fresh_pass(recorded, dtype, k):
    """Every round's drafts (taken with keep = a from the verification pass) equal the
    drafts of a chain whose context is a fresh pass over x[0..C') with keep = C', run by
    the runtime's proposer and by the numpy reference chain."""
    runs = [recorded(prompt, k, dtype) for prompt in E3_PROMPTS]
    proposals = [p for rec in runs for p in rec.proposals]
    # Chain contexts of every kind: after prefill, after a rejection (keep = a < n) and
    # after a fully accepted block (keep = n > 1; at k = 8 the fixture's deviation positions
    # never leave 9 ordinary positions in a row before the budget caps k_r).
    assert any(p.latest_start == 0 for p in proposals)
    assert any(p.keep < p.latest_tokens for p in proposals)
    if k <= 4:
        assert any(p.latest_start > 0 and p.keep == p.latest_tokens > 1 for p in proposals)
    for rec in runs:
        check_e3(rec)


@pytest.mark.parametrize("fmt", ("onnx", "textproto"))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_accounting_identities(recorded, dtype, fmt, k):
    """evidence.md §2 on every run, reconstructed from the passes the state advanced over
    and the proposer invocations seen at the session; residency counters stay 0 on CPU."""
    for prompt in PROMPTS:
        check_identities(recorded(prompt, k, dtype, fmt))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", WIDTHS)
def test_cell_extents_equal_consumed_after_every_step(recorded, dtype, k):
    """After prefill, every greedy step and every round, each cell holds exactly C'
    positions, and the C' sequence is the reference's."""
    for prompt in PROMPTS:
        check_cell_extents(recorded(prompt, k, dtype))


def test_accounting_identities_without_a_proposer(pair_engine, monkeypatch):
    with monkeypatch.context() as mp:
        rec = run_recorded(pair_engine(), mp, PROBE_PROMPT)
    check_identities(rec)
    check_cell_extents(rec)
    assert rec.stats.greedy_steps == MAX_NEW - 1 and rec.stats.rounds == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_e6_fused_leading_segment_is_the_once_scaled_row(recorded, dtype):
    """E6: what the drafter session receives starts with scale * table[token] exactly, in
    the currency, for s, p and every draft fed back."""
    for k in (1, 4, 8):
        check_e6_leading_segment(recorded(PROBE_PROMPT, k, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_carry_is_chained_from_the_target_seed(recorded, dtype):
    """Step 0 is fed the target's hidden row at C'-1 given x[0..C'); step j the folded carry
    step j-1 produced (the bootstrap step runs)."""
    for k in (1, 4, 8):
        check_carry_chain(recorded(PROBE_PROMPT, k, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_bindings_are_the_rolled_back_cells(recorded, dtype):
    """Every step: position id C'-1, mask extent C', borrowed caches = the cache of x[0..C')."""
    for k in (1, 4, 8):
        check_fixed_bindings(recorded(PROBE_PROMPT, k, dtype))


def test_embedding_table_read_once_per_runtime(pair_root):
    """Not at load; once at the first proposal; never again, whatever is generated next."""
    engine = speculant.load(pair_root())
    counters = engine.seam.counters
    assert counters.embedding_table_reads == 0
    engine.generate(list(PROBE_PROMPT), 10)  # no proposer: no read
    assert counters.embedding_table_reads == 0
    for k in (1, 4, 8, 2):
        for prompt in PROMPTS[:3]:
            result = engine.generate(list(prompt), 20, speculative=True, k=k)
            assert result.stats.residency["embedding_table_reads"] == 1
    engine.generate(list(PROBE_PROMPT), 10)
    assert counters.embedding_table_reads == 1
    assert counters.embedding_table_mirrors == 0  # CPU: the host table is the chain's
