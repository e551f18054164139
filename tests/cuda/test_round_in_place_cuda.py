"""The round without host round trips on the GPU (issue 12 items 2 and 4): on static caches a
pass writes its token ids, positions and lengths where the plan's buffers are (no upload),
a greedy chained proposal keeps its drafts on the device and the round verifies them there,
so the host reads back exactly ``4 (k_r + 2)`` bytes per round (``a`` and the committed
ids) and 4 per single-token pass; over 1,000 rounds speculant's live device allocations and
the device's free memory stay flat.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_round_in_place_cuda.py``.
"""

from __future__ import annotations

import gc

import pytest
from gpu_probe import cuda_marks

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.session.plan import CAPTURE_RUNS
from speculant_tools.export import convert, write_pair_package

pytestmark = cuda_marks()
PROMPT = [3, 17, 8, 22, 5, 3, 17, 8]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    base = tmp_path_factory.mktemp("in-place")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {cache: write_pair_package(base / cache, TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                                      tokenizer, dtype="float16", graph="fused", cache=cache)
            for cache in ("appended", "static")}


@pytest.fixture(scope="module")
def demo_static(tmp_path_factory):
    """The trained demo pair with static caches (drafts land, so rounds accept some)."""
    demo = speculant.__file__.rsplit("/", 1)[0] + "/demo"
    return convert(demo, tmp_path_factory.mktemp("demo") / "static", "float16", cache="static")


def delta(before: dict, after: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("graphs", [False, "auto"])
@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_the_round_in_place_equals_greedy_eager_and_replayed(pairs, k, graphs, overlap):
    greedy = speculant.load(pairs["appended"], device="cuda").generate(
        PROMPT, 40, stop_on_eos=False).token_ids
    engine = speculant.load(pairs["static"], device="cuda", cuda_graphs=graphs,
                            overlap=overlap)
    result = engine.generate(PROMPT, 40, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy
    plans = engine.static_pool._cells  # every plan of every capacity used
    target_plans = [plan for cells in plans.values() for plan in cells.plans.values()]
    overlapped = overlap and bool(graphs)  # only captured plans run unsynchronized
    assert target_plans and all(plan.is_overlapped == overlapped for plan in target_plans)
    if graphs:
        assert result.stats.residency["graph_replays"] > 0


def test_a_round_reads_back_only_the_count_and_the_committed_ids(demo_static):
    engine = speculant.load(demo_static, device="cuda")
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    for num_tokens in (24, 64):  # every plan and graph these requests use (a width first
        # used at a budget's end makes its plan then: drafter v2 left one to the 64-token run)
        engine.generate(prompt, num_tokens, speculative=True, k=4, stop_on_eos=False)
    counts = {}
    for num_tokens in (24, 64):
        before = engine.seam.counters.snapshot()
        result = engine.generate(prompt, num_tokens, speculative=True, k=4, stop_on_eos=False)
        counts[num_tokens] = moved = delta(before, engine.seam.counters.snapshot())
        stats = result.stats
        assert stats.accepted_drafts > 0 and stats.rounds > 0
        expected = 4 * (1 + stats.greedy_steps) + sum(4 * (k_r + 2) for k_r, _ in stats.trace)
        assert moved["device_readback_bytes"] == expected, (moved, stats.trace)
        assert moved["host_staging_count"] == 0
        assert stats.rollback_bytes_moved == 0 and stats.rollbacks > 0
    # the uploads a request makes do not grow with its rounds: none per pass (the prompt's
    # one-off prefill plan is the same for both)
    assert counts[24]["uploads"] == counts[64]["uploads"]


def test_live_allocations_and_free_memory_stay_flat_over_1000_rounds(demo_static):
    import cupy

    engine = speculant.load(demo_static, device="cuda")
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    for _ in range(2):  # warm-up at the loop's own settings: every width's plan and graph
        engine.generate(prompt, 96, speculative=True, k=4, stop_on_eos=False)
    gc.collect()  # earlier tests' garbage is not this loop's: the baseline without it
    counters = engine.seam.counters
    live = (counters.live_device_allocations, counters.live_device_bytes)
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    rounds = 0
    while rounds < 1000:
        result = engine.generate(prompt, 96, speculative=True, k=4, stop_on_eos=False)
        rounds += result.stats.rounds
        now = (counters.live_device_allocations, counters.live_device_bytes)
        assert now == live, (rounds, now, live)
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert abs(free_before - free_after) < 64 * 2**20, (free_before, free_after)


@pytest.mark.parametrize("seed", range(40))
def test_the_accept_kernel_is_the_host_rule(seed):
    """cuda_kernels.accept_greedy (one launch) == tensors/acceptance.py over numpy, element
    for element, on drafts that match their choices for a random prefix."""
    import numpy as np

    from speculant.tensors import Value, make_seam
    from speculant.tensors.acceptance import accept_greedy

    seam = make_seam("cuda")
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 17))
    choices = rng.integers(0, 5, size=k + 1).astype(np.int32)
    drafts = np.where(rng.random(k) < 0.75, choices[:k], rng.integers(0, 5, size=k))
    drafts = drafts.astype(np.int32)
    on_device = [seam.adopt(Value.host(a, "int32"), "cuda:0") for a in (drafts, choices)]
    got = seam.read_token_ids(seam.accept_greedy(*on_device))
    assert got == accept_greedy(np, drafts, choices).tolist()


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_the_small_writes_match_the_host(dtype):
    """write_ints (values as kernel arguments, four per launch) and write_arange (one kernel)
    write what the host backend writes, at every offset and count."""

    from speculant.tensors import make_seam

    seam, host = make_seam("cuda"), make_seam("cpu")
    for size, values, offset in ((1, [7], 0), (9, [3, -2, 5, 2**40 if dtype == "int64" else 9,
                                                   11, 12], 2), (12, [4] * 12, 0)):
        device_buffer, host_buffer = (s.zeros((size,), dtype, r) for s, r in
                                      ((seam, "cuda:0"), (host, "host")))
        seam.write_ints(device_buffer, values, offset)
        host.write_ints(host_buffer, values, offset)
        assert seam.adopt(device_buffer, "host").data.tolist() == host_buffer.data.tolist()
        seam.write_arange(device_buffer, 1000)
        host.write_arange(host_buffer, 1000)
        assert seam.adopt(device_buffer, "host").data.tolist() == host_buffer.data.tolist()


