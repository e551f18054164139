"""Prompt lookup (runtime.md §18): the pure n-gram search on literal token arrays, then the
proposer end to end on the decoder fixture (rollback_positions 8) against the exact trace."""

from __future__ import annotations

import pytest
import yaml
from chain_helpers import MAX_NEW, PROBE_PROMPT, PROMPTS, SPEC

import speculant
from builders import greedy_stream, speculative_trace, write_decoder_package
from builders.trace import prompt_lookup_drafts
from speculant.errors import RequestError
from speculant.speculative.prompt_lookup import NgramIndex, lookup_drafts

WIDTHS = (1, 2, 4, 8)
BOUND = 8
# The target's own stream for (5, 9, 3) (its greedy continuation, checked below). A prompt that
# ends by replaying a stretch of it makes the lookup draft what followed that stretch, which
# the target repeats wherever neither position is a deviation position.
GREEDY = (5, 9, 3, 10, 14, 4, 3, 16, 26, 4, 25, 27)
REPETITIVE = (GREEDY + GREEDY[2:6], GREEDY[:10] + GREEDY[1:4])


# -- the search, on literal arrays --------------------------------------------------------------
@pytest.mark.parametrize(("stream", "k", "expected"), [
    ([1, 2, 3, 9, 1, 2, 3], 4, [9, 1, 2, 3]),  # trigram 1 2 3 at 0: what followed it
    ([1, 2, 3, 9, 1, 2, 3], 2, [9, 1]),  # at most k
    ([5, 6, 7, 5, 6, 8, 5, 6], 3, [8, 5, 6]),  # the most recent occurrence of "5 6" wins
    ([4, 1, 2, 3, 8, 2, 3, 7, 1, 2, 3], 3, [8, 2, 3]),  # n = 3 is tried before n = 2
    ([4, 2, 3, 8, 9, 1, 2, 3], 3, [8, 9, 1]),  # trigram absent: the bigram "2 3"
    ([4, 7, 3, 8, 9, 1, 2, 3], 3, [8, 9, 1]),  # only the unigram "3" recurs
    ([1, 2, 3, 4], 3, []),  # nothing recurs: no drafts
    ([7], 3, []),  # a single token has no earlier occurrence
    ([7, 7], 3, [7]),  # the overlapping occurrence at 0; one token follows it
    ([7, 7, 7, 7], 8, [7]),  # "7 7 7" at 0 is followed by 7 alone (the final n-gram excluded)
    ([1, 2, 1, 2], 5, [1, 2]),  # "1 2" at 0 (the final "1 2" at 2 is excluded)
    ([3, 1, 2, 3], 0, []),  # k = 0
])
def test_lookup_on_literal_arrays(stream, k, expected):
    assert lookup_drafts(stream, k) == expected
    assert prompt_lookup_drafts(stream, k) == expected  # the trace's reference agrees


@pytest.mark.parametrize(("n_min", "n_max", "expected"), [
    (1, 1, [5]),  # unigram "3": last earlier occurrence at 5, followed by 5
    (2, 2, [9]),  # bigram "2 3" at 3 only
    (3, 3, []),  # no trigram recurs
    (2, 3, [9]),
])
def test_lookup_ngram_range(n_min, n_max, expected):
    stream = [0, 4, 7, 2, 3, 9, 3, 5, 2, 3]
    # unigram 3 occurs at 4 and 6 (6 wins: followed by 5); bigram "2 3" at 3 (followed by 9)
    assert lookup_drafts(stream, 1, n_max=n_max, n_min=n_min) == expected


def test_lookup_agrees_with_the_reference_on_random_streams():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(300):
        stream = rng.integers(0, 4, size=int(rng.integers(1, 30))).tolist()
        k = int(rng.integers(1, 9))
        assert lookup_drafts(stream, k) == prompt_lookup_drafts(stream, k), stream


@pytest.mark.parametrize("ngram_range", [(1, 3), (2, 2), (1, 5)])
def test_the_growing_index_answers_as_a_fresh_search_of_the_whole_stream(ngram_range):
    """One index per request, fed a stream that grows by 1-5 tokens a round (as commits
    grow it): at every length its drafts are the reference's over the whole stream."""
    import numpy as np

    rng = np.random.default_rng(1)
    n_min, n_max = ngram_range
    for _ in range(40):
        index, stream = NgramIndex(n_min, n_max), rng.integers(0, 5, size=3).tolist()
        while len(stream) < 60:
            k = int(rng.integers(0, 9))
            assert index.drafts(stream, k) == prompt_lookup_drafts(stream, k, n_max, n_min)
            stream += rng.integers(0, 5, size=int(rng.integers(1, 6))).tolist()


