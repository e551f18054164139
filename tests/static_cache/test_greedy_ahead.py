"""Greedy steps on static caches queued ahead of the host (speculative/round.py's
``launch_step``): each pass fed the previous pass's argmax where it was made. Any depth gives
the appended form's tokens; a stop found while a pass is queued keeps the state exact (the
next request on the same buffers decodes as a fresh engine does); the budget never queues a
pass it does not need."""

from __future__ import annotations

import pytest

import speculant
from speculant.workflow.target_pass import TargetPass

PROMPT = [7, 3, 41, 12, 25, 9, 7, 3, 41, 12]
NEW = 24


def engine_at(root, depth: int):
    engine = speculant.load(root, threads=1)
    engine.target.queue_depth = depth  # a device's default is 1, the host's 0
    return engine


@pytest.fixture(scope="module")
def reference(pairs):
    """The appended form's greedy stream: nothing queued, nothing in place."""
    engine = speculant.load(pairs["scatter-float32", "appended"], threads=1)
    return engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False).token_ids


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("form", ["scatter-float32", "gqa-float16"])
def test_any_depth_decodes_the_appended_greedy_stream(pairs, form, depth):
    engine = engine_at(pairs[form, "static"], depth)
    appended = speculant.load(pairs[form, "appended"], threads=1)
    want = appended.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False).token_ids
    session = engine.sessions[engine.package.plan.target]
    result = engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False)
    assert result.token_ids == want and len(want) == NEW
    assert result.stats.greedy_steps == NEW - 1 and result.stats.target_passes == NEW
    assert result.stats.rollback_bytes_moved == 0
    assert result.stats.queued_passes == (NEW - 2 if depth else 0)  # the first from the host
    # the budget ends the stream: no pass is queued past the last token it needs
    assert session.num_invocations == NEW


@pytest.mark.parametrize("depth", [1, 2])
def test_a_stop_found_with_passes_queued_leaves_the_state_exact(pairs, reference, depth):
    """Stop at the reference's 9th token: the passes queued beyond it ran (their slots lie
    past the length) and are dropped, the stream ends there, and the next request on the
    same pooled buffers and plans decodes exactly as a fresh engine does."""
    stop_at = reference.index(reference[8])  # its first appearance
    engine = engine_at(pairs["scatter-float32", "static"], depth)
    session = engine.sessions[engine.package.plan.target]
    stopped = engine.generate(PROMPT, max_new_tokens=NEW, stop_token_ids=[reference[8]])
    assert stopped.token_ids == reference[:stop_at + 1] and stopped.stats.stop_reason == "eos"
    assert stopped.stats.target_passes == stop_at + 1
    assert session.num_invocations == stop_at + 1 + min(depth, NEW - 1 - stop_at)
    again = engine.generate(PROMPT[3:], max_new_tokens=NEW, stop_on_eos=False)
    fresh = engine_at(pairs["scatter-float32", "static"], 0).generate(
        PROMPT[3:], max_new_tokens=NEW, stop_on_eos=False)
    assert again.token_ids == fresh.token_ids


def test_a_pass_fed_a_stale_choice_is_caught(pairs, reference, monkeypatch):
    """Planted: each queued pass is fed the choice of the pass before the previous one
    (one pass stale) instead of the previous pass's argmax: the stream then differs."""
    engine = engine_at(pairs["scatter-float32", "static"], 1)
    run = TargetPass.run
    fed: list = []

    def stale(self, tokens, start, cells, admitted, controls, *, drafts=None):
        if drafts is not None and not tokens:
            fed.append(drafts)
            drafts = fed[-2] if len(fed) > 1 else drafts
        return run(self, tokens, start, cells, admitted, controls, drafts=drafts)

    monkeypatch.setattr(TargetPass, "run", stale)
    planted = engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False)
    assert len(fed) == NEW - 2 and planted.token_ids != reference


def asking(monkeypatch) -> list[int]:
    """Every choice k=auto's rule makes, in order."""
    from speculant.speculative import width

    asked: list[int] = []
    choose = width.WidthController.choose
    monkeypatch.setattr(width.WidthController, "choose",
                        lambda self, *a: asked.append(choose(self, *a)) or asked[-1])
    return asked


@pytest.mark.parametrize("proposer", ["chained", "prompt_lookup"])
@pytest.mark.parametrize(("cache", "depth"), [("static", 0), ("static", 1), ("appended", 0)])
def test_k_auto_takes_its_greedy_steps_in_stretches(pairs, monkeypatch, proposer, cache,
                                                   depth):
    """Drafting priced out (a proposal costs a second): k=auto decodes greedy's tokens. After
    a greedy choice the rule is asked again only after a stretch (at most STRETCH steps, never
    past the probe), so the first probe comes where asking every step puts it (after
    PROBE_EVERY greedy steps); on static caches its greedy steps keep their argmax on the
    device, queued or not, and no pass runs past the end."""
    from speculant.speculative.width import STRETCH, WidthTable

    engine = engine_at(pairs["scatter-float32", cache], depth)
    session = engine.sessions[engine.package.plan.target]
    asked = asking(monkeypatch)
    monkeypatch.setattr(engine.proposer_sources.costs, "propose",
                        {proposer: WidthTable({1: 1.0, 2: 2.0})})
    want = engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False).token_ids
    result = engine.generate(PROMPT, max_new_tokens=NEW, stop_on_eos=False,
                             proposer=proposer)
    stats = result.stats
    assert result.token_ids == want and stats.rounds >= 1
    assert stats.greedy_steps + stats.rounds == stats.target_passes - 1 == NEW - 1
    assert asked[:2] == [0, 1]  # a greedy step, its stretch of PROBE_EVERY - 1, the probe
    assert session.num_invocations == len(want) + stats.target_passes  # none past the end
    assert len(asked) <= 1 + stats.rounds + 2 * (stats.greedy_steps // (STRETCH + 1) + 1)
    if cache == "static" and depth:
        assert stats.queued_passes > 0  # steps queued behind steps