@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_greedy_chained_proposal_on_the_device_is_one_replay(pairs, k):
    """On CUDA the chain runs unrolled (chain_graph.chain_component): one captured run per
    proposal, the step session only for its checked run; greedy's tokens."""
    greedy = speculant.load(pairs["appended"], device="cuda").generate(
        PROMPT, 40, stop_on_eos=False).token_ids
    engine = speculant.load(pairs["static"], device="cuda")  # a device's default: unrolled
    assert engine.proposer.chain_session is not None
    result = engine.generate(PROMPT, 40, speculative=True, k=k, stop_on_eos=False)
    assert result.token_ids == greedy
    chains = engine.proposer._chain_sessions
    assert chains and all(session.graphs.is_enabled for session in chains.values())
    # one run a round, and the warm-up's capture of width k before the first
    assert sum(s.num_invocations for s in chains.values()) == result.stats.rounds + CAPTURE_RUNS
    assert engine.sessions[engine.package.plan.proposer].num_invocations == 1


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_an_int4_drafter_runs_in_place_replayed_and_keeps_greedy(demo_static, tmp_path, k):
    """``--quantize-drafter int4`` on CUDA: MatMulNBits in the captured chain, the outputs
    greedy's, drafts still accepted, the round still reading back only ids and count."""
    quantized = convert(demo_static, tmp_path / "int4", "float16", quantize_drafter="int4")
    engine = speculant.load(quantized, device="cuda")
    prompt = engine.tokenizer.encode("def fibonacci(n):\n")
    greedy = engine.generate(prompt, 48, stop_on_eos=False).token_ids
    engine.generate(prompt, 48, speculative=True, k=k, stop_on_eos=False)  # plans, graphs
    before = engine.seam.counters.snapshot()
    result = engine.generate(prompt, 48, speculative=True, k=k, stop_on_eos=False)
    moved = delta(before, engine.seam.counters.snapshot())
    stats = result.stats
    assert result.token_ids == greedy
    assert stats.accepted_drafts > 0 and stats.residency["graph_replays"] > 0
    assert moved["host_staging_count"] == 0 and stats.rollback_bytes_moved == 0
    rounds = sum(4 * (k_r + 2) for k_r, _ in stats.trace)  # a and the committed ids
    if k == "auto":  # a greedy step k=auto queues is a round of width 0 (a and c_1: 8
        # bytes), one it runs alone reads its id (4): the stats do not tell them apart
        assert 4 * (1 + stats.greedy_steps) + rounds <= moved["device_readback_bytes"] \
            <= 8 * (1 + stats.greedy_steps) + rounds, (moved, stats.trace)
    else:
        assert moved["device_readback_bytes"] == 4 * (1 + stats.greedy_steps) + rounds, \
            (moved, stats.trace)
