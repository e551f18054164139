"""Sampling (runtime.md §17, evidence.md E7 and §5): ``T(row)`` on literal rows, the rejection
sampler checked statistically as a pure function of (p, q), and end to end: temperature 0 is
greedy, ``top_k = 1`` reproduces the greedy trace exactly, runs are reproducible per seed, and
the committed tokens follow the target's distribution for every proposer and k.

Statistics: chi-square at significance 0.001 (``proposer_helpers``) and total-variation
distance shrinking with the sample count. All samples come from fixed seeds (numpy's
``Generator``), so every verdict is the same on every run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from chain_helpers import MAX_NEW, PROBE_PROMPT, SPEC, reference_trace
from proposer_helpers import (
    DRAFT_DEVIATIONS,
    DRAFT_SPEC,
    assert_follows,
    exact_marginals,
    total_variation,
)
from test_prompt_lookup import REPETITIVE

from builders import speculative_trace
from speculant.errors import ContractError, RequestError
from speculant.speculative.kinds import KINDS
from speculant.tensors import HOST, TensorSeam, Value
from speculant.tensors.sampling import (
    Sampling,
    distribution_rows,
    rejection_sample,
    sample_rows,
)

INF, NAN = math.inf, math.nan


def T(row, temperature=1.0, **knobs) -> np.ndarray:
    """T(row) of one literal row, through the host math."""
    rows = np.asarray([row], np.float64)
    return distribution_rows(np, rows, Sampling(temperature, **knobs))[0]


def softmax(row, temperature=1.0) -> np.ndarray:
    row = np.asarray(row, np.float64) / temperature
    weights = np.exp(row - row.max())
    return weights / weights.sum()


# -- T(row) on literal rows ---------------------------------------------------------------------
def test_t_is_softmax_of_scores_over_temperature():
    row = [1.0, 2.0, 0.5, -1.0]
    for temperature in (0.5, 1.0, 3.0):
        np.testing.assert_allclose(T(row, temperature), softmax(row, temperature), rtol=1e-12)


def test_t_nan_and_infinities():
    np.testing.assert_allclose(T([NAN, 1.0, NAN, 1.0]), [0, 0.5, 0, 0.5])  # NaN -> 0
    np.testing.assert_allclose(T([1.0, INF, 3.0, INF]), [0, 0.5, 0, 0.5])  # +inf share it all
    np.testing.assert_allclose(T([-INF, 2.0, -INF]), [0, 1, 0])
    np.testing.assert_allclose(T([NAN, -INF, -INF]), [0, 1, 0])  # argmax rule: first non-NaN
    np.testing.assert_allclose(T([NAN, NAN, NAN]), [1, 0, 0])  # all NaN: id 0


def test_t_top_k_keeps_the_most_probable_and_breaks_ties_by_lower_id():
    row = [1.0, 3.0, 3.0, 2.0, 3.0]
    np.testing.assert_allclose(T(row, top_k=1), [0, 1, 0, 0, 0])
    np.testing.assert_allclose(T(row, top_k=2), [0, 0.5, 0.5, 0, 0])
    np.testing.assert_allclose(T(row, top_k=4), softmax([-INF, 3, 3, 2, 3]))
    np.testing.assert_allclose(T(row, top_k=0), softmax(row))  # 0: no limit
    np.testing.assert_allclose(T(row, top_k=99), softmax(row))


def test_t_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    row = np.log([0.1, 0.5, 0.2, 0.2])
    np.testing.assert_allclose(T(row, top_p=0.5), [0, 1, 0, 0])  # 0.5 reaches 0.5
    np.testing.assert_allclose(T(row, top_p=0.6), [0, 5 / 7, 2 / 7, 0])  # tie 0.2: lower id
    np.testing.assert_allclose(T(row, top_p=0.85), [0, 5 / 9, 2 / 9, 2 / 9])
    np.testing.assert_allclose(T(row, top_p=1.0), [0.1, 0.5, 0.2, 0.2])
    np.testing.assert_allclose(T(row, top_p=1e-9), [0, 1, 0, 0])  # at least one id


def test_t_top_p_applies_to_the_top_k_renormalized_distribution():
    row = np.log([0.4, 0.3, 0.2, 0.1])
    # top_k 3 -> [4/9, 3/9, 2/9]; top_p 0.7 of that needs ids 0 and 1 (7/9 >= 0.7)
    np.testing.assert_allclose(T(row, top_k=3, top_p=0.7), [4 / 7, 3 / 7, 0, 0])


def test_t_min_p_drops_ids_below_a_fraction_of_the_largest():
    row = np.log([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(T(row, min_p=0.3), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    np.testing.assert_allclose(T(row, min_p=0.7), [1, 0, 0, 0])


def test_sample_rows_is_the_inverse_cdf():
    probs = np.asarray([[0.2, 0.0, 0.8]] * 5)
    uniforms = np.asarray([0.0, 0.1999, 0.2, 0.5, 0.999999])
    assert sample_rows(np, probs, uniforms).tolist() == [0, 0, 2, 2, 2]  # id 1 never drawn


# -- the rejection sampler: literal cases ---------------------------------------------------------
def _one_round(p, q, drafts, uniforms):
    a, token = rejection_sample(np, np.asarray([p], np.float64),
                                None if q is None else np.asarray([q], np.float64),
                                np.asarray([drafts], np.int64),
                                np.asarray([uniforms], np.float64))
    return int(a[0]), int(token[0])


def test_rejection_sample_literal_cases():
    onehot = np.eye(4)
    # One-hot p and q (greedy): accept exactly when the draft is the target's token.
    assert _one_round([onehot[2], onehot[1]], [onehot[2]], [2], [0.99, 0.5]) == (2, 1)  # bonus
    assert _one_round([onehot[3], onehot[1]], [onehot[2]], [2], [0.0, 0.5]) == (1, 3)  # corr.
    # Disjoint supports: always rejected, the correction comes from p.
    p = [[0.5, 0.5, 0, 0], [1, 0, 0, 0]]
    assert _one_round(p, [[0, 0, 1, 0]], [2], [0.0, 0.25]) == (1, 0)
    assert _one_round(p, [[0, 0, 1, 0]], [2], [0.0, 0.75]) == (1, 1)
    # Deterministic drafts (q None = one-hot): accepted with probability p(d).
    p = [[0.3, 0.7, 0, 0], [0, 0, 0, 1]]
    assert _one_round(p, None, [1], [0.69, 0.5]) == (2, 3)
    assert _one_round(p, None, [1], [0.70, 0.5]) == (1, 0)  # residual: p without d -> id 0
    # Three drafts, the second rejected: a = 2, the correction from max(0, p_2 - q_2).
    p = [[0, 1, 0, 0], [0.5, 0, 0.5, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    q = [[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]]
    assert _one_round(p, q, [1, 3, 0], [0.5, 0.5, 0.5, 0.6]) == (2, 2)


# -- the rejection sampler, statistically ---------------------------------------------------------
PAIRS = {  # name -> (p, q) over a small vocabulary
    "crossed": ([0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]),
    "disjoint": ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.3, 0.7]),
    "equal": ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]),
    "q_spread_p_peaked": ([0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
    "q_peaked_p_spread": ([0.1, 0.2, 0.3, 0.4], [0.0, 1.0, 0.0, 0.0]),
    "partial_overlap": ([0.6, 0.4, 0.0, 0.0, 0.0, 0.0], [0.0, 0.2, 0.3, 0.5, 0.0, 0.0]),
    "dirichlet": tuple(np.random.default_rng(5).dirichlet(np.ones(8), size=2)),
}


def speculative_samples(p_rows: np.ndarray, q_rows: np.ndarray | None, n: int, seed: int,
                        fixed_drafts: list[int] | None = None):
    """``n`` independent rounds against position-independent rows: drafts drawn from
    ``q_rows`` [k, V] (or ``fixed_drafts`` when ``q_rows`` is None), then the verifier.
    Returns (a [n], token [n], drafts [n, k])."""
    rng = np.random.default_rng(seed)
    k = len(p_rows) - 1
    if q_rows is None:
        drafts = np.tile(np.asarray(fixed_drafts, np.int64), (n, 1))
    else:
        drafts = np.stack([sample_rows(np, np.tile(q_rows[i], (n, 1)), rng.random(n))
                           for i in range(k)], axis=1)
    uniforms = rng.random((n, k + 1))
    a, token = rejection_sample(np, np.tile(p_rows, (n, 1, 1)),
                                None if q_rows is None else np.tile(q_rows, (n, 1, 1)),
                                drafts, uniforms)
    return a, token, drafts


def first_committed(a, token, drafts):
    """The round's first committed token: d_1 if accepted, else the correction."""
    return np.where(a >= 2, drafts[:, 0], token)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_speculative_samples_follow_p_with_one_draft(name):
    p, q = (np.asarray(x, np.float64) for x in PAIRS[name])
    a, token, drafts = speculative_samples(np.stack([p, p]), q[None], 100_000, seed=1)
    committed = first_committed(a, token, drafts)
    assert_follows(committed, p, name)
    # P(accept) = sum min(p, q) = 1 - TV(p, q)
    assert abs((a >= 2).mean() - np.minimum(p, q).sum()) < 0.01  # 6 standard deviations
    # TV distance to p shrinks with the sample count (each 100-fold count, a smaller
    # distance), and stays within 2 sqrt(V / n) (its expectation is below sqrt(V / n) / 2).
    counts = (300, 3_000, 30_000, 300_000)
    distances = [total_variation(first_committed(*speculative_samples(
        np.stack([p, p]), q[None], n, seed=2)), p) for n in counts]
    assert (distances[2] < distances[0] and distances[3] < distances[1]
            or max(distances) == 0), distances  # 0: p is one-hot and every sample hits it
    assert all(d < 2 * math.sqrt(len(p) / n) for d, n in zip(distances, counts, strict=True))


