"""The step's width by load (speculative/step_width.py, docs/design/batching.md "k by load"):
the rule on literal numbers, the costs it reads, exploration of unmeasured (B, W) cells
(at once for the chosen width, spaced and bounded for the others), probes, and which
policies the step chooses for. No model: the scheduler's end-to-end check is in
test_scheduler.py."""

from __future__ import annotations

import pytest

from speculant.speculative.step_width import (
    EXPLORE_EVERY,
    STALE_STEPS,
    RowWidth,
    StepCosts,
    StepRows,
    StepWidth,
    best_width,
    step_rates,
)
from speculant.speculative.width import (
    MAX_PROBE_EVERY,
    PROBE_EVERY,
    FixedWidth,
    MeasuredWidth,
    WidthCosts,
    expected_tokens,
)
from speculant.workflow.state import RoundResult


def rows_of(num_rows: int, acceptance: float = 0.9, cap: int = 3) -> StepRows:
    return StepRows.of([([acceptance] * cap, cap, [0.0] * (cap + 1))] * num_rows)


def test_the_step_rate_sums_each_rows_expected_tokens_over_one_pass_and_the_proposals():
    rows = StepRows.of([([0.5, 0.5, 0.5], 2, [0.0, 0.1, 0.2]), ([1.0], 1, [0.0, 0.3])])
    # W = 3: row 0 drafts 2 (E = 1.75), row 1 its cap 1 (E = 2); 1.0 + 0.2 + 0.3 + 0.5;
    # W = 1: greedy, no proposal; W = 4: row 0 still at its cap 2
    rates = step_rates(rows, range(1, 5), [1.0, 1.0, 1.0, 1.0], 0.5)
    assert rates.tolist() == pytest.approx([2 / 1.5, 3.5 / 1.9, 3.75 / 2.0, 3.75 / 2.0])
    assert step_rates(rows, range(2, 3), [0.0], 0.0).tolist() == [pytest.approx(3.5 / 0.4)]
    assert step_rates(rows_of(1), range(1, 2), [0.0], 0.0).tolist() == [float("inf")]


def test_a_pass_nearly_flat_in_w_picks_the_widest_and_a_steep_one_a_greedy_step():
    rows = rows_of(2)
    assert best_width(rows, range(1, 5), [1.0, 1.1, 1.2, 1.3], 0.0) == 4
    assert best_width(rows, range(1, 5), [1.0, 2.0, 3.0, 4.0], 0.0) == 1
    # W = 2: 2 * 1.9 / 1.5 = 2.53 beats W = 1 (2) and W = 3 (2 * 2.71 / 2.5 = 2.17)
    assert best_width(rows, range(1, 5), [1.0, 1.5, 2.5, 3.5], 0.0) == 2


def test_ties_go_to_the_narrower_width_and_no_auto_row_runs_the_narrowest():
    assert best_width(rows_of(1, acceptance=0.0), range(1, 4), [1.0] * 3, 0.0) == 1
    assert best_width(StepRows.of([]), range(3, 6), [1.0, 1.0, 1.0], 0.0) == 3


def test_more_rows_make_the_same_widening_pay_less():
    """A wider pass that costs more with more rows: speculation narrows as the batch fills."""
    slope = {1: 0.02, 4: 0.8, 16: 1.6}  # seconds per extra token of width, per B
    chosen = {b: best_width(rows_of(b), range(1, 5), [1.0 + slope[b] * (w - 1)
                                                      for w in range(1, 5)], 0.0)
              for b in slope}
    assert chosen == {1: 4, 4: 2, 16: 1}


def test_an_unmeasured_cell_is_read_off_its_rows_line_and_never_below_a_measured_lower_bound():
    costs = StepCosts()
    costs.observe_pass(2, 1, 1.0)
    costs.observe_pass(2, 3, 3.0)
    costs.observe_pass(4, 1, 5.0)
    assert costs.pass_seconds(2, range(1, 5)) == pytest.approx([1.0, 2.0, 3.0, 4.0])
    # B = 3: no cell measured; the nearest B (2, fewer rows on the tie with 4) read off
    assert costs.pass_seconds(3, range(1, 3)) == pytest.approx([1.0, 2.0])
    # B = 4: its one cell flat, never below B = 2's W = 3 at W >= 3
    assert costs.pass_seconds(4, range(1, 4)) == pytest.approx([5.0, 5.0, 5.0])
    assert costs.lower_bound(4, 3) == 5.0 and costs.lower_bound(3, 2) == 1.0
    assert costs.lower_bound(1, 4) == 0.0  # nothing of B <= 1 measured
    assert StepCosts().pass_seconds(1, range(1, 3)) == [1.0, 1.0]  # nothing: all alike


