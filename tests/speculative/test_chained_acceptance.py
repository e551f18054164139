"""The fixture's expected acceptance, stated and checked.

For prompt (5, 9, 3) and 40 new tokens (fixtures.definition, default deviation positions
{4, 7, 8, 13, 17, 18, 19, 25, 31, 36, 40, 41, 47, 52, 58, 61}), the reference trace gives:

    k   rounds  first draft accepted   mean accepted length a_r   greedy steps
    1     22        16/22 = 72.7 %          19/11 = 1.73               1
    2     17        12/17 = 70.6 %          38/17 = 2.24               1
    4     13         8/13 = 61.5 %          38/13 = 2.92               1
    8     11         8/11 = 72.7 %          38/11 = 3.45               1

A first draft is rejected only when the pending token's position is a deviation position;
every miswired chain (see test_chained_plants.py) scores 0 first-draft acceptance and a mean
accepted length of exactly 1.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT, reference_trace

STATED = {  # k -> (rounds, rounds with a_r >= 2, sum of a_r)
    1: (22, 16, 38),
    2: (17, 12, 38),
    4: (13, 8, 38),
    8: (11, 8, 38),
}


@pytest.mark.parametrize("k", sorted(STATED))
def test_reference_trace_has_the_stated_acceptance(k):
    trace = reference_trace(PROBE_PROMPT, k, MAX_NEW)
    rounds, first_accepted, total = STATED[k]
    pairs = trace.pairs()
    assert len(pairs) == rounds
    assert sum(a >= 2 for _, a in pairs) == first_accepted
    assert sum(a for _, a in pairs) == total
    # 1 (prefill) + sum a_r + greedy steps = the budget
    assert 1 + total + len(trace.rounds) - rounds == MAX_NEW


@pytest.mark.parametrize("dtype", ("float32", "float16"))
@pytest.mark.parametrize("k", sorted(STATED))
def test_runtime_reaches_the_stated_acceptance(recorded, dtype, k):
    stats = recorded(PROBE_PROMPT, k, dtype).stats
    rounds, first_accepted, total = STATED[k]
    assert (stats.rounds, stats.rounds_with_first_draft_accepted) == (rounds, first_accepted)
    assert Fraction(sum(a for _, a in stats.trace), stats.rounds) == Fraction(total, rounds)
    # "High when wired right": most rounds confirm the first draft, and every round yields
    # well over one token per verification pass.
    assert stats.rounds_with_first_draft_accepted / stats.rounds > 0.6
    assert stats.mean_accepted_length >= 1.7
    assert stats.acceptance_by_position[0] == first_accepted / rounds