@pytest.mark.parametrize("name", ["crossed", "disjoint", "partial_overlap", "dirichlet"])
def test_speculative_samples_follow_p_with_three_drafts(name):
    """k = 3 with different rows per position: the first committed token follows p_1, the
    second (when the first draft is accepted) follows p_2, and the bonus follows p_4."""
    p, q = (np.asarray(x, np.float64) for x in PAIRS[name])
    p_rows = np.stack([(p + q) / 2, p, p, p[::-1]])  # p_1 … p_4 (p_1 overlaps q always)
    q_rows = np.stack([q, q, q])  # q_1 … q_3
    a, token, drafts = speculative_samples(p_rows, q_rows, 200_000, seed=3)
    assert_follows(first_committed(a, token, drafts), p_rows[0], f"{name}: first")
    second = np.where(a >= 3, drafts[:, 1], token)[a >= 2]
    assert_follows(second, p_rows[1], f"{name}: second")
    if (a == 4).sum() > 1000:
        assert_follows(token[a == 4], p_rows[3], f"{name}: bonus")


def test_a_subset_q_is_read_as_zero_beyond_its_ids():
    """A subset proposer vocabulary: q over the first V_q ids only. The sampler's result is
    the one for q padded with zeros, and the committed tokens follow p, ids >= V_q included
    (they come from the correction)."""
    p = np.asarray([0.1, 0.15, 0.05, 0.2, 0.3, 0.2])
    q = np.asarray([0.4, 0.3, 0.2, 0.1])  # V_q = 4 of the target's 6
    padded = np.concatenate([q, np.zeros(2)])
    narrow = speculative_samples(np.stack([p, p]), q[None], 100_000, seed=6)
    wide = speculative_samples(np.stack([p, p]), padded[None], 100_000, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(narrow, wide, strict=True))
    committed = first_committed(*narrow)
    assert_follows(committed, p, "subset q")
    assert (committed >= 4).mean() > 0.45  # p's mass beyond the subset: 0.5
    seam = TensorSeam()
    p_rows = Value.host(np.stack([p, p]).astype(np.float32))
    result = seam.rejection_sample(p_rows, [Value.host(q[None].astype(np.float32))], [2],
                                   [0.7, 0.9])
    assert seam.read_token_ids(result) == list(_one_round(p_rows.data, padded[None], [2],
                                                          [0.7, 0.9]))


