"""Greedy with a pass queued ahead of the host, on the GPU (speculative/round.py's
``launch_step``): each pass's argmax is the next pass's token where it was made, its 4 bytes
are read back after the next pass is queued (waiting for that event alone, on a second
stream), and target passes are timed by events asked later, so nothing makes the device wait
for the host between tokens. Tokens equal the appended greedy decode; a stop with a pass in
flight leaves the state exact; 4 bytes per token cross, nothing is staged; allocations and
free memory stay flat over 1,000 passes.

Run on the GPU machine: ``pytest -m cuda tests/cuda/test_greedy_ahead_cuda.py``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from gpu_probe import cuda_marks

import speculant
from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
from speculant.tensors import Value
from speculant.tensors.devices import make_seam
from speculant_tools.export import write_pair_package

pytestmark = cuda_marks()
PROMPT = [3, 17, 8, 22, 5, 3, 17, 8]
NEW = 40


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ahead")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {cache: write_pair_package(base / cache, TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                                      tokenizer, dtype="float16", graph="fused", cache=cache)
            for cache in ("appended", "static")}


@pytest.fixture(scope="module")
def greedy(pairs):
    return speculant.load(pairs["appended"], device="cuda").generate(
        PROMPT, NEW, stop_on_eos=False).token_ids


def delta(before: dict, after: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize("graphs", [False, "auto"])
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_queued_greedy_passes_decode_greedy_and_read_back_4_bytes_a_token(pairs, greedy,
                                                                          graphs, depth):
    engine = speculant.load(pairs["static"], device="cuda", cuda_graphs=graphs)
    assert engine.target.queue_depth == 1  # the device's default
    engine.target.queue_depth = depth
    engine.generate(PROMPT, NEW, stop_on_eos=False)  # plans and graphs
    before = engine.seam.counters.snapshot()
    result = engine.generate(PROMPT, NEW, stop_on_eos=False)
    moved = delta(before, engine.seam.counters.snapshot())
    assert result.token_ids == greedy
    assert moved["device_readback_bytes"] == 4 * NEW  # the prefill's choice, then one a pass
    assert moved["host_staging_count"] == 0 and result.stats.rollback_bytes_moved == 0
    if graphs:
        assert moved["graph_replays"] == NEW - 1 and moved["graph_captures"] == 0


def test_a_stop_with_a_pass_in_flight_leaves_the_state_exact(pairs, greedy):
    engine = speculant.load(pairs["static"], device="cuda")
    stop_at = greedy.index(greedy[9])
    stopped = engine.generate(PROMPT, NEW, stop_token_ids=[greedy[9]])
    assert stopped.token_ids == greedy[:stop_at + 1]
    assert stopped.stats.stop_reason == "eos"
    again = engine.generate(PROMPT, NEW, stop_on_eos=False)  # the same buffers and plans
    assert again.token_ids == greedy


def test_target_passes_are_timed_without_waiting_and_the_times_are_the_work(pairs):
    """k="auto"'s costs observe target passes by events around their replay; asked after
    the decode, each is a positive time below the decode's own wall clock."""
    engine = speculant.load(pairs["static"], device="cuda")
    costs = engine.proposer_sources.costs
    target = engine.sessions[engine.package.plan.target]
    target.observers.append(costs.verify_observer(target.ports.roles))  # as k="auto" does
    result = engine.generate(PROMPT, NEW, stop_on_eos=False)
    assert costs.unsettled  # observed, not asked: asking at once would wait for the replay
    calls = [call for _, call in costs.unsettled]
    seconds = [call.seconds for call in calls]
    assert all(0 < s < result.total_s for s in seconds), seconds
    assert costs.verify_total > 0 and not costs.unsettled


def test_a_later_read_waits_for_its_own_work_alone():
    """read_token_ids_later: the ids written before the mark come back while a long kernel
    queued after it is still running (the copy waited for the mark's event alone)."""
    import cupy

    seam = make_seam("cuda")
    ids = seam.adopt(Value.host(np.array([5, 9], np.int32), "int32"), "cuda:0")
    ids = Value(ids.data, ids.residency, "int32", owned=True, kind="token_ids")
    finish = seam.read_token_ids_later(ids)
    spin = cupy.RawKernel(r'''
        extern "C" __global__ void spin(long long cycles) {
            long long start = clock64();
            while (clock64() - start < cycles) {}
        }''', "spin")
    with seam.backend("cuda:0").stream:
        spin((1,), (1,), (cupy.int64(2_000_000_000),))  # about a second at ~2 GHz
        after = seam.backend("cuda:0").stream.record()
    before = seam.counters.device_readback_bytes
    assert finish() == [5, 9]
    assert not after.done  # the spin queued after the mark still runs
    assert seam.counters.device_readback_bytes - before == 8
    after.synchronize()


def test_live_allocations_and_free_memory_stay_flat_over_1000_greedy_passes(pairs):
    import cupy

    engine = speculant.load(pairs["static"], device="cuda")
    for _ in range(2):
        engine.generate(PROMPT, NEW, stop_on_eos=False)
    gc.collect()  # earlier tests' garbage is not this loop's: the baseline without it
    counters = engine.seam.counters
    live = (counters.live_device_allocations, counters.live_device_bytes)
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    passes = 0
    while passes < 1000:
        passes += engine.generate(PROMPT, NEW, stop_on_eos=False).stats.target_passes
        assert (counters.live_device_allocations, counters.live_device_bytes) == live
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert abs(free_before - free_after) < 64 * 2**20, (free_before, free_after)
