"""The CUDA seam against the host seam, byte for byte (residency.md §5, evidence.md §5).

Every comparison goes through :func:`assert_same` (shape, then dtype, then bytes). Inputs are
fresh random bits on every run; the seed is printed (shown on failure) and can be pinned with
``SPECULANT_TEST_SEED=<n>``. Whether a GPU is present is decided by asking CuPy's runtime
directly, never the code under test, so a seam regression fails here instead of skipping.

Run on the GPU machine: ``pytest -m cuda tests/tensors`` (PYTHONPATH pointing at src/).
"""

from __future__ import annotations

import gc
import math
import os
import secrets
import shutil

import ml_dtypes
import numpy as np
import pytest

from speculant.dtypes import DTYPES as DTYPE_TABLE
from speculant.errors import ContractError, ResidencyError
from speculant.session.binding import adopt_output, bind_input, bind_output, stream_provider_options
from speculant.tensors import HOST, NUMPY_DTYPES, TensorSeam, Value, make_seam


def _why_no_gpu() -> str | None:
    """The reason these tests cannot run here, or None. Deliberately not speculant code."""
    try:
        import cupy
    except ImportError:
        gpu = " although nvidia-smi is present" if shutil.which("nvidia-smi") else ""
        return f"CuPy is not installed{gpu} (pip install 'speculant[cuda]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except (RuntimeError, OSError) as exc:  # CUDARuntimeError: no driver / no device
        return f"no usable CUDA device ({exc})"
    return None if count > 0 else "no CUDA device (getDeviceCount() == 0)"


NO_GPU = _why_no_gpu()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]

DEVICE = "cuda:0"
DTYPES = ["float32", "float16", "bfloat16", "int64", "bool"]
FLOATS = ["float32", "float16", "bfloat16"]
NAN, INF = float("nan"), float("inf")


# -- the one differential helper --------------------------------------------------------------
_reader: TensorSeam | None = None


def assert_same(host_value: Value, cuda_value: Value) -> None:
    """The CUDA result, adopted to the host, equals the host result: shape, dtype, bytes.

    Reads through a seam of its own, so the counters of the seam under test do not move.
    """
    global _reader
    if _reader is None:
        _reader = make_seam(DEVICE)
    assert host_value.residency == HOST
    if host_value.size == 0:
        assert cuda_value.residency == HOST, f"S2: empty result on {cuda_value.residency}"
    elif cuda_value.residency == HOST:
        pass  # an adopted value compared with its source
    else:
        assert cuda_value.residency.startswith("cuda:"), cuda_value.residency
    got = _reader.adopt(cuda_value, HOST)
    assert got.shape == host_value.shape, f"shape {got.shape} != {host_value.shape}"
    assert got.dtype == host_value.dtype, f"dtype {got.dtype} != {host_value.dtype}"
    assert got.data.dtype == NUMPY_DTYPES[host_value.dtype]
    assert got.kind == host_value.kind, f"kind {got.kind} != {host_value.kind}"
    want = np.ascontiguousarray(host_value.data).tobytes()
    have = np.ascontiguousarray(got.data).tobytes()
    if have != want:
        diff = np.flatnonzero(np.frombuffer(have, np.uint8) != np.frombuffer(want, np.uint8))
        pytest.fail(f"bytes differ at byte offsets {diff[:8].tolist()} "
                    f"({len(diff)} of {len(want)}): {got.describe()}")


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def rng(record_property) -> np.random.Generator:
    seed = int(os.environ.get("SPECULANT_TEST_SEED", secrets.randbits(32)))
    print(f"random seed: SPECULANT_TEST_SEED={seed}")
    record_property("seed", seed)
    return np.random.default_rng(seed)


@pytest.fixture
def cp():
    import cupy

    return cupy


@pytest.fixture
def cuda_seam() -> TensorSeam:
    return make_seam(DEVICE)


@pytest.fixture
def host_seam() -> TensorSeam:
    return TensorSeam()