def test_deterministic_drafts_follow_p():
    """q = δ_d (prompt lookup): accept with probability p(d); else a draw from p without d."""
    p = np.asarray([0.1, 0.6, 0.3, 0.0])
    for draft in (1, 3):  # a likely draft, and one p gives no mass
        a, token, drafts = speculative_samples(np.stack([p, p]), None, 200_000, seed=4,
                                               fixed_drafts=[draft])
        assert_follows(first_committed(a, token, drafts), p, f"draft {draft}")
        assert abs((a >= 2).mean() - p[draft]) < 5e-3


def test_seeded_samples_are_reproducible():
    p, q = (np.asarray(x) for x in PAIRS["crossed"])
    one = speculative_samples(np.stack([p, p]), q[None], 1000, seed=9)
    two = speculative_samples(np.stack([p, p]), q[None], 1000, seed=9)
    other = speculative_samples(np.stack([p, p]), q[None], 1000, seed=10)
    assert all(np.array_equal(x, y) for x, y in zip(one, two, strict=True))
    assert not np.array_equal(one[1], other[1])


# -- the seam ops ---------------------------------------------------------------------------------
def test_seam_sampling_ops_match_the_math():
    seam = TensorSeam()
    scores = Value.host(np.asarray([[[1.0, 2.0, NAN, 0.5], [0.0, 0.0, 3.0, -INF]]], np.float32))
    sampling = Sampling(0.7, top_k=3, top_p=0.95)
    probs = seam.distribution_rows(scores, sampling)
    assert probs.shape == (2, 4) and probs.dtype == "float32"
    expected = distribution_rows(np, scores.data.reshape(2, 4).astype(np.float64), sampling)
    np.testing.assert_array_equal(probs.data, expected.astype(np.float32))
    ids = seam.sample_rows(probs, [0.3, 0.99])
    assert ids.kind == "token_ids" and ids.dtype == "int32"
    assert seam.read_token_ids(ids) == sample_rows(np, probs.data, np.asarray([0.3, 0.99])
                                                   ).tolist()
    p = seam.distribution_rows(scores, Sampling(1.0))
    q = [seam.distribution_rows(Value.host(np.asarray([[0.0, 9.0, 0.0, 0.0]], np.float32)),
                                Sampling(1.0))]
    result = seam.rejection_sample(p, q, [1], [0.2, 0.4])
    assert result.kind == "token_ids" and result.shape == (2,)
    a, token = seam.read_token_ids(result)
    assert (a, token) == _one_round(p.data, q[0].data, [1], [0.2, 0.4])
    one_row = seam.slice_axis(p, 0, 0, 1)
    for no_q in (None, []):  # k = 0 (a greedy step under sampling): a = 1
        assert seam.read_token_ids(seam.rejection_sample(one_row, no_q, [], [0.5]))[0] == 1