def auto_rows(step: StepWidth, num_rows: int, cap: int = 3, proposer=None,
              kind: str = "prompt_lookup") -> list[tuple[RowWidth, int, object]]:
    """``num_rows`` k="auto" rows of ``step``: (policy, cap, proposer)."""
    return [(RowWidth(cap, kind, step), cap, proposer) for _ in range(num_rows)]


def test_the_chosen_width_unmeasured_is_run_at_once_then_others_explored_spaced_and_bounded():
    step = StepWidth()
    step.costs.observe_pass(1, 1, 1.0)
    rows = auto_rows(step, 1)
    rows[0][0].controller.acceptance[:] = [0.9, 0.9, 0.9]
    assert step.choose(rows, 1) == 4  # W = 4 looks as cheap as W = 1: run, so measured
    assert step.k == 3
    step.costs.observe_pass(1, 4, 4.0)  # dear: the line says W = 2, 3 cost 2 and 3
    chosen = []
    for _ in range(4 * EXPLORE_EVERY):
        width = step.choose(rows, 1)
        chosen.append(width)
        if width != 1:
            step.costs.observe_pass(1, width, {2: 2.5, 3: 3.5}[width])
    # W = 2 and 3 might beat W = 1 at their lower bounds (1.0, then 2.5): each explored
    # once, EXPLORE_EVERY steps apart
    assert [i for i, w in enumerate(chosen) if w != 1] == [0, EXPLORE_EVERY]
    assert sorted(w for w in chosen if w != 1) == [2, 3]
    assert all(step.costs.is_measured(1, w) for w in range(1, 5))


def test_a_width_that_cannot_beat_the_choice_even_at_its_lower_bound_is_not_explored():
    step = StepWidth()
    step.costs.observe_pass(1, 1, 1.0)
    step.costs.observe_pass(1, 2, 10.0)
    rows = auto_rows(step, 1, cap=2)
    row = rows[0][0]
    row.controller.acceptance[:] = [0.01, 0.01]  # W = 3: 1.0101 tokens at >= 10 s
    assert [step.choose(rows, 1) for _ in range(2 * EXPLORE_EVERY)] == [1] * 2 * EXPLORE_EVERY


def test_a_greedy_run_probes_one_draft_per_row_after_the_priced_interval():
    step = StepWidth()
    for width, seconds in ((1, 1.0), (2, 1.0 + 0.02 * 20), (3, 100.0), (4, 100.0)):
        step.costs.observe_pass(2, width, seconds)
    rows = auto_rows(step, 2)
    for policy, _, _ in rows:
        policy.controller.acceptance[:] = [0.1, 0.1, 0.1]
    chosen = [step.choose(rows, 2) for _ in range(3 * MAX_PROBE_EVERY)]
    probes = [i for i, w in enumerate(chosen) if w == 2]
    assert set(chosen) == {1, 2} and len(probes) >= 2
    gaps = {b - a for a, b in zip(probes, probes[1:], strict=False)}
    assert gaps == {20}  # a probe's extra 0.4 s kept to 2 % of 20 greedy steps' 1 s each
    assert PROBE_EVERY <= 20 <= MAX_PROBE_EVERY


def test_fixed_rows_bound_the_width_from_below_and_auto_rows_draft_up_to_it():
    step = StepWidth()
    for width in range(1, 5):
        step.costs.observe_pass(2, width, float(width))  # steep: auto alone would be greedy
    fixed = FixedWidth(2)
    auto, cap, _ = auto_rows(step, 1)[0]
    assert step.choose([(fixed, 2, None), (auto, cap, None)], 2) == 3
    assert auto.width(None, cap) == 2 and auto.width(None, 1) == 1  # its cap still binds
    assert step.choose([(fixed, 0, None), (auto, cap, None)], 2) == 1  # the fixed row capped
    assert step.choose([(fixed, 2, None), (FixedWidth(0), 0, None)], 2) == 3  # no auto row


