"""Seeded sampling reproduces (runtime.md §17, issue 38 point 5): with keyed Gumbel-max draws
the token at a sequence position depends only on the seed and the stream before it, so
speculative decoding equals plain sampling with the same seed, token for token, for every
proposer and width — ``k="auto"`` too, whatever widths its timings pick — on the hermetic
fixtures and on the shipped demo pair. A request without a seed draws a fresh one (reported in
the stats; passing it back reproduces the text), and a temperature too small to sample is
greedy, never noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT
from proposer_helpers import DRAFT_DEVIATIONS, assert_follows
from test_prompt_lookup import REPETITIVE

import speculant
from speculant.speculative.width import MeasuredWidth
from speculant.tensors import TensorSeam, Value
from speculant.tensors.sampling import (
    Sampling,
    distribution_rows,
    keyed_gumbel,
    sample_keyed,
    seed_key,
)

PROPOSERS = ("chained", "draft", "prompt_lookup", "lookup_chained")
WIDTHS = (1, 2, 4, 8, "auto")
DEMO = Path(speculant.__file__).parent / "demo"
DEMO_DRAFT = Path(speculant.__file__).parent / "demo_draft"


@pytest.fixture(scope="module")
def engines(pair_engine, draft_engine, decoder8_root):
    return {"chained": pair_engine(), "draft": draft_engine(deviation_positions=DRAFT_DEVIATIONS),
            "prompt_lookup": speculant.load(decoder8_root), "lookup_chained": pair_engine()}


@pytest.fixture(scope="module")
def demo():
    return speculant.load(DEMO, draft=DEMO_DRAFT)


@pytest.fixture(scope="module")
def demo_prompts() -> list[str]:
    return ["def f(x):", "import numpy as np\n\nclass Grid:\n    def __init__(self"]


DEMO_SAMPLING = {"temperature": 0.8, "top_p": 0.9, "stop_on_eos": False}  # the issue's


@pytest.fixture(scope="module")
def demo_plain(demo, demo_prompts) -> dict[tuple[str, int], list[int]]:
    """Plain sampling's tokens on the demo pair, per (prompt, seed): 32 tokens."""
    return {(prompt, seed): demo.generate(prompt, 32, seed=seed, **DEMO_SAMPLING).token_ids
            for prompt, seed in zip(demo_prompts, (7, 8), strict=True)}


# -- the keyed noise ----------------------------------------------------------------------------
def test_keyed_noise_is_standard_gumbel_and_keyed_by_seed_position_and_id():
    key = seed_key(7)
    noise = keyed_gumbel(np, key, np.arange(64), 4096)  # [64, 4096]
    assert abs(noise.mean() - np.euler_gamma) < 0.01
    assert abs(noise.var() - np.pi ** 2 / 6) < 0.03
    np.testing.assert_array_equal(noise[5:6], keyed_gumbel(np, key, [5], 4096))  # per row
    np.testing.assert_array_equal(noise[:, :10], keyed_gumbel(np, key, np.arange(64), 10))
    assert not np.array_equal(noise[0], noise[1])  # positions differ
    assert not np.array_equal(noise[0], keyed_gumbel(np, seed_key(8), [0], 4096)[0])
    assert np.corrcoef(noise[0], noise[1])[0, 1] < 0.05


def test_seed_keys_differ_for_any_seed():
    seeds = [0, 1, 2, 2**31, 2**63, 2**64, 2**64 + 1, 2**200, 10**400]
    assert len({seed_key(s) for s in seeds}) == len(seeds)
    assert all(0 <= seed_key(s) < 2**64 for s in seeds)


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=3),
                                      Sampling(1.5, top_p=0.8), Sampling(1.0, min_p=0.3)],
                         ids=lambda s: repr(s)[9:-1])
def test_keyed_draws_follow_the_distribution(sampling):
    """Over 20,000 positions (fresh noise each), Gumbel-max draws follow T(row) exactly
    (chi-square at α = 0.001), filtered ids never drawn."""
    row = np.log(np.asarray([[0.05, 0.3, 0.1, 0.25, 0.2, 0.1]]))
    expected = distribution_rows(np, row, sampling)[0]
    positions = np.arange(20_000)
    ids = sample_keyed(np, np.repeat(row, len(positions), axis=0), sampling, seed_key(3),
                       positions)
    assert_follows(ids, expected, repr(sampling))
    assert set(ids.tolist()) <= set(np.flatnonzero(expected).tolist())


