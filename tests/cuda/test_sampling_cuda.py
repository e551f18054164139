"""Sampling on CUDA (runtime.md §17, residency.md §5): the seam's sampling operations against
the host's, and only ids read back.

``tensors/sampling.py`` is one definition run over numpy (host) and CuPy (CUDA). Integer
results — drawn ids, the accepted count — must be identical. Probability rows are compared to
a relative 1e-6: float64 ``exp`` on the device and in numpy's libm may differ in the last
ulp, which the float32 rows almost never show; which ids carry mass must be identical.

Run on the GPU machine: ``pytest -m cuda tests/cuda``.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from gpu_probe import cuda_marks

from speculant.tensors import HOST, NUMPY_DTYPES, TensorSeam, Value, make_seam
from speculant.tensors.sampling import Sampling

pytestmark = cuda_marks(needs_ort_cuda=False)

DEVICE = "cuda:0"
FLOATS = ("float32", "float16", "bfloat16")
SETTINGS = (Sampling(1.0), Sampling(0.6, top_k=5), Sampling(1.3, top_p=0.8),
            Sampling(2.0, top_k=40, top_p=0.95, min_p=0.05), Sampling(0.8, min_p=0.2))
NAN, INF = math.nan, math.inf


@pytest.fixture
def cuda_seam() -> TensorSeam:
    return make_seam(DEVICE)


@pytest.fixture
def host_seam() -> TensorSeam:
    return TensorSeam()


def read(seam: TensorSeam, value: Value) -> np.ndarray:
    """A device value's bytes on the host (through a seam whose counters do not matter)."""
    return make_seam(DEVICE).adopt(value, HOST).data if value.residency != HOST else value.data


def scores(rng: np.random.Generator, rows: int, width: int, dtype: str) -> Value:
    array = rng.standard_normal((1, rows, width)).astype(np.float32) * 3
    array[0, 0, rng.integers(0, width, 3)] = NAN
    array[0, -1, rng.integers(0, width, 2)] = -INF
    array[0, rows // 2, :] = np.round(array[0, rows // 2, :])  # ties
    return Value.host(array.astype(NUMPY_DTYPES[dtype]), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: repr(s)[9:-1])
def test_distribution_and_draw_agree(cuda_seam, host_seam, dtype, setting):
    rng = np.random.default_rng(0)
    for rows, width in ((1, 32), (5, 1000), (3, 50_000)):
        host_scores = scores(rng, rows, width, dtype)
        device_scores = cuda_seam.adopt(host_scores, DEVICE)
        host_probs = host_seam.distribution_rows(host_scores, setting)
        device_probs = cuda_seam.distribution_rows(device_scores, setting)
        assert device_probs.residency == DEVICE and device_probs.dtype == "float32"
        got = read(cuda_seam, device_probs)
        assert got.shape == host_probs.shape == (rows, width)
        np.testing.assert_array_equal(got > 0, host_probs.data > 0)  # the same support
        np.testing.assert_allclose(got, host_probs.data, rtol=1e-6, atol=1e-30)
        uniforms = rng.random(rows).tolist()
        same_rows = cuda_seam.adopt(host_probs, DEVICE)  # identical input bits: ids must match
        assert cuda_seam.read_token_ids(cuda_seam.sample_rows(same_rows, uniforms)) == \
            host_seam.read_token_ids(host_seam.sample_rows(host_probs, uniforms))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: repr(s)[9:-1])
def test_keyed_draws_agree(cuda_seam, host_seam, dtype, setting):
    """The keyed noise is integer arithmetic up to u, identical on both; the ids drawn by
    Gumbel-max from the same scores match the host's (a float64 ulp of exp or log could flip
    only an exact tie, which these rows do not have)."""
    rng = np.random.default_rng(1)
    for rows, width, start in ((1, 32, 0), (5, 1000, 77), (3, 50_000, 2**40)):
        host_scores = scores(rng, rows, width, dtype)
        key = int(rng.integers(0, 2**63))
        want = host_seam.read_token_ids(host_seam.sample_keyed(host_scores, setting, key, start))
        result = cuda_seam.sample_keyed(cuda_seam.adopt(host_scores, DEVICE), setting, key, start)
        assert result.residency == DEVICE and result.kind == "token_ids"
        assert cuda_seam.read_token_ids(result) == want


def test_keyed_noise_is_bitwise_the_hosts():
    import cupy as cp

    from speculant.tensors.sampling import keyed_gumbel, seed_key

    positions = np.asarray([0, 1, 5, 2**33], np.uint64)
    host = keyed_gumbel(np, seed_key(7), positions, 4096)
    device = cp.asnumpy(keyed_gumbel(cp, seed_key(7), cp.asarray(positions), 4096))
    np.testing.assert_allclose(device, host, rtol=1e-13, atol=1e-13)  # log: ulps at most


@pytest.mark.parametrize("k", (0, 1, 3, 8))
@pytest.mark.parametrize(("deterministic", "q_width"), ((False, 64), (True, 64), (False, 40)))
def test_rejection_sample_agrees(cuda_seam, host_seam, k, deterministic, q_width):
    """q_width 40 of 64: a subset proposer vocabulary (q read as 0 beyond its ids)."""
    rng = np.random.default_rng(k)
    width = 64
    for _ in range(50):
        p = Value.host(rng.dirichlet(np.full(width, 0.3), k + 1).astype(np.float32))
        q_rows = [Value.host(rng.dirichlet(np.full(q_width, 0.3), 1).astype(np.float32))
                  for _ in range(k)]
        drafts = [int(rng.integers(0, width)) if deterministic else
                  int(rng.choice(q_width, p=row.data[0] / row.data[0].sum())) for row in q_rows]
        uniforms = rng.random(k + 1).tolist()
        q_host = None if deterministic else q_rows
        q_device = None if deterministic else [cuda_seam.adopt(r, DEVICE) for r in q_rows]
        want = host_seam.read_token_ids(host_seam.rejection_sample(p, q_host, drafts, uniforms))
        result = cuda_seam.rejection_sample(cuda_seam.adopt(p, DEVICE), q_device, drafts,
                                            uniforms)
        assert result.residency == DEVICE and result.kind == "token_ids"
        assert cuda_seam.read_token_ids(result) == want


def test_sampling_reads_back_ids_only(cuda_seam):
    rng = np.random.default_rng(3)
    counters = cuda_seam.counters
    gc.collect()
    base = (counters.live_device_allocations, counters.live_device_bytes)
    logits = cuda_seam.adopt(scores(rng, 4, 4096, "float16"), DEVICE)
    start = counters.device_readback_bytes
    p = cuda_seam.distribution_rows(logits, Sampling(1.0, top_k=50))
    q = [cuda_seam.slice_axis(cuda_seam.distribution_rows(logits, Sampling(2.0)), 0, i, 1)
         for i in range(3)]
    ids = cuda_seam.sample_rows(p, [0.1, 0.2, 0.3, 0.4])
    assert counters.device_readback_bytes == start  # nothing crossed yet
    assert len(cuda_seam.read_token_ids(ids)) == 4
    assert counters.device_readback_bytes == start + 4 * 4
    a, token = cuda_seam.read_token_ids(cuda_seam.rejection_sample(p, q, [1, 2, 3],
                                                                   [0.5, 0.5, 0.5, 0.5]))
    assert 1 <= a <= 4 and 0 <= token < 4096
    assert counters.device_readback_bytes == start + 4 * 4 + 8
    assert counters.host_staging_count == 0
    del logits, p, q, ids
    gc.collect()
    assert (counters.live_device_allocations, counters.live_device_bytes) == base