def random_host(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> Value:
    """Random bits of ``dtype`` (NaN payloads and infinities included for floats)."""
    count = math.prod(shape)
    if dtype == "bool":
        array = rng.integers(0, 2, count).astype(np.bool_)
    elif dtype == "int64":
        array = rng.integers(-(2**62), 2**62, count, dtype=np.int64)
    else:
        words = np.uint32 if dtype == "float32" else np.uint16
        array = rng.integers(0, np.iinfo(words).max, count, dtype=words, endpoint=True)
        array = array.view(NUMPY_DTYPES[dtype])
    return Value.host(array.reshape(shape), dtype)


def both(cuda_seam: TensorSeam, host_value: Value) -> tuple[Value, Value]:
    return host_value, cuda_seam.adopt(host_value, DEVICE)


def device_range(v: Value) -> tuple[int, int]:
    start = int(v.data.data.ptr)
    return start, start + v.nbytes


def shares_device_memory(a: Value, b: Value) -> bool:
    (a0, a1), (b0, b1) = device_range(a), device_range(b)
    return a0 < b1 and b0 < a1


def windows(extent: int) -> list[tuple[str, int, int]]:
    kinds = [("first", 0, 1), ("middle", extent // 2, 1), ("last", extent - 1, 1),
             ("empty", extent // 2, 0), ("whole", 0, extent), ("prefix", 0, extent - 1),
             ("inner", 1, extent - 2)]
    return [(k, s, n) for k, s, n in kinds if s >= 0 and n >= 0 and s + n <= extent]


def shapes(rng: np.random.Generator) -> list[tuple[int, ...]]:
    seq = int(rng.integers(3, 10))
    return [(1, 2, seq, 8), (1, 1, seq, 16), (2, 3, 5), (7,)]


# -- narrowing --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_windows_agree(cuda_seam, host_seam, rng, dtype) -> None:
    for shape in shapes(rng):
        hv, dv = both(cuda_seam, random_host(rng, shape, dtype))
        for axis in range(len(shape)):
            for kind, start, length in windows(shape[axis]):
                host = host_seam.slice_axis(hv, axis, start, length)
                got = cuda_seam.slice_axis(dv, axis, start, length)
                assert_same(host, got)
                if length == 0:
                    continue
                if math.prod(shape[:axis]) == 1 or length == shape[axis]:
                    assert got.owner is dv and not got.owned, (shape, axis, kind)
                    assert shares_device_memory(got, dv), (shape, axis, kind)
                else:
                    assert got.owned and got.owner is None, (shape, axis, kind)
                    assert not shares_device_memory(got, dv), (shape, axis, kind)
                # a window of a window: views (not owned) and copies as sources
                inner = host_seam.last_along_axis(host, axis)
                assert_same(inner, cuda_seam.last_along_axis(got, axis))
            assert_same(host_seam.last_along_axis(hv, axis), cuda_seam.last_along_axis(dv, axis))
            for length in range(shape[axis] + 1):
                assert_same(host_seam.truncate_axis(hv, axis, length),
                            cuda_seam.truncate_axis(dv, axis, length))
            assert cuda_seam.truncate_axis(dv, axis, shape[axis]) is dv


def test_views_share_device_memory(cuda_seam, rng) -> None:
    hv, dv = both(cuda_seam, random_host(rng, (1, 1, 6, 16), "float16"))
    view = cuda_seam.truncate_axis(dv, 2, 4)
    assert view.owner is dv and not view.owned
    assert int(view.data.data.ptr) == int(dv.data.data.ptr)
    row = random_host(rng, (1, 16), "float16")
    cuda_seam.scatter_into_last_axis(dv, cuda_seam.adopt(row, DEVICE), 0)  # writes every row
    expected = np.broadcast_to(row.data, (4, 16))
    assert cuda_seam.adopt(view, HOST).data.reshape(4, 16).tobytes() == expected.tobytes()


def test_strided_truncation_is_an_owned_copy(cuda_seam, host_seam, rng) -> None:
    hv, dv = both(cuda_seam, random_host(rng, (1, 2, 7, 8), "bfloat16"))
    before = cuda_seam.counters.snapshot()
    cut = cuda_seam.truncate_axis(dv, 2, 5)
    assert cut.owned and cut.owner is None and not shares_device_memory(cut, dv)
    assert cut.data.flags.c_contiguous
    after = cuda_seam.counters.snapshot()
    assert after["live_device_allocations"] == before["live_device_allocations"] + 1
    assert after["live_device_bytes"] == before["live_device_bytes"] + 2 * 5 * 8 * 2
    assert_same(host_seam.truncate_axis(hv, 2, 5), cut)


def test_unknown_ordinal_is_refused(cuda_seam, cp) -> None:
    count = cp.cuda.runtime.getDeviceCount()
    tagged = Value(np.zeros((2, 3), np.float32), f"cuda:{count}", "float32", owned=True)
    with pytest.raises(ResidencyError) as caught:
        cuda_seam.slice_axis(tagged, 1, 0, 2)
    text = str(caught.value)
    assert "slice_axis" in text and f"[2, 3] float32 on cuda:{count}" in text
    assert f"ordinal {count}" in text and "adopt" in text and "install" in text
    with pytest.raises(ResidencyError, match=f"ordinal {count}"):
        make_seam(f"cuda:{count}")
    assert make_seam("cuda").backend("cuda:0").residency == "cuda:0"


# -- gather, scatter, zeros -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_agrees(cuda_seam, host_seam, rng, dtype) -> None:
    rows, width = int(rng.integers(2, 50)), int(rng.integers(1, 40))
    ht, dt = both(cuda_seam, random_host(rng, (rows, width), dtype))
    for ids in ([0], [rows - 1], [0, rows - 1, rows - 1, 0],
                rng.integers(0, rows, 9).tolist(), []):
        got = cuda_seam.gather_rows(dt, ids)
        assert_same(host_seam.gather_rows(ht, ids), got)
        if ids:
            assert got.owned and not shares_device_memory(got, dt)
    with pytest.raises(ContractError, match=rf"outside \[0, {rows}\)"):
        cuda_seam.gather_rows(dt, [rows])


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_agrees(cuda_seam, host_seam, rng, dtype) -> None:
    host_dst = host_seam.zeros((1, 3, 10), dtype, HOST)
    cuda_dst = cuda_seam.zeros((1, 3, 10), dtype, DEVICE)
    for src_shape, offset in (((1, 4), 2), ((3, 4), 6), ((4,), 0), ((1, 1, 3, 10), 0),
                              ((3, 1), 9)):
        hs, ds = both(cuda_seam, random_host(rng, src_shape, dtype))
        host_seam.scatter_into_last_axis(host_dst, hs, offset)
        assert cuda_seam.scatter_into_last_axis(cuda_dst, ds, offset) is cuda_dst
        assert_same(host_dst, cuda_dst)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_overlap_agrees(cuda_seam, host_seam, rng, dtype) -> None:
    hd, dd = both(cuda_seam, random_host(rng, (1, 12), dtype))
    for offset, width in ((4, 8), (0, 5), (2, 10)):  # src = a view over dst's first columns
        host_seam.scatter_into_last_axis(hd, host_seam.slice_axis(hd, 1, 0, width), offset)
        source = cuda_seam.slice_axis(dd, 1, 0, width)
        assert shares_device_memory(source, dd)
        cuda_seam.scatter_into_last_axis(dd, source, offset)
        assert_same(hd, dd)
    hg, dg = both(cuda_seam, random_host(rng, (4, 6), dtype))
    host_seam.scatter_into_last_axis(hg, host_seam.slice_axis(hg, 0, 2, 1), 0)  # row 2 -> all
    cuda_seam.scatter_into_last_axis(dg, cuda_seam.slice_axis(dg, 0, 2, 1), 0)
    assert_same(hg, dg)


def test_scatter_refusals_on_device(cuda_seam, rng) -> None:
    dst = cuda_seam.zeros((2, 8), "float16", DEVICE)
    host_src = random_host(rng, (2, 3), "float16")
    with pytest.raises(ResidencyError) as caught:
        cuda_seam.scatter_into_last_axis(dst, host_src, 0)
    text = str(caught.value)
    assert dst.describe() in text and host_src.describe() in text
    assert "adopt the source into cuda:0" in text and "adopt the destination to host" in text
    view = cuda_seam.slice_axis(dst, 0, 0, 1)  # a view of an owned buffer is not owned
    with pytest.raises(ContractError, match="not owned"):
        cuda_seam.scatter_into_last_axis(view, cuda_seam.zeros((1, 3), "float16", DEVICE), 0)
    assert_same(TensorSeam().zeros((2, 8), "float16", HOST), dst)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_agree(cuda_seam, host_seam, rng, dtype) -> None:
    for shape in [*shapes(rng), (), (3, 0, 2)]:
        got = cuda_seam.zeros(shape, dtype, DEVICE)
        assert_same(host_seam.zeros(shape, dtype, HOST), got)
        assert got.owned


@pytest.mark.parametrize("dtype", DTYPES)
def test_adopt_round_trips(cuda_seam, rng, dtype) -> None:
    for shape in [*shapes(rng), (), (0, 4)]:
        hv = random_host(rng, shape, dtype)
        dv = cuda_seam.adopt(hv, DEVICE)
        assert_same(hv, dv)
        back = cuda_seam.adopt(dv, HOST)
        assert back.owned and back.data.tobytes() == hv.data.tobytes()
        if hv.size:
            assert cuda_seam.adopt(dv, DEVICE) is dv  # already there: no copy, no count
            assert dv.owned and dv.residency == DEVICE and dv.kind == hv.kind


def test_peer_copy_round_trip(rng, cp) -> None:
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("peer copy needs two CUDA devices")
    seam = make_seam(DEVICE)
    hv = random_host(rng, (3, 5, 7), "bfloat16")
    on_one = seam.adopt(seam.adopt(hv, DEVICE), "cuda:1")
    assert on_one.residency == "cuda:1" and on_one.owned
    assert_same(hv, on_one)


# -- argmax -----------------------------------------------------------------------------------
SPECIAL_ROWS = [  # (row, expected id) by runtime.md §7 (-1: no finite maximum)
    ([1.0, 3.0, 3.0, 2.0], 1), ([NAN, 1.0, 5.0, 5.0], -1), ([1.0, NAN, 0.0, NAN], -1),
    ([1.0, INF, 2.0, INF], -1), ([NAN, -INF, NAN, -INF], -1), ([NAN, NAN, NAN, NAN], -1),
    ([-INF, -INF, -INF, -INF], -1), ([-INF, -3.0, -INF, -3.0], 1),
    ([-0.0, 0.0, -1.0, -2.0], 0), ([-5.0, -2.0, -3.0, -2.0], 1),
]


def float_value(array: np.ndarray, dtype: str) -> Value:
    return Value.host(np.asarray(array, np.float32).astype(NUMPY_DTYPES[dtype]), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_special_rows(cuda_seam, host_seam, dtype) -> None:
    hv, dv = both(cuda_seam, float_value([row for row, _ in SPECIAL_ROWS], dtype))
    got = cuda_seam.argmax_rows(dv)
    assert got.kind == "token_ids" and got.dtype == "int32" and got.residency == DEVICE
    assert_same(host_seam.argmax_rows(hv), got)
    assert cuda_seam.read_token_ids(got) == [want for _, want in SPECIAL_ROWS]


@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_random_rows(cuda_seam, host_seam, rng, dtype) -> None:
    for shape in [(int(rng.integers(1, 2000)),), (5, 1), (4, 1000), (2, 3, 257)]:
        scores = rng.integers(-4, 5, math.prod(shape)).astype(np.float32)  # many ties
        specials = rng.random(scores.size)
        scores[specials < 0.05] = NAN
        scores[(specials >= 0.05) & (specials < 0.07)] = INF
        scores[(specials >= 0.07) & (specials < 0.12)] = -INF
        hv, dv = both(cuda_seam, float_value(scores.reshape(shape), dtype))
        assert_same(host_seam.argmax_rows(hv), cuda_seam.argmax_rows(dv))
        tame = np.where(np.isnan(scores) | (scores == INF), -INF, scores)  # most rows finite
        hv, dv = both(cuda_seam, float_value(tame.reshape(shape), dtype))
        assert_same(host_seam.argmax_rows(hv), cuda_seam.argmax_rows(dv))
        hb, db = both(cuda_seam, random_host(rng, shape, dtype))  # any bits, NaN payloads too
        assert_same(host_seam.argmax_rows(hb), cuda_seam.argmax_rows(db))
    width = int(rng.integers(1, 9))
    empty = cuda_seam.argmax_rows(cuda_seam.zeros((0, width), dtype, DEVICE))
    assert_same(host_seam.argmax_rows(host_seam.zeros((0, width), dtype, HOST)), empty)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_argmax_every_16_bit_pattern(cuda_seam, host_seam, rng, dtype) -> None:
    words = rng.permutation(np.arange(1 << 16, dtype=np.uint16)).reshape(256, 256)
    scores = Value.host(words.view(NUMPY_DTYPES[dtype]), dtype)
    hv, dv = both(cuda_seam, scores)
    assert_same(host_seam.argmax_rows(hv), cuda_seam.argmax_rows(dv))
    if dtype == "bfloat16":
        assert NUMPY_DTYPES[dtype] == np.dtype(ml_dtypes.bfloat16)
        assert dv.data.dtype == np.uint16  # stored as 16-bit words on CUDA


# -- counters ---------------------------------------------------------------------------------
def test_read_back_counters(cuda_seam, rng) -> None:
    scores = cuda_seam.adopt(float_value(rng.standard_normal((3, 50)), "float16"), DEVICE)
    start = cuda_seam.counters.snapshot()
    assert start["uploads"] == 1 and start["device_readback_bytes"] == 0
    cuda_seam.truncate_axis(scores, 1, 20)
    cuda_seam.zeros((2, 2), "float32", DEVICE)
    ids = cuda_seam.argmax_rows(scores)
    assert cuda_seam.counters.device_readback_bytes == 0  # nothing crossed yet
    assert len(cuda_seam.read_token_ids(ids)) == 3
    assert cuda_seam.counters.device_readback_bytes == 4 * 3  # token ids: bytes only
    assert cuda_seam.counters.host_staging_count == 0
    cuda_seam.adopt(scores, HOST)  # a tensor: staging
    assert cuda_seam.counters.host_staging_count == 1
    assert cuda_seam.counters.device_readback_bytes == 12 + 3 * 50 * 2
    assert cuda_seam.counters.fences == 0  # shared_stream mode


def test_live_allocations_return_to_baseline(cuda_seam, rng) -> None:
    counters = cuda_seam.counters
    gc.collect()
    base = (counters.live_device_allocations, counters.live_device_bytes)
    dv = cuda_seam.adopt(random_host(rng, (2, 3), "float32"), DEVICE)  # 24 B
    zeros = cuda_seam.zeros((4,), "int64", DEVICE)  # 32 B
    view = cuda_seam.truncate_axis(dv, 0, 1)  # a view: not a new buffer
    strided = cuda_seam.slice_axis(dv, 1, 0, 2)  # 16 B
    rows = cuda_seam.gather_rows(dv, [1, 0, 1])  # 36 B
    ids = cuda_seam.argmax_rows(dv)  # 8 B
    cuda_seam.read_token_ids(ids)
    assert (counters.live_device_allocations, counters.live_device_bytes) == (
        base[0] + 5, base[1] + 24 + 32 + 16 + 36 + 8)
    del dv  # the view still holds the buffer
    gc.collect()
    assert counters.live_device_allocations == base[0] + 5
    del view, zeros, strided, rows, ids
    gc.collect()
    assert (counters.live_device_allocations, counters.live_device_bytes) == base


# -- ordering ---------------------------------------------------------------------------------
def write_batches(seam: TensorSeam, rng: np.random.Generator) -> dict[str, int]:
    """Each kind of write batch of residency.md §8, with the fences each one cost."""
    cost: dict[str, int] = {}

    def fences_of(name, action):
        before = seam.counters.fences
        action()
        cost[name] = seam.counters.fences - before

    table = seam.adopt(random_host(rng, (10, 8), "float16"), DEVICE)
    cells = [seam.adopt(random_host(rng, (1, 2, 6, 8), "float16"), DEVICE) for _ in range(3)]
    fences_of("zeros", lambda: seam.zeros((1, 1, 12), "float16", DEVICE))
    fused = seam.zeros((1, 1, 12), "float16", DEVICE)
    carry = seam.adopt(random_host(rng, (1, 1, 4), "float16"), DEVICE)
    fences_of("adopt onto the device", lambda: seam.adopt(random_host(rng, (3,), "int64"),
                                                            DEVICE))

    def assemble():
        with seam.write_batch():
            seam.scatter_into_last_axis(fused, seam.gather_rows(table, [7]), 0)
            seam.scatter_into_last_axis(fused, carry, 8)

    def truncate_cells():
        with seam.write_batch():
            for cell in cells:
                seam.truncate_axis(cell, 2, 4)  # strided: a copy each

    def nested():
        with seam.write_batch(), seam.write_batch():
            seam.zeros((2,), "float32", DEVICE)
            seam.gather_rows(table, [1])

    fences_of("fused input assembly", assemble)
    fences_of("truncation of every cell", truncate_cells)
    fences_of("nested batches", nested)
    fences_of("unbatched gather", lambda: seam.gather_rows(table, [2]))
    view_cell = seam.adopt(random_host(rng, (1, 1, 6, 8), "float16"), DEVICE)
    fences_of("view truncation", lambda: seam.truncate_axis(view_cell, 2, 3))
    fences_of("argmax and read-back",
              lambda: seam.read_token_ids(seam.argmax_rows(seam.last_along_axis(fused, 2))))
    return cost


def test_fence_mode_fences_once_per_write_batch(rng) -> None:
    seam = make_seam(DEVICE, ordering="fence")
    assert seam.ordering == "fence"
    assert stream_provider_options(seam.backend(DEVICE), DEVICE) == {}
    assert seam.backend(DEVICE).compute_stream(DEVICE) is None
    assert write_batches(seam, rng) == {
        "zeros": 1, "adopt onto the device": 1, "fused input assembly": 1,
        "truncation of every cell": 1, "nested batches": 1, "unbatched gather": 1,
        "view truncation": 0, "argmax and read-back": 0}


def test_shared_stream_mode_never_fences(cuda_seam, rng) -> None:
    assert cuda_seam.ordering == "shared_stream"
    assert set(write_batches(cuda_seam, rng).values()) == {0}
    assert cuda_seam.counters.fences == 0
    backend = cuda_seam.backend(DEVICE)
    assert int(backend.stream.ptr) != 0  # never the legacy default stream
    assert backend.compute_stream(DEVICE) == int(backend.stream.ptr)
    assert stream_provider_options(backend, DEVICE) == {
        "has_user_compute_stream": "1", "user_compute_stream": str(int(backend.stream.ptr))}


def test_fence_mode_results_agree(rng) -> None:
    seam, host_seam = make_seam(DEVICE, ordering="fence"), TensorSeam()
    hv, dv = both(seam, random_host(rng, (1, 2, 9, 8), "float32"))
    assert_same(host_seam.truncate_axis(hv, 2, 4), seam.truncate_axis(dv, 2, 4))


# -- the transfer guard -----------------------------------------------------------------------
def test_transfer_guard_allows_only_the_seam(transfer_guard, cuda_seam, cp, rng) -> None:
    from builders.transfer_guard import TransferGuardError

    assert "ndarray.get" in transfer_guard
    hv, dv = both(cuda_seam, random_host(rng, (3, 4), "float32"))
    with pytest.raises(TransferGuardError, match="cupy.asnumpy"):
        cp.asnumpy(dv.data)
    with pytest.raises(TransferGuardError, match="get"):
        dv.data.get()
    assert cuda_seam.adopt(dv, HOST).data.tobytes() == hv.data.tobytes()  # the seam may
    assert len(cuda_seam.read_token_ids(cuda_seam.argmax_rows(dv))) == 3


# -- ONNX Runtime interop ---------------------------------------------------------------------
@pytest.fixture
def ort_cuda():
    ort = pytest.importorskip("onnxruntime")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                    "(install onnxruntime-gpu)")
    return ort


def identity_session(ort, seam: TensorSeam, dtype: str, op: str = "Identity"):
    from onnx import helper

    element = DTYPE_TABLE[dtype].onnx
    inputs = ["x"] if op == "Identity" else ["x", "x"]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"])], "g",
        [helper.make_tensor_value_info("x", element, None)],
        [helper.make_tensor_value_info("y", element, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    backend = seam.backend(DEVICE)
    options = {"device_id": "0", "use_tf32": "0", **stream_provider_options(backend, DEVICE)}
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=[("CUDAExecutionProvider", options)])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    provider = session.get_provider_options()["CUDAExecutionProvider"]
    assert provider.get("user_compute_stream") == options["user_compute_stream"]
    return session


@pytest.mark.parametrize("dtype", DTYPES)
def test_ort_round_trip_without_copies(ort_cuda, transfer_guard, cuda_seam, host_seam, rng,
                                       dtype) -> None:
    session = identity_session(ort_cuda, cuda_seam, dtype)
    backend = cuda_seam.backend(DEVICE)
    hv, dv = both(cuda_seam, random_host(rng, (2, 3, 17), dtype))
    binding = session.io_binding()
    bind_input(binding, "x", dv, backend)
    bind_output(binding, "y", DEVICE)
    session.run_with_iobinding(binding)
    (ort_value,) = binding.get_outputs()
    live = cuda_seam.counters.live_device_allocations
    wrapped = adopt_output(ort_value, DEVICE, backend, dtype)
    assert cuda_seam.counters.live_device_allocations == live  # ORT's memory: not counted
    assert wrapped.owner is ort_value and not wrapped.owned and wrapped.residency == DEVICE
    assert int(wrapped.data.data.ptr) == int(ort_value.data_ptr())  # no copy
    assert_same(hv, wrapped)
    assert_same(host_seam.slice_axis(hv, 1, 1, 2), cuda_seam.slice_axis(wrapped, 1, 1, 2))
    with pytest.raises(ContractError, match="not owned"):
        cuda_seam.scatter_into_last_axis(wrapped, dv, 0)
    if dtype in FLOATS:
        assert_same(host_seam.argmax_rows(hv), cuda_seam.argmax_rows(wrapped))


def test_ort_computes_on_the_shared_stream(ort_cuda, transfer_guard, cuda_seam, rng) -> None:
    """A seam write, an ORT kernel and a seam read in issue order, with no fence."""
    session = identity_session(ort_cuda, cuda_seam, "float32", op="Add")
    backend = cuda_seam.backend(DEVICE)
    shape = (256, 8192)  # 8 MiB: a write still running would be seen by the kernel
    dv = cuda_seam.zeros(shape, "float32", DEVICE)
    out = cuda_seam.zeros(shape, "float32", DEVICE)  # a preallocated, owned output
    for _ in range(3):
        fresh = Value.host(rng.standard_normal(shape).astype(np.float32))
        cuda_seam.scatter_into_last_axis(dv, cuda_seam.adopt(fresh, DEVICE), 0)
        binding = session.io_binding()
        bind_input(binding, "x", dv, backend)
        bind_output(binding, "y", DEVICE, out, backend)
        session.run_with_iobinding(binding)
        assert_same(Value.host(fresh.data + fresh.data), out)
    assert cuda_seam.counters.fences == 0