def test_seam_sample_keyed_matches_the_math():
    seam = TensorSeam()
    scores = np.random.default_rng(0).standard_normal((1, 5, 300)).astype(np.float32)
    ids = seam.sample_keyed(Value.host(scores), Sampling(0.8, top_p=0.9), seed_key(1), 40)
    assert ids.kind == "token_ids" and ids.dtype == "int32" and ids.shape == (5,)
    expected = sample_keyed(np, scores[0].astype(np.float64), Sampling(0.8, top_p=0.9),
                            seed_key(1), np.arange(40, 45))
    assert seam.read_token_ids(ids) == expected.tolist()
    # a row's draw depends on its position only, not on the rows beside it
    alone = seam.sample_keyed(Value.host(scores[:, 2:3]), Sampling(0.8, top_p=0.9),
                              seed_key(1), 42)
    assert seam.read_token_ids(alone) == [expected[2]]


# -- speculative == plain sampling, token for token ----------------------------------------------
def _sampled(engine, prompt, seed, **options):
    return engine.generate(list(prompt), MAX_NEW, temperature=3.0, seed=seed,
                           stop_on_eos=False, **options)


@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_speculative_equals_plain_sampling(engines, proposer, k):
    engine = engines[proposer]
    for prompt in (PROBE_PROMPT, REPETITIVE[0]):
        for seed in (0, 5):
            plain = _sampled(engine, prompt, seed)
            run = _sampled(engine, prompt, seed, proposer=proposer, k=k)
            assert run.token_ids == plain.token_ids, (proposer, k, prompt, seed)
            assert plain.stats.seed == run.stats.seed == seed
    assert run.stats.sampled_rows > 0 and run.stats.argmax_rows == 0


@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_demo_pair_speculative_equals_plain_sampling(demo, demo_plain, proposer, k):
    """The shipped demo pair (real weights, partial acceptance) at the issue's settings."""
    accepted = 0
    for (prompt, seed), plain in demo_plain.items():
        run = demo.generate(prompt, 32, seed=seed, proposer=proposer, k=k, **DEMO_SAMPLING)
        assert run.token_ids == plain, (proposer, k, prompt, seed)
        accepted += run.stats.accepted_drafts
    # the drafts were accepted somewhere: speculation did the work (k="auto" chooses its
    # widths from this host's measured costs: on a loaded one it may verify none)
    assert accepted > 0 or k == "auto"


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_auto_width_forced_to_random_widths_gives_the_same_text(demo, demo_prompts,
                                                                monkeypatch, proposer):
    """k="auto" picks widths from measured timings; whatever it picks, the text is the
    same: a policy forced to random widths (three different draws) commits plain sampling's
    tokens."""
    options = {**DEMO_SAMPLING, "seed": 7}
    plain = demo.generate(demo_prompts[1], 40, **options)
    for draw in range(3):
        rng = np.random.default_rng(draw)
        chosen: list[int] = []

        def random_width(self, state, cap, rng=rng, chosen=chosen) -> int:
            chosen.append(int(rng.integers(0, cap + 1)))
            return chosen[-1]

        monkeypatch.setattr(MeasuredWidth, "width", random_width)
        run = demo.generate(demo_prompts[1], 40, proposer=proposer, k="auto", **options)
        assert run.token_ids == plain.token_ids, (proposer, draw, chosen)
        assert len(set(chosen)) > 2  # the widths did vary
        monkeypatch.undo()


# -- the seed: fresh when absent, reported, and it reproduces -----------------------------------
def test_requests_without_a_seed_draw_fresh_ones_and_the_reported_seed_reproduces(demo,
                                                                                  demo_prompts):
    options = {"temperature": 1.0, "stop_on_eos": False}
    runs = [demo.generate(demo_prompts[0], 24, **options) for _ in range(3)]
    seeds = [run.stats.seed for run in runs]
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == 3
    assert len({tuple(run.token_ids) for run in runs}) > 1  # fresh randomness
    again = demo.generate(demo_prompts[0], 24, seed=seeds[0], proposer="chained",
                          **options)
    assert again.token_ids == runs[0].token_ids and again.stats.seed == seeds[0]


def test_greedy_reports_no_seed(demo, demo_prompts):
    stats = demo.generate(demo_prompts[0], 4, seed=3).stats
    assert stats.seed is None and stats.acceptance is None


# -- a temperature too small to sample is greedy -------------------------------------------------
@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 2.2250738585072014e-308, 1e-300,
                                         1e-9, 9.9e-6])
def test_a_temperature_below_the_floor_is_greedy(demo, demo_prompts, temperature):
    """Below MIN_TEMPERATURE (1e-5) the request decodes greedily: score / temperature would
    overflow (5e-324 gave uniform noise), and greedy is the limit anyway."""
    greedy = demo.generate(demo_prompts[1], 24)
    for options in ({}, {"proposer": "chained", "k": 4}):
        run = demo.generate(demo_prompts[1], 24, temperature=temperature, **options)
        assert run.token_ids == greedy.token_ids
        assert run.stats.sampled_rows == 0 and run.stats.seed is None