def test_a_measured_policy_becomes_a_row_of_the_step_and_a_fixed_one_stays():
    step = StepWidth()
    measured = MeasuredWidth(3, "draft", WidthCosts(), target=None)
    row = step.row_policy(measured)
    assert isinstance(row, RowWidth) and row.kind == "draft" and row.widths == range(0, 4)
    fixed = FixedWidth(2)
    assert step.row_policy(fixed) is fixed


def test_a_row_observes_its_acceptance_and_times_proposals_after_a_widths_first():
    step = StepWidth()
    row = RowWidth(2, "draft", step)
    row.observe(RoundResult(2, 3, [5, 6, 7], None))  # both drafts accepted
    assert row.controller.acceptance[0] > 0.6 and row.controller.acceptance[1] > 0.6
    row.proposed(2, 0.5)  # its first proposal of 2: may make a plan
    assert "draft" not in step.costs.propose
    row.proposed(2, 0.2)
    row.proposed(0, 0.0)
    assert step.costs.propose["draft"].seconds == {2: 0.2}
    assert step.costs.propose_seconds("draft", 2) == pytest.approx([0.0, 0.1, 0.2])


def test_a_pass_is_priced_by_the_rows_it_runs_and_the_time_outside_by_the_rows_in_the_step():
    step = StepWidth()
    rows = auto_rows(step, 3)
    step.choose(rows, 4)
    rows[0][0].proposed(1, 0.1)
    rows[0][0].proposed(1, 0.1)
    step.observe_step(3, 4, 2, 0.5, 1.0, is_decoding=True)  # 1.0 - 0.5 - 0.2 outside
    assert step.costs.outside.seconds == {3: pytest.approx(0.3)}
    assert step.costs.passes == {4: step.costs.passes[4]}
    assert step.costs.passes[4].seconds == {2: 0.5}
    step.observe_step(3, 4, 5, None, 9.0, is_decoding=True)  # its plan made in it: not timed
    step.observe_step(2, 2, 5, 0.7, 9.0, is_decoding=False)  # a prefill step: its pass alone
    assert step.costs.passes[2].seconds == {5: 0.7} and set(step.costs.outside.seconds) == {3}


class Together:
    """A proposer that drafts the step's rows together (a RowsProposer's methods)."""

    def propose(self, state, k):
        raise AssertionError("not called by the rule")

    def propose_rows(self, requests):
        raise AssertionError("not called by the rule")


def test_rows_drafted_together_are_priced_once_per_step_at_their_widest_draft():
    rows = StepRows.of([([0.9] * 3, 3, [0.0] * 4), ([0.9] * 3, 1, [0.0] * 4)],
                       groups=[(3, [0.0, 1.0, 2.0, 3.0])])
    _, proposing = rows.totals(range(1, 6))
    assert proposing.tolist() == [0.0, 1.0, 2.0, 3.0, 3.0]  # once, however many rows
    step = StepWidth()
    for width in range(1, 5):
        step.costs.observe_pass(2, width, 1.0)  # the pass flat in W
    for k in (1, 2, 3):
        step.costs.observe_proposal("chained", k, float(k), is_together=True)
    # W = 4 (the prior acceptance, 0.6) were the drafting free; at k s a draft it does not pay
    assert step.choose(auto_rows(step, 2, kind="chained"), 2) == 4
    assert step.choose(auto_rows(step, 2, proposer=Together(), kind="chained"), 2) == 1


def test_a_together_drafting_is_timed_by_kind_and_widest_k_after_its_first():
    step = StepWidth()
    rows = auto_rows(step, 2, proposer=Together())
    step.choose(rows, 2)
    drafted = [(rows[0][0], 2), (rows[1][0], 1)]
    step.drafted_together(drafted, 0.9)  # the first run of (kind, 2): not a measurement
    assert step.costs.propose_rows == {}
    step.drafted_together(drafted, 0.4)
    assert step.costs.propose_rows["prompt_lookup"].seconds == {2: 0.4}
    step.drafted_together([(rows[0][0], 2), (FixedWidth(2), 2)], 5.0)  # not all auto rows
    step.drafted_together([], 5.0)
    assert step.costs.propose_rows["prompt_lookup"].seconds == {2: 0.4}
    step.observe_step(2, 2, 3, 0.5, 2.0, is_decoding=True)  # 2.0 - 0.5 - 0.9 - 0.4 outside
    assert step.costs.outside.seconds == {2: pytest.approx(0.2)}