@pytest.mark.parametrize(("call", "words"), [
    (lambda s, p: s.rejection_sample(p, None, [1, 2], [0.1, 0.2]), "rows for 2 drafts"),
    (lambda s, p: s.rejection_sample(p, None, [7], [0.1, 0.2]), "outside [0, 4)"),
    (lambda s, p: s.rejection_sample(p, None, [1], [0.1]), "needs 2 uniforms"),
    (lambda s, p: s.rejection_sample(p, None, [1], [0.1, 1.0]), "needs 2 uniforms"),
    (lambda s, p: s.rejection_sample(p, [Value.host(np.full((1, 5), 0.2, np.float32))], [1],
                                     [0.1, 0.2]), "wider than p"),
    (lambda s, p: s.rejection_sample(p, [Value.host(np.full((1, 2), 0.5, np.float32))], [3],
                                     [0.1, 0.2]), "draft ids [3] outside [0, 2)"),
    (lambda s, p: s.sample_rows(p, [0.5]), "needs 2 uniforms"),
    (lambda s, p: s.sample_rows(Value.host(np.zeros((2, 4), np.float16)), [0.1, 0.2]),
     "float32 probability rows"),
    (lambda s, p: s.distribution_rows(Value.host(np.zeros((1, 4), np.float32)),
                                      Sampling(0.0)), "temperature 0.0"),
    (lambda s, p: s.distribution_rows(Value.host(np.zeros((1, 0), np.float32)),
                                      Sampling(1.0)), "width 0"),
])
def test_seam_sampling_ops_refuse_bad_arguments(call, words):
    seam = TensorSeam()
    p = seam.distribution_rows(Value.host(np.zeros((2, 4), np.float32)), Sampling(1.0))
    with pytest.raises(ContractError) as caught:
        call(seam, p)
    assert words in str(caught.value)
    assert p.residency == HOST


