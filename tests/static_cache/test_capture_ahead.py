"""k="auto" captures every width before its first round (issue 12, "Next": a width first
captured mid-decode stalled the H200's decodes). On the CPU the target session is made to
say it captures (its plans then count runs as a captured plan does; ONNX Runtime's CPU EP
ignores ``gpu_graph_id``), which runs the same code as on CUDA: the real capture is
tests/cuda/test_graphs_cuda.py's."""

from __future__ import annotations

import pytest

import speculant
from speculant.session.plan import CAPTURE_RUNS, PassPlan
from speculant.workflow import target_pass

PROMPT = [3, 17, 8, 22, 5, 9, 11, 4, 6, 7, 12]
NEW = 40


@pytest.fixture
def capturing(pairs):
    """The static pair whose target session says it captures, after a request at k = 2
    that left the width-2 plan made, run once (not captured) with a 2-token prompt's
    inputs: positions and length 2, inside the next prompt's valid prefix."""
    engine = speculant.load(pairs["gqa-float32", "static"], threads=1)
    engine.sessions[engine.package.plan.target].graphs.is_enabled = True
    engine.generate(PROMPT[:2], 2, speculative=True, k=2, stop_on_eos=False)
    return engine


@pytest.fixture
def greedy_tokens(pairs):
    appended = speculant.load(pairs["gqa-float32", "appended"], threads=1)
    return appended.generate(PROMPT, NEW, stop_on_eos=False).token_ids


def test_every_width_is_captured_before_the_first_round(capturing, greedy_tokens):
    result = capturing.generate(PROMPT, NEW, speculative=True, k="auto", stop_on_eos=False)
    assert result.token_ids == greedy_tokens
    cells, = capturing.static_pool._cells.values()
    max_k = capturing.proposer_sources.chained.max_k
    assert sorted(cells.plans) == list(range(1, max_k + 2))
    assert all(plan.num_runs >= CAPTURE_RUNS for plan in cells.plans.values())
    costs = capturing.proposer_sources.costs  # every width timed before the first round
    assert set(range(1, max_k + 2)) <= set(costs.verify.seconds)
    assert set(range(1, max_k + 1)) <= set(costs.propose["chained"].seconds)
    again = capturing.generate(PROMPT, NEW, speculative=True, k="auto", stop_on_eos=False)
    assert again.token_ids == greedy_tokens
    # the engine's counters: nothing captured since (not mid-run either)
    assert again.stats.residency["graph_captures"] == result.stats.residency["graph_captures"]


def test_a_fixed_k_captures_its_own_width_alone(capturing):
    capturing.generate(PROMPT, NEW, speculative=True, k=1, stop_on_eos=False)
    cells, = capturing.static_pool._cells.values()
    assert sorted(cells.plans) == [1, 2]


def test_capture_runs_that_skip_writing_the_inputs_are_caught(capturing, greedy_tokens,
                                                              monkeypatch):
    """The planted defect: the plan left by the earlier request run as it stands (its
    inputs say C0 = 2), so the capture runs overwrite slots 2 and 3 of this prompt's
    caches: the tokens leave greedy's."""
    def stale(target, widths, token, start, cells, admitted, controls):
        for n in widths:
            plan: PassPlan | None = cells.plans.get(n)
            if plan is None:
                target_pass.run_static(target, [token] * n, start, cells, admitted, controls)
                plan = cells.plans[n]
            while plan.awaits_capture:
                plan.run()  # the defect: this request's start never written
        return list(widths)

    monkeypatch.setattr("speculant.speculative.round.capture_widths", stale)
    result = capturing.generate(PROMPT, NEW, speculative=True, k="auto", stop_on_eos=False)
    assert result.token_ids != greedy_tokens