def test_expected_tokens_at_each_rows_width_is_the_batch_1_rule():
    rows = StepRows.of([([0.5, 0.8, 0.3], 3, [0.0] * 4)])
    assert rows.tokens[0].tolist() == pytest.approx([expected_tokens([0.5, 0.8, 0.3], k)
                                                     for k in range(4)])


def test_a_draft_the_proposer_did_not_make_counts_as_rejected_at_its_position():
    step = StepWidth()
    step.k = 3  # the step's width W = 4
    row = RowWidth(3, "prompt_lookup", step)
    assert row.width(None, 5) == 3  # type: ignore[arg-type]  # asked for three drafts
    row.observe(RoundResult(0, 1, [5], None))  # no match: none proposed, the pass paid
    assert row.controller.acceptance[0] < 0.6  # the prior, lowered
    assert row.controller.acceptance[1:] == [0.6, 0.6]  # not reached
    row.width(None, 5)  # type: ignore[arg-type]
    row.observe(RoundResult(1, 2, [5, 6], None))  # one of three made, and accepted
    assert row.controller.acceptance[1] < 0.6  # the second, never made: rejected
    step.k = 0
    row.width(None, 5)  # type: ignore[arg-type]  # a greedy step: nothing asked
    before = list(row.controller.acceptance)
    row.observe(RoundResult(0, 1, [5], None))
    assert row.controller.acceptance == before


def test_a_new_row_starts_from_its_kinds_pooled_acceptance_not_the_prior():
    step = StepWidth()
    fresh = step.row_policy(MeasuredWidth(3, "prompt_lookup", WidthCosts(), target=None))
    assert fresh.controller.acceptance == [0.6, 0.6, 0.6]  # nothing pooled yet: the prior
    step.k = 3
    for _ in range(30):  # rows of the kind reject their first draft, round after round
        row = RowWidth(3, "prompt_lookup", step)
        row.width(None, 3)  # type: ignore[arg-type]
        row.observe(RoundResult(3, 1, [5], None))
    joining = step.row_policy(MeasuredWidth(3, "prompt_lookup", WidthCosts(), target=None))
    assert joining.controller.acceptance[0] < 0.1  # priced as its kind does, so W = 1
    assert joining.controller.acceptance[1:] == [0.6, 0.6]  # never reached
    assert best_width(StepRows.of([(joining.controller.acceptance, 3, [0.0] * 4)]),
                      range(1, 5), [1.0, 1.5, 2.0, 2.5], 0.0) == 1
    other = step.row_policy(MeasuredWidth(2, "draft", WidthCosts(), target=None))
    assert other.controller.acceptance == [0.6, 0.6]  # another kind: its own pool


def test_a_wider_pass_measured_cheaper_than_a_narrower_one_is_priced_at_the_narrower():
    costs = StepCosts()
    for width, seconds in ((1, 1.0), (4, 2.2), (5, 2.0)):  # W = 5's one run: noise
        costs.observe_pass(8, width, seconds)
    assert costs.pass_seconds(8, range(4, 6)) == pytest.approx([2.2, 2.2])
    costs.observe_pass(2, 1, 3.0)  # fewer rows measured dearer: a floor for more rows
    assert costs.pass_seconds(8, range(1, 2)) == pytest.approx([3.0])


def test_a_slow_first_measurement_is_explored_again_once_stale_and_replaced():
    """One pass measured slow (a busy host) keeps its width from being chosen, so from being
    measured again; once STALE_STEPS old it is explored at its lower bound (every other
    stale width too, EXPLORE_EVERY steps apart) and its new measurement replaces the old
    instead of being averaged in."""
    step = StepWidth()
    true_seconds = {1: 1.0, 2: 1.1, 3: 1.2}
    for width, seconds in ((1, 1.0), (2, 1.1), (3, 9.0)):  # W = 3 measured once, slow
        step.costs.observe_pass(1, width, seconds, step.num_steps)
    rows = auto_rows(step, 1, cap=2)
    rows[0][0].controller.acceptance[:] = [0.9, 0.9]
    chosen = []
    for _ in range(STALE_STEPS + 3 * EXPLORE_EVERY):
        chosen.append(width := step.choose(rows, 1))
        step.costs.observe_pass(1, width, true_seconds[width], step.num_steps)
    assert set(chosen[:STALE_STEPS]) == {2}  # W = 3 looks dear: not chosen, not explored
    assert 3 in chosen[STALE_STEPS:] and step.costs.passes[1].seconds[3] == 1.2  # replaced
    assert chosen[-1] == 3