# -- end to end -----------------------------------------------------------------------------------
def test_every_proposer_kind_has_one_entry_under_its_one_spelling():
    assert list(KINDS) == ["chained", "draft", "prompt_lookup", "lookup_chained"]
    assert all(kind.name == name for name, kind in KINDS.items())


@pytest.fixture(scope="module")
def engines(pair_engine, draft_engine, decoder8_root):
    import speculant

    return {"chained": pair_engine(), "draft": draft_engine(deviation_positions=DRAFT_DEVIATIONS),
            "prompt_lookup": speculant.load(decoder8_root)}


def expected_greedy_trace(proposer, prompt, k):
    if proposer == "chained":
        return reference_trace(prompt, k, MAX_NEW)
    return speculative_trace(SPEC, list(prompt), MAX_NEW, k, rollback_bound=8,
                             proposer=DRAFT_SPEC if proposer == "draft" else proposer)


@pytest.mark.parametrize("k", (1, 2, 4, 8))
@pytest.mark.parametrize("proposer", ["chained", "draft", "prompt_lookup"])
def test_temperature_zero_is_greedy(engines, proposer, k):
    """E7: temperature 0 is the greedy path, bit for bit (the sampling knobs are inert)."""
    engine = engines[proposer]
    for prompt in (PROBE_PROMPT, REPETITIVE[0]):
        result = engine.generate(list(prompt), MAX_NEW, proposer=proposer, k=k, temperature=0.0,
                                 top_k=3, top_p=0.5, seed=11)
        trace = expected_greedy_trace(proposer, prompt, k)  # its tokens are the greedy stream
        assert result.token_ids == trace.tokens
        assert result.stats.trace == trace.pairs()
        assert result.stats.sampled_rows == 0


@pytest.mark.parametrize("acceptance", ["gumbel", "rejection"])
@pytest.mark.parametrize("k", (1, 2, 4, 8))
@pytest.mark.parametrize("proposer", ["chained", "draft", "prompt_lookup"])
def test_top_k_one_reproduces_the_greedy_trace(engines, proposer, k, acceptance):
    """Sampling with top_k = 1 makes every T(row) one-hot at the argmax: the sampled run,
    by keyed draws or rejection sampling, takes exactly the greedy (k_r, a_r) trace for any
    seed."""
    engine = engines[proposer]
    for prompt, seed in ((PROBE_PROMPT, 0), (REPETITIVE[0], 5)):
        result = engine.generate(list(prompt), MAX_NEW, proposer=proposer, k=k,
                                 temperature=2.0, top_k=1, seed=seed, acceptance=acceptance)
        trace = expected_greedy_trace(proposer, prompt, k)
        assert result.token_ids == trace.tokens
        assert result.stats.trace == trace.pairs()
        assert result.stats.argmax_rows == 0 and result.stats.sampled_rows > 0


