"""Width policies: k="auto"'s controller on literal acceptance and cost numbers, every
proposer decoding exactly greedy's tokens with it, and a fixed k that observes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import speculant
from builders import encode
from builders.writers import write_chained_package, write_decoder_package
from speculant.session.session import Invocation
from speculant.speculative.kinds import KINDS
from speculant.speculative.width import (
    MAX_PROBE_EVERY,
    PROBE_EVERY,
    STRETCH,
    UNSETTLED_MAX,
    FixedWidth,
    MeasuredWidth,
    WidthController,
    WidthCosts,
    WidthTable,
    best_k,
    expected_tokens,
    probe_interval,
)
from speculant.tensors import Value
from speculant.workflow.options import GenerationOptions


def test_expected_tokens_is_one_plus_the_reach_of_each_position():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == 1.0 + 0.5 + 0.25
    assert expected_tokens([1.0, 0.0, 1.0], 3) == 2.0  # nothing is reached past a sure reject


def proposing(seconds_per_draft: float, max_k: int = 8) -> list[float]:
    return [k * seconds_per_draft for k in range(max_k + 1)]


def test_high_acceptance_and_cheap_drafts_pick_the_widest_k():
    acceptance = [0.95] * 8
    verify = [0.010 + 0.0002 * n for n in range(1, 10)]  # a wide pass costs little more
    assert best_k(acceptance, proposing(0.0001), verify) == 8


def test_low_acceptance_picks_a_small_k_and_lower_still_a_greedy_step():
    """t_verify(n) = 10 ms + 2 ms n, 0.2 ms a draft: p = 0.3 -> k = 1 (rates 83.3, 91.5,
    84.8 tok/s at k = 0, 1, 2); p = 0.1 -> k = 0 (drafting does not pay: 83.3 > 77.5)."""
    verify = [0.010 + 0.002 * n for n in range(1, 10)]
    assert best_k([0.3] * 8, proposing(0.0002), verify) == 1
    assert best_k([0.1] * 8, proposing(0.0002), verify) == 0
    assert best_k([0.9] * 8, proposing(0.050), verify) == 0  # drafts dearer than passes


def test_the_rule_on_literal_numbers_picks_the_best_rate():
    """p = 0.8 everywhere, t_propose(k) = k, t_verify(n) = 10 + 0.5 n: rates 1/10.5,
    1.8/11.5, 2.44/13, 2.952/14.5, 3.3616/16, 3.68928/17.5, 3.951424/19, ... -> k = 5
    (0.21082 > 0.21010 at k = 4)."""
    verify = [10 + 0.5 * n for n in range(1, 10)]
    assert best_k([0.8] * 8, proposing(1.0), verify) == 5
    assert best_k([0.8] * 8, proposing(1.0), verify) == 5  # deterministic


def test_a_fixed_proposal_cost_is_paid_once_per_round():
    """A chained drafter's bootstrap step: t_propose(k) = 3 + k; p = 0.7, t_verify(n) = 10:
    rates 0.1, 0.1214, 0.146, 0.1583, 0.1631, 0.1634, 0.161 ... -> k = 5, wider than a
    per-draft cost of 4 s would allow (0.1, 0.1214, 0.1217, 0.1151 ... -> k = 2)."""
    verify = [10.0] * 9
    with_bootstrap = [0.0, *(3.0 + k for k in range(1, 9))]
    assert best_k([0.7] * 8, with_bootstrap, verify) == 5
    assert best_k([0.7] * 8, proposing(4.0), verify) == 2


def test_the_rounds_own_time_is_paid_at_every_width_and_widens_k():
    """p = 0.6, t_propose(k) = 0.3 k, t_verify(n) = 1 + 0.05 n: rates 0.952, 1.143, 1.120 at
    k = 0, 1, 2 -> k = 1; with 1.5 more per round (acceptance, read-back, commit): 0.392,
    0.552, 0.603, 0.604, 0.584 -> k = 3. Leaving that time out picks too short a width."""
    verify = [1.0 + 0.05 * n for n in range(1, 10)]
    assert best_k([0.6] * 8, proposing(0.3), verify) == 1
    assert best_k([0.6] * 8, proposing(0.3), verify, 1.5) == 3


def test_a_greedy_steps_own_time_prices_k_0():
    """The demo pair on 2 CPU cores (ms): t_verify 0.24 (1 token) to 0.28 (3), a drafter step
    0.1 (the bootstrap too), p = 0.65 then 0.7: with the chained rounds' 0.2 outside for every
    width, k = 2 (2.70 against greedy's 2.27 tokens/ms) looks worth it; a greedy step's own
    0.08 makes greedy's 3.13 the best, as it measured."""
    verify = [0.24 + 0.02 * (n - 1) for n in range(1, 10)]
    propose = [0.0, *(0.1 * (k + 1) for k in range(1, 9))]
    acceptance = [0.65] + [0.7] * 7
    assert best_k(acceptance, propose, verify, 0.2) == 2
    assert best_k(acceptance, propose, verify, 0.2, greedy_round_seconds=0.2) == 2
    assert best_k(acceptance, propose, verify, 0.2, greedy_round_seconds=0.08) == 0


def test_a_greedy_steps_round_time_is_kept_apart():
    costs = WidthCosts()
    costs.observe_round(0.002, width=4)
    assert (costs.round_seconds, costs.greedy_round_seconds) == (0.002, None)
    costs.observe_round(0.0005, width=0)
    assert (costs.round_seconds, costs.greedy_round_seconds) == (0.002, 0.0005)
    costs.observe_round(5.0, width=0)  # a stall counts for neither
    assert costs.greedy_round_seconds == 0.0005


def test_the_round_time_is_measured_between_proposals_less_propose_and_verify():
    """The controller's clock: from one proposal to the next, less the proposal and the
    target passes the observer timed in between; a stall (a consumer's pause) is left out."""
    costs = WidthCosts()
    costs.observe_round(0.002)
    assert costs.round_seconds == 0.002
    costs.observe_round(0.004)
    assert costs.round_seconds == pytest.approx(0.7 * 0.002 + 0.3 * 0.004)
    before = costs.round_seconds
    costs.observe_round(5.0)  # a paused consumer: not the round's cost
    costs.observe_round(-0.001)  # a clock that ran backwards: nothing
    assert costs.round_seconds == before


def test_auto_measures_the_round_time_of_a_real_decode(engines):
    engine, _ = engines
    costs = engine.proposer_sources.costs
    costs.round_seconds = 0.0
    engine.generate(encode("def fib(n):\n    return "), 24, proposer="chained", k="auto",
                    stop_on_eos=False)
    assert 0.0 < costs.round_seconds < 0.25


def test_a_preempted_run_counts_as_twice_the_estimate_at_most():
    table = WidthTable()
    table.observe(1, 1.0)
    table.observe(1, 10.0)  # a spike (the host preempted the run): clipped to 2.0
    assert table.seconds[1] == pytest.approx(0.7 * 1.0 + 0.3 * 2.0)
    table.observe(1, 1.5)  # an ordinary rise moves it as it is
    assert table.seconds[1] == pytest.approx(0.7 * 1.3 + 0.3 * 1.5)


def test_ties_go_to_the_smaller_k():
    assert best_k([0.0] * 4, proposing(0.0, 4), [1.0] * 5) == 0


def test_observing_a_round_moves_the_positions_it_reached():
    controller = WidthController(4)  # prior 0.6, weight 0.15 per observation
    controller.observe(4, 3)  # drafts 1 and 2 accepted, 3 rejected, 4 not reached
    assert controller.acceptance == pytest.approx([0.66, 0.66, 0.51, 0.6])
    controller.observe(1, 2)  # a full accept of one draft
    assert controller.acceptance == pytest.approx([0.711, 0.66, 0.51, 0.6])


def test_a_short_run_of_rejections_keeps_drafting():
    """Costs of the H200's realistic ~1B round (a drafter step 1/14 of a pass): three first
    drafts rejected in a row, as happen in a request whose first draft is accepted 59 % of the
    time, do not turn the request to greedy steps (at weight 0.3 per round they brought p_1
    to 0.2; in 15-25 % of that model's passes k=auto took a greedy step); a long run does."""
    costs = WidthCosts(WidthTable({n: 0.00112 + 0.000008 * n for n in range(1, 6)}),
                       {"chained": WidthTable({k: 0.000077 * (k + 1) for k in range(1, 5)})},
                       0.00007)
    controller = WidthController(4, acceptance=[0.59, 0.71, 0.76, 0.81])
    for _ in range(3):
        controller.observe(4, 1)
    assert controller.acceptance[0] > 0.35 and controller.choose(costs, "chained") >= 2
    for _ in range(12):
        controller.observe(4, 1)
    assert controller.choose(costs, "chained") == 0


def test_the_cost_of_an_unmeasured_width_is_read_off_the_measured_ones():
    costs = WidthCosts()
    assert costs.verify_seconds(3) == [1.0, 1.0, 1.0]
    assert costs.propose_seconds("chained", 2) == [0.0, 0.0, 0.0]
    costs.verify.observe(2, 4.0)
    assert costs.verify_seconds(3) == [4.0, 4.0, 4.0]
    costs.verify.observe(4, 5.0)  # the line 3 + 0.5 n, never below the cheapest measured
    assert costs.verify_seconds(5) == pytest.approx([3.5, 4.0, 4.5, 5.0, 5.5])  # but at 1
    falling = WidthTable({1: 2.0, 2: 1.0})  # a line that falls: the mean
    assert falling.at(range(1, 4), 0.0) == pytest.approx([2.0, 1.0, 1.5])
    costs.observe_proposal("chained", 1, 3.0)
    costs.observe_proposal("chained", 3, 5.0)
    assert costs.propose_seconds("chained", 4) == pytest.approx([0.0, 3.0, 4.0, 5.0, 6.0])


def test_a_width_narrower_than_every_measured_one_is_read_off_the_line():
    """Below the narrowest measured width the line holds, between that width's cost in
    proportion to the tokens and its cost. The literal costs of a cold SmolLM2 request on 2
    CPU cores (ms; the 37-token pass its prefill): priced as dear as width 7, the narrower
    widths were never tried and the request stayed at k = 6."""
    table = WidthTable({7: 28.8, 9: 30.8, 37: 85.6})  # the line 14.465 + 1.921 n
    assert table.at(range(1, 10), 0.0) == pytest.approx(
        [16.39, 18.31, 20.23, 22.15, 24.07, 25.99, 28.8, 29.83, 30.8], abs=0.01)
    assert WidthTable({4: 8.0, 5: 20.0}).at(range(1, 4), 0.0) == [2.0, 4.0, 6.0]  # steep
    assert WidthTable({2: 5.0, 3: 5.1}).at(range(1, 2), 0.0) == pytest.approx([4.9])  # line
    costs = WidthCosts(WidthTable({7: 0.0288, 9: 0.0308, 37: 0.0856}),
                       {"chained": WidthTable({6: 0.0024}, proportional=True)},
                       round_seconds=0.0007)
    controller = WidthController(8, acceptance=[0.42, 0.2, 0.43] + [0.6] * 5)
    assert controller.choose(costs, "chained") == 1


def test_a_proposer_timed_at_one_width_is_priced_in_proportion_at_the_others():
    """The first proposals go to the widest width (nothing measured: drafting looks free);
    read flat from that one width every narrower width looked as dear, and the rule never
    left it. A proposal's cost is read in proportion to its drafts, a verify's flat."""
    costs = WidthCosts()
    costs.observe_proposal("chained", 8, 0.016)
    costs.verify.observe(9, 0.030)
    assert costs.propose_seconds("chained", 8) == pytest.approx(
        [0.0, 0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.014, 0.016])
    assert costs.verify_seconds(9) == [0.030] * 9
    controller = WidthController(8, acceptance=[0.5, 0.3, 0.2] + [0.1] * 5)
    assert 0 < controller.choose(costs, "chained") < 8


def test_the_controller_widens_as_drafts_are_accepted_narrows_as_they_fail_and_probes():
    costs = WidthCosts(WidthTable({1: 0.010, 5: 0.011}),
                       {"chained": WidthTable({1: 0.0005, 4: 0.002})})
    controller = WidthController(4)
    for _ in range(10):
        controller.observe(4, 5)
    assert controller.choose(costs, "chained") == 4
    for _ in range(20):
        controller.observe(4, 1)
    chosen = [controller.choose(costs, "chained") for _ in range(PROBE_EVERY + 2)]
    assert chosen == [0] * PROBE_EVERY + [1, 0]  # greedy steps, then one probe of one draft


def test_a_dear_probe_waits_longer_between_probes():
    """The demo pair on 2 CPU cores (ms): a greedy step 0.24 + 0.09 outside; a one-draft round
    0.1 of drafting + 0.26 of verify + 0.2 outside, 0.23 more than a greedy step: at 2 % of
    the greedy steps between probes that is one probe in 35 steps. On the H200's ~1B a probe
    costs an eighth of a greedy step and the interval stays at its least."""
    verify = [0.24, 0.26, 0.28]
    assert probe_interval([0.0, 0.1, 0.2], verify, 0.2, 0.09) == 35
    assert probe_interval([0.0, 0.1, 0.2], verify, 0.2, None) == 14  # one figure for both
    assert probe_interval([0.0, 0.154, 0.23], [1.128, 1.136, 1.144], 0.07, None) == PROBE_EVERY
    assert probe_interval([0.0, 10.0, 20.0], verify, 0.2, 0.08) == MAX_PROBE_EVERY
    assert probe_interval([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0.0, None) == PROBE_EVERY  # unmeasured

    costs = WidthCosts(WidthTable({1: 0.24e-3, 2: 0.26e-3, 3: 0.28e-3}),
                       {"chained": WidthTable({1: 0.1e-3, 2: 0.2e-3})}, 0.2e-3, 0.09e-3)
    controller = WidthController(2, acceptance=[0.1, 0.1])  # drafting does not pay
    chosen = [controller.choose(costs, "chained") for _ in range(PROBE_EVERY + 1 + 37)]
    # a request's first probe soon (its text may suit the drafter), the next ones priced
    assert chosen == [0] * PROBE_EVERY + [1] + [0] * 35 + [1, 0]


def test_a_greedy_choice_hands_the_steps_before_the_probe_to_the_greedy_path():
    """After a greedy choice the rule would choose greedy until the probe (acceptance moves
    only in a round with drafts): those steps are taken as a stretch, at most STRETCH at a
    time, counted as chosen, and the probe comes exactly where choosing each would put it."""
    costs = WidthCosts(WidthTable({1: 0.24e-3, 2: 0.26e-3, 3: 0.28e-3}),
                       {"chained": WidthTable({1: 0.1e-3, 2: 0.2e-3})}, 0.2e-3, 0.09e-3)
    controller = WidthController(2, acceptance=[0.1, 0.1])  # drafting does not pay
    assert controller.take_greedy_stretch(STRETCH) == 0  # nothing chosen yet
    assert controller.choose(costs, "chained") == 0
    assert controller.greedy_left == PROBE_EVERY - 1
    assert controller.take_greedy_stretch(3) == 3  # at most what is asked
    assert controller.take_greedy_stretch(STRETCH) == PROBE_EVERY - 4  # never past the probe
    assert controller.take_greedy_stretch(STRETCH) == 0
    assert controller.choose(costs, "chained") == 1  # the first probe, as choosing each gave
    assert controller.take_greedy_stretch(STRETCH) == 0  # after a round with drafts: none
    # the next probe priced (35 greedy steps, test_a_dear_probe_...): 1 + 34 taken
    stretches = []
    while controller.choose(costs, "chained") == 0:
        stretches.append(controller.take_greedy_stretch(STRETCH))
    assert len(stretches) + sum(stretches) == 35 and max(stretches) == STRETCH


def test_a_full_accept_sends_the_next_round_one_position_further():
    """Costs that make k = 1 the rule's choice (a second draft is dear, p_2 at its prior);
    after a round that accepted its one draft the next round drafts two, so p_2 is
    measured; after a rejection the rule decides again."""
    costs = WidthCosts(WidthTable({1: 0.010, 2: 0.012, 3: 0.014}),
                       {"chained": WidthTable({1: 0.001, 2: 0.006, 3: 0.011})})
    controller = WidthController(3, acceptance=[0.9, 0.3, 0.3])
    assert controller.choose(costs, "chained") == 1
    controller.observe(1, 2)  # the draft accepted: a full accept at width 1
    assert controller.choose(costs, "chained") == 2
    controller.observe(2, 2)  # the second draft rejected: p_2 measured lower still
    assert controller.acceptance[1] < 0.3
    assert controller.choose(costs, "chained") == 1
    controller.observe(3, 4)  # a full accept at the bound stays at the bound
    assert controller.reach == 3


def test_the_verify_observer_times_passes_by_their_token_width():
    costs = WidthCosts()
    observe = costs.verify_observer({"input_ids": "token_ids"}, max_width=8)
    observe(Invocation("target", {"input_ids": Value.host(np.zeros((1, 3), np.int64))},
                       ("logits",), 0.25))
    observe(Invocation("target", {"input_ids": Value.host(np.zeros((1, 30), np.int64))},
                       ("logits",), 9.0))  # a long prefill: not a verify width
    assert costs.verify.seconds == {}  # not asked yet: an overlapped replay's would wait
    assert costs.verify_total == 9.25 and costs.verify.seconds == {3: 0.25}


def test_the_verify_observer_asks_no_time_of_the_latest_passes_and_stays_bounded():
    """A greedy decode never asks the costs: the observer folds the older passes in itself
    (bounded memory) but never asks a time of the latest two (a queued pass's would wait)."""
    costs = WidthCosts()
    observe = costs.verify_observer({"input_ids": "token_ids"})
    asked: list[int] = []

    def timer(index: int):
        return lambda: asked.append(index) or 0.001

    for index in range(UNSETTLED_MAX + 1):
        observe(Invocation("target", {"input_ids": Value.host(np.zeros((1, 1), np.int64))},
                           ("logits",), timer(index)))
    assert asked == list(range(UNSETTLED_MAX - 1)) and len(costs.unsettled) == 2


def test_settling_stops_at_the_first_pass_still_running():
    """Rounds queued on a device keep passes in flight while the host chooses the next width:
    settling folds in the finished ones, oldest first, and never asks a running one (asking
    would wait for it)."""
    costs = WidthCosts()
    observe = costs.verify_observer({"input_ids": "token_ids"})
    done = [True, True, False, True]
    asked: list[int] = []
    for index in range(len(done)):
        observe(Invocation("target", {"input_ids": Value.host(np.zeros((1, 2), np.int64))},
                           ("logits",), lambda i=index: asked.append(i) or 0.25,
                           lambda i=index: done[i]))
    assert costs.verify_total == 0.5 and asked == [0, 1] and len(costs.unsettled) == 2
    done[2] = True
    assert costs.verify_total == 1.0 and asked == [0, 1, 2, 3] and not costs.unsettled


def measured(max_k: int, costs: WidthCosts) -> MeasuredWidth:
    from types import SimpleNamespace

    target = SimpleNamespace(observers=[], ports=SimpleNamespace(roles={}))
    return MeasuredWidth(max_k, "chained", costs, target)


def test_a_widths_first_proposal_in_a_request_is_not_timed():
    """The first proposal at a width may make that width's plan or unrolled session (once):
    timed, it would price the width out for good (never chosen, never measured again)."""
    costs = WidthCosts()
    policy = measured(4, costs)
    made: set[int] = set()
    for _ in range(4):
        k = policy.width(None, 4)
        policy.proposed(k, 0.001 if k in made else 0.05)  # the first at a width is slow
        made.add(k)
    costs.settle_proposals()
    widths = set(policy.chosen)
    assert widths and all(0 < seconds < 0.05 for seconds in costs.propose["chained"].seconds
                          .values())
    assert set(costs.propose["chained"].seconds) <= widths


def test_a_greedy_steps_empty_proposal_is_not_timed():
    """t_propose(0) is 0 by definition: a greedy step's empty proposal timed at width 0 put
    a point at 0 under the proposer's fitted line (and refitted it every greedy step)."""
    costs = WidthCosts()
    policy = measured(2, costs)
    for k in (0, 0, 2, 2, 0):
        policy.proposed(k, 0.001)
    costs.settle_proposals()
    assert set(costs.propose["chained"].seconds) == {2}
    returned = costs.propose_seconds("chained", 2)
    returned[1] = 99.0  # the caller's copy: the table's answer stays its own
    assert costs.propose_seconds("chained", 2)[1] < 1.0


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto-k")
    chained = speculant.load(write_chained_package(root / "pair"))
    decoder = write_decoder_package(root / "decoder")
    draft = write_decoder_package(root / "draft", deviation_positions={3, 4, 9, 13, 19, 25, 36})
    return chained, speculant.load(decoder, draft=draft)


@pytest.mark.parametrize("proposer", ["chained", "draft", "prompt_lookup"])
def test_k_auto_decodes_exactly_greedy_for_every_proposer(engines, proposer):
    chained, with_draft = engines
    engine = chained if proposer == "chained" else with_draft
    prompt = encode("def fib(n):\n    return ")
    greedy = engine.generate(prompt, 48, stop_on_eos=False)
    decode = engine.decode(prompt, 48, proposer=proposer, stop_on_eos=False)
    tokens = list(decode)
    result = decode.result
    assert result.stats.proposer == proposer
    assert tokens == result.token_ids == greedy.token_ids
    assert result.stats.rounds > 0
    widest = KINDS[proposer].default_k(engine.proposer_sources)
    assert all(1 <= k <= widest for k, _ in result.stats.trace)
    # the engine measured what the controller reads
    assert engine.proposer_sources.costs.verify.seconds
    assert proposer in engine.proposer_sources.costs.propose


def test_k_auto_is_a_measured_policy_and_a_fixed_k_the_null_one(engines):
    chained, _ = engines
    def admitted(**fields):
        return chained._admit(encode("def "), GenerationOptions.of(8, speculative=True,
                                                                   **fields),
                              None, with_text=False)

    _, proposer, auto = admitted()
    widest = chained.package.document.speculative.max_proposal_width
    assert isinstance(auto, MeasuredWidth) and auto.controller.max_k == widest
    assert list(auto.widths) == list(range(widest + 1))
    _, same, fixed = admitted(k=2)
    assert isinstance(fixed, FixedWidth) and list(fixed.widths) == [2] and same is proposer


def test_a_proposal_queued_on_a_device_is_priced_by_its_work_not_its_launch():
    """A drafter chain queued on the device returns in its launch time; its runs, timed by
    marks on the stream, say what it cost. Priced by the host clock every width looks free
    (k=auto then drafted 7.3 drafts a round on the H200 where k=4 was faster): priced by the
    larger of the two, asked once the runs finished, and taken out of the round's time."""

    from speculant.speculative.proposal import Proposal

    costs = WidthCosts()
    observe = costs.proposer_observer()
    done = {"flag": False}

    class Queued:  # proposes in ~0 s host time; its one run takes 0.004 s per draft + 0.004
        def propose(self, state, k):
            observe(Invocation("assistant.chain", {}, ("drafts",),
                               lambda k=k: 0.004 * (k + 1), lambda: done["flag"]))
            return Proposal(tokens=[1] * k)

    policy = measured(4, costs)

    def round_(state=None):
        k = policy.width(state, 4)
        proposal = Queued().propose(state, k)
        policy.proposed(proposal.k, 0.0)
        return k

    round_()  # its width's first proposal: not a measurement
    k = round_()  # running: not folded in yet
    assert len(costs.unsettled_proposals) == 2 and "chained" not in costs.propose
    done["flag"] = True
    assert costs.propose_seconds("chained", 4)[k] == pytest.approx(0.004 * (k + 1))
    assert not costs.unsettled_proposals and not costs.proposer_runs
    assert costs.settle_proposals() == pytest.approx(2 * 0.004 * (k + 1), rel=0.05)


def test_only_a_measured_decode_observes_the_sessions():
    """A fixed k attaches no observer (nothing timed, nothing kept); k="auto" observes the
    target's passes and the proposer's runs (the chained drafter's, the draft model's) while
    it decodes, and leaves the sessions as they were."""
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp())
    engine = speculant.load(write_chained_package(root / "pair"))
    step = engine.sessions[engine.package.plan.proposer]
    target = engine.sessions[engine.package.plan.target]
    costs = engine.proposer_sources.costs
    assert step.times_to_completion and target.times_to_completion
    prompt = encode("def fib(n):\n    return ")
    engine.generate(prompt, 40, proposer="chained", k=4, stop_on_eos=False)
    assert not step.observers and not target.observers
    assert not costs.proposer_runs and not costs.verify.seconds
    engine.generate(prompt, 40, proposer="chained", k="auto", stop_on_eos=False)
    assert costs.verify.seconds and costs.propose["chained"].seconds
    assert not step.observers and not target.observers  # detached at the end
    draft = speculant.load(write_decoder_package(root / "decoder"),
                           draft=write_decoder_package(root / "draft"))
    assert draft.draft.session.times_to_completion
    draft.generate(prompt, 12, proposer="draft", k="auto", stop_on_eos=False)
    assert draft.proposer_sources.costs.propose["draft"].seconds