# -- end to end ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(decoder8_root) -> speculant.Engine:
    return speculant.load(decoder8_root)


def lookup_trace(prompt, k, max_new_tokens=MAX_NEW):
    return speculative_trace(SPEC, list(prompt), max_new_tokens, k, proposer="prompt_lookup",
                             rollback_bound=BOUND)


@pytest.mark.parametrize("k", WIDTHS)
def test_lookup_equals_greedy_with_the_exact_trace(engine, k):
    for prompt in PROMPTS + REPETITIVE:
        greedy = engine.generate(list(prompt), MAX_NEW).token_ids
        result = engine.generate(list(prompt), MAX_NEW, proposer="prompt_lookup", k=k)
        trace = lookup_trace(prompt, k)
        assert result.token_ids == greedy == trace.tokens
        assert result.stats.trace == trace.pairs()
        counters = {name: getattr(result.stats, name) for name in trace.counters()}
        assert counters == trace.counters()
        assert result.stats.proposer_invocations == 0
        assert result.stats.proposer == "prompt_lookup"


@pytest.mark.parametrize("k", WIDTHS)
def test_repetitive_prompts_accept_drafts(engine, k):
    """A prompt that repeats the target's own stream: the first round drafts the repeat and
    the target accepts it."""
    assert list(GREEDY[3:]) == greedy_stream(SPEC, GREEDY[:3], len(GREEDY) - 3)
    for prompt in REPETITIVE:
        stats = engine.generate(list(prompt), MAX_NEW, proposer="prompt_lookup", k=k).stats
        assert stats.rounds > 0 and stats.accepted_drafts > 0
        assert stats.trace[0][1] >= 2


def test_non_repetitive_prompt_falls_back_to_greedy_steps(engine):
    """A stream with no recurring n-gram proposes nothing: every step is a greedy step
    (counted as such, no round), and the output is the greedy stream."""
    prompt = (5, 9, 3)
    budget = 4  # the fixture's stream 5 9 3 t g n ... has no repeat this early
    result = engine.generate(list(prompt), budget, proposer="prompt_lookup", k=4)
    assert result.token_ids == engine.generate(list(prompt), budget).token_ids
    stream = list(prompt) + result.token_ids
    assert all(lookup_drafts(stream[:i], 4) == [] for i in range(1, len(stream)))
    assert result.stats.rounds == 0 and result.stats.drafts_proposed == 0
    assert result.stats.greedy_steps == budget - 1


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("k", "path"), [(0, "k"), (2.0, "k"), (9, "rollback_positions")])
def test_lookup_k_outside_the_bound(engine, k, path):
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="prompt_lookup", k=k)
    assert caught.value.paths == [path]


def test_lookup_k_defaults_to_the_rollback_bound(engine):
    """k=None: the fixed default width, the rollback bound."""
    bound = engine.package.plan.undeclared_rollback_bound
    default = engine.generate(list(PROBE_PROMPT), 8, proposer="prompt_lookup", k=None)
    assert default.stats.trace == engine.generate(list(PROBE_PROMPT), 8,
                                                  proposer="prompt_lookup",
                                                  k=bound).stats.trace


@pytest.mark.parametrize("ngram_range", [(0, 3), (3, 1), (-1, -1)])
def test_lookup_bad_ngram_range(engine, ngram_range):
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="prompt_lookup", k=2,
                        ngram_range=ngram_range)
    assert caught.value.paths == ["ngram_range"]


def test_lookup_refused_without_a_rollback_bound(tmp_path):
    """No rollback_positions on the target's groups: no bound, so no speculation."""
    root = write_decoder_package(tmp_path / "no-bound")
    path = root / "inference_metadata.yaml"
    document = yaml.safe_load(path.read_text())
    groups = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"]
    for group in groups.values():
        del group["capabilities"]["rollback_positions"]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    engine = speculant.load(root)
    assert engine.package.plan.undeclared_rollback_bound is None
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="prompt_lookup", k=2)
    assert caught.value.paths == ["rollback_positions"]
    assert engine.generate(list(PROBE_PROMPT), 8).token_ids


def test_unknown_proposer_kind(engine):
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="medusa", k=2)
    assert caught.value.paths == ["proposer"]
    assert "'prompt_lookup'" in str(caught.value)


def test_chained_on_a_package_that_declares_none(engine):
    """A proposer kind the package does not declare."""
    with pytest.raises(RequestError) as caught:
        engine.generate(list(PROBE_PROMPT), 8, proposer="chained", k=2)
    assert caught.value.paths == ["speculative"]