@pytest.mark.parametrize("acceptance", ["gumbel", "rejection"])
@pytest.mark.parametrize("proposer", [None, "chained", "draft", "prompt_lookup"])
def test_seeded_runs_are_reproducible(engines, proposer, acceptance):
    """At a fixed k both methods reproduce (at any k: keyed draws, test_seeded.py)."""
    engine = engines[proposer or "chained"]
    options = {"proposer": proposer, "k": 4, "acceptance": acceptance} if proposer else \
        {"acceptance": acceptance}
    runs = {seed: [engine.generate(list(PROBE_PROMPT), 24, temperature=3.0, seed=seed,
                                   **options) for _ in range(2)] for seed in (1, 2)}
    for first, second in runs.values():
        assert first.token_ids == second.token_ids
        assert first.stats.trace == second.stats.trace
    assert runs[1][0].token_ids != runs[2][0].token_ids


TEMPERATURE = 3.0  # the fixture's margin-8 rows give p(chosen) = 0.32, 0.022 for each other id
NUM_SEEDS = 400
NUM_TOKENS = 3  # the prefill's token, then the tokens the first round commits


def sampled_tokens(engine, prompt, proposer, k, num_seeds=NUM_SEEDS, acceptance="gumbel"):
    """[num_seeds, NUM_TOKENS] generated tokens, one seed per row (no stop on EOS)."""
    options = {"proposer": proposer, "k": k} if proposer else {}
    options["acceptance"] = acceptance
    budget = max(k + 2, NUM_TOKENS)  # room for a full first round of k drafts
    rows = []
    for seed in range(num_seeds):
        result = engine.generate(list(prompt), budget, temperature=TEMPERATURE, seed=seed,
                                 stop_on_eos=False, **options)
        rows.append(result.token_ids[:NUM_TOKENS])
    return np.asarray(rows)


@pytest.mark.parametrize(("proposer", "k", "prompt", "acceptance"), [
    (None, 0, PROBE_PROMPT, "gumbel"),
    ("chained", 1, PROBE_PROMPT, "gumbel"),
    ("chained", 2, PROBE_PROMPT, "gumbel"),
    ("chained", 4, PROBE_PROMPT, "gumbel"),
    ("draft", 2, (7, 8, 9, 10, 11, 12, 13), "gumbel"),  # the draft disagrees at position 7
    ("prompt_lookup", 2, REPETITIVE[0], "gumbel"),
    (None, 0, PROBE_PROMPT, "rejection"),
    ("chained", 2, PROBE_PROMPT, "rejection"),
    ("draft", 2, (7, 8, 9, 10, 11, 12, 13), "rejection"),
    ("prompt_lookup", 2, REPETITIVE[0], "rejection"),
])
def test_committed_tokens_follow_the_target_distribution(engines, proposer, k, prompt,
                                                         acceptance):
    """E7 / evidence.md §5: over many seeds, each of the first generated tokens follows the
    target's exact sampled marginal (enumerated from the fixture's definition), which plain
    sampling follows too (the first row) — by keyed draws (one noise per seed) and by
    rejection sampling alike."""
    engine = engines[proposer or "chained"]
    samples = sampled_tokens(engine, prompt, proposer, k, acceptance=acceptance)
    marginals = exact_marginals(SPEC, prompt, NUM_TOKENS, TEMPERATURE)
    for i in range(NUM_TOKENS):
        assert_follows(samples[:, i], marginals[i],
                       f"{proposer} k={k} {acceptance}: token {i + 1}")
    if proposer is not None:
        stats = engine.generate(list(prompt), k + 2, temperature=TEMPERATURE, seed=0,
                                proposer=proposer, k=k, stop_on_eos=False).stats
        assert stats.sampled_rows > 0


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "value"), [
    ("temperature", -0.5), ("temperature", math.nan), ("top_k", -1), ("top_p", 0.0),
    ("top_p", 1.5), ("top_p", -0.1), ("min_p", -0.1), ("min_p", 1.5), ("seed", -3),
    ("acceptance", "maximal"), ("acceptance", None),
])
def test_bad_sampling_settings(engines, option, value):
    engine = engines["chained"]
    for options in ({}, {"speculative": True, "k": 2}):
        with pytest.raises(RequestError) as caught:
            engine.generate(list(PROBE_PROMPT), 4, **{"temperature": 1.0, **options,
                                                      option: value})
        assert caught.value.paths == [option]
        assert option in str(caught.value)
