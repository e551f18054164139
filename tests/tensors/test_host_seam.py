"""The host seam against residency.md §3-§5 and runtime.md §7, on literal arrays and with
hypothesis. No GPU: values tagged ``cuda:0`` here are only tags (numpy inside), which is
enough to check that the seam refuses them (S3, S4) without touching their data."""

from __future__ import annotations

import math
import sys

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytest.importorskip("hypothesis", reason="the host seam properties need hypothesis (dev group)")
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from builders.transfer_guard import TransferGuardError, forbid_host_transfers
from speculant.dtypes import DTYPES as DTYPE_TABLE
from speculant.dtypes import dtype_of_onnx, dtype_of_ort
from speculant.errors import ContractError, ResidencyError
from speculant.session.binding import adopt_output, ort_value_dtype
from speculant.tensors import HOST, NUMPY_DTYPES, Residency, TensorSeam, Value, make_seam
from speculant.tensors.sampling import widen_bfloat16

DTYPES = ["float32", "float16", "bfloat16", "int64", "bool"]
FLOATS = ["float32", "float16", "bfloat16"]
S = 5
SHAPES = [(1, 2, S, 8), (1, 1, S, 16), (2, 3, 5), (7,)]
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def seam() -> TensorSeam:
    return TensorSeam()


def host_value(array: np.ndarray, dtype: str) -> Value:
    return Value.host(np.asarray(array).astype(NUMPY_DTYPES[dtype]), dtype)


def sample(shape: tuple[int, ...], dtype: str, seed: int = 0) -> Value:
    """Distinct-ish values of ``dtype`` (bool alternates) so any misplaced byte shows."""
    count = math.prod(shape)
    base = np.random.default_rng(seed).permutation(count).reshape(shape)
    return host_value(base % 2 == 1 if dtype == "bool" else base - count // 2, dtype)


def windows(extent: int) -> list[tuple[str, int, int]]:
    """(kind, start, length): first, middle, last, empty, whole, and a truncation."""
    kinds = [("first", 0, 1), ("middle", extent // 2, 1), ("last", extent - 1, 1),
             ("empty", extent // 2, 0), ("whole", 0, extent), ("prefix", 0, extent - 1),
             ("inner", 1, extent - 2)]
    return [(k, s, n) for k, s, n in kinds if s >= 0 and n >= 0 and s + n <= extent]


def expect_view(shape: tuple[int, ...], axis: int, length: int) -> bool:
    return math.prod(shape[:axis]) == 1 or length == shape[axis]


def assert_residency_message(exc: BaseException, op: str, operands: list[Value]) -> None:
    """S5: the operation, every operand's shape/dtype/residency, and both remedies."""
    text = str(exc)
    assert op in text, text
    for v in operands:
        assert v.describe() in text, (v.describe(), text)
    assert "Remedy:" in text and " or " in text.split("Remedy:")[1], text
    assert "adopt" in text, text


# -- slice_axis / last_along_axis / truncate_axis --------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_slice_axis_every_axis_and_window(seam: TensorSeam, shape, dtype) -> None:
    v = sample(shape, dtype)
    for axis in range(len(shape)):
        for kind, start, length in windows(shape[axis]):
            got = seam.slice_axis(v, axis, start, length)
            index = [slice(None)] * len(shape)
            index[axis] = slice(start, start + length)
            want = v.data[tuple(index)]
            where = f"axis {axis} {kind} [{start}, {start + length})"
            assert got.shape == want.shape, where
            assert got.dtype == dtype and got.data.dtype == NUMPY_DTYPES[dtype], where
            assert got.residency == HOST and got.data.flags.c_contiguous, where
            assert got.data.tobytes() == np.ascontiguousarray(want).tobytes(), where
            if length == 0:  # S2: a fresh host value, nothing shared
                assert got.owned and got.owner is None, where
            elif expect_view(shape, axis, length):
                assert got.owner is v and not got.owned, where
                assert np.shares_memory(got.data, v.data), where
            else:
                assert got.owned and got.owner is None, where
                assert not np.shares_memory(got.data, v.data), where


def test_cache_truncation_view_or_copy(seam: TensorSeam) -> None:
    """residency.md §4: [1, H, S, D] on axis 2: H = 1 is a view, H = 2 an owned copy."""
    one = sample((1, 1, S, 16), "float16")
    two = sample((1, 2, S, 8), "float16")
    assert seam.truncate_axis(one, 2, 3).owner is one
    copied = seam.truncate_axis(two, 2, 3)
    assert copied.owned and not np.shares_memory(copied.data, two.data)
    assert np.array_equal(copied.data, two.data[:, :, :3])


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_slice_axis_matches_numpy(data, dtype) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4))
    axis = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[axis]))
    length = data.draw(st.integers(0, shape[axis] - start))
    v = sample(shape, dtype, seed=data.draw(st.integers(0, 9)))
    got = TensorSeam().slice_axis(v, axis, start, length)
    index = [slice(None)] * len(shape)
    index[axis] = slice(start, start + length)
    want = np.ascontiguousarray(v.data[tuple(index)])
    assert got.shape == want.shape and got.dtype == dtype
    assert got.data.tobytes() == want.tobytes()
    if got.size and not expect_view(shape, axis, length):
        assert got.owned and not np.shares_memory(got.data, v.data)
    elif got.size:
        assert got.owner is v and np.shares_memory(got.data, v.data)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_last_along_axis_and_truncate(seam: TensorSeam, shape) -> None:
    v = sample(shape, "float32")
    for axis in range(len(shape)):
        last = seam.last_along_axis(v, axis)
        want = np.take(v.data, [shape[axis] - 1], axis=axis)
        assert last.shape == want.shape and np.array_equal(last.data, want)
        assert seam.truncate_axis(v, axis, shape[axis]) is v  # length = extent: v itself
        head = seam.truncate_axis(v, axis, 1)
        assert np.array_equal(head.data, np.take(v.data, [0], axis=axis))
        empty = seam.truncate_axis(v, axis, 0)
        assert empty.residency == HOST and empty.shape[axis] == 0


def test_window_errors_name_the_values(seam: TensorSeam) -> None:
    v = sample((2, 3, 5), "float32")
    with pytest.raises(ContractError, match=r"\[4, 7\).*extent 5"):
        seam.slice_axis(v, 2, 4, 3)
    with pytest.raises(ContractError, match="start -1"):
        seam.slice_axis(v, 0, -1, 1)
    with pytest.raises(ContractError, match="length -1"):
        seam.slice_axis(v, 0, 0, -1)
    with pytest.raises(ContractError, match="axis 3 outside rank 3"):
        seam.slice_axis(v, 3, 0, 1)
    with pytest.raises(ContractError, match="axis -1 outside rank 3"):
        seam.last_along_axis(v, -1)
    with pytest.raises(ContractError, match="axis 1 of .* is empty"):
        seam.last_along_axis(sample((2, 0, 5), "float32"), 1)
    with pytest.raises(ContractError, match="length 6 outside \\[0, 5\\]"):
        seam.truncate_axis(v, 2, 6)
    with pytest.raises(ContractError, match="length -2"):
        seam.truncate_axis(v, 2, -2)
    with pytest.raises(ContractError, match="axis 5 outside rank 3"):
        seam.truncate_axis(v, 5, 1)


# -- gather_rows -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_rows_first_last_and_range(seam: TensorSeam, dtype) -> None:
    table = sample((6, 4), dtype)
    got = seam.gather_rows(table, [0, 5, 5, 0])
    assert got.shape == (4, 4) and got.dtype == dtype and got.owned
    assert got.data.tobytes() == table.data[[0, 5, 5, 0]].tobytes()
    assert not np.shares_memory(got.data, table.data)
    for bad in ([6], [-1], [0, 7]):
        with pytest.raises(ContractError, match=r"outside \[0, 6\)"):
            seam.gather_rows(table, bad)  # never clamped
    empty = seam.gather_rows(table, [])
    assert empty.shape == (0, 4) and empty.residency == HOST


def test_gather_rows_contract(seam: TensorSeam) -> None:
    table = sample((6, 4), "float32")
    with pytest.raises(ContractError, match="rank 2"):
        seam.gather_rows(sample((6, 4, 1), "float32"), [0])
    with pytest.raises(ContractError, match="host sequence"):
        seam.gather_rows(table, Value.host(np.array([1], np.int32)))
    with pytest.raises(ContractError, match="not all integers"):
        seam.gather_rows(table, [1.5])
    assert seam.gather_rows(table, np.array([2, 3])).shape == (2, 4)  # numpy ints are fine


# -- scatter_into_last_axis ------------------------------------------------------------------
def scatter_reference(dst: np.ndarray, src: np.ndarray, offset: int) -> np.ndarray:
    out = dst.copy()
    width = src.shape[-1] if src.ndim else 1
    out.reshape(-1, dst.shape[-1])[:, offset : offset + width] = src.reshape(-1, width).copy()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_rows_and_broadcast(seam: TensorSeam, dtype) -> None:
    dst = seam.zeros((1, 3, 10), dtype, HOST)
    row = sample((1, 4), dtype, seed=1)
    want = scatter_reference(dst.data, row.data, 2)
    assert seam.scatter_into_last_axis(dst, row, 2) is dst
    assert dst.data.tobytes() == want.tobytes()
    rows = sample((3, 4), dtype, seed=2)
    want = scatter_reference(dst.data, rows.data, 6)
    seam.scatter_into_last_axis(dst, rows, 6)
    assert dst.data.tobytes() == want.tobytes()
    flat = sample((4,), dtype, seed=3)  # rank 1: one row, written to every row
    want = scatter_reference(dst.data, flat.data, 0)
    seam.scatter_into_last_axis(dst, flat, 0)
    assert dst.data.tobytes() == want.tobytes()


def test_scatter_overlap_is_copy_first(seam: TensorSeam) -> None:
    dst = Value(np.arange(10, dtype=np.float32).reshape(1, 10), HOST, "float32", owned=True)
    original = dst.data.copy()
    src = seam.slice_axis(dst, 1, 0, 6)  # a view over dst's first 6 columns
    assert np.shares_memory(src.data, dst.data)
    seam.scatter_into_last_axis(dst, src, 4)
    assert np.array_equal(dst.data[0, 4:], original[0, :6])
    assert np.array_equal(dst.data[0, :4], original[0, :4])

    grid = Value(np.arange(18, dtype=np.float32).reshape(3, 6), HOST, "float32", owned=True)
    first_row = grid.data[0].copy()
    seam.scatter_into_last_axis(grid, seam.slice_axis(grid, 0, 0, 1), 0)  # row 0 everywhere
    assert all(np.array_equal(r, first_row) for r in grid.data)


def test_scatter_refusals(seam: TensorSeam) -> None:
    owned = seam.zeros((2, 8), "float16", HOST)
    output = Value(np.zeros((2, 8), np.float16), HOST, "float16", owner=object())  # not owned
    src = sample((2, 3), "float16")
    with pytest.raises(ContractError, match="not owned"):
        seam.scatter_into_last_axis(output, src, 0)
    with pytest.raises(ContractError, match="not owned"):  # a view of an owned buffer
        seam.scatter_into_last_axis(seam.slice_axis(owned, 0, 0, 1), sample((1, 3), "float16"),
                                    0)
    with pytest.raises(ContractError, match="dtype float32 of the source"):
        seam.scatter_into_last_axis(owned, sample((2, 3), "float32"), 0)
    with pytest.raises(ContractError, match="offset 6"):
        seam.scatter_into_last_axis(owned, src, 6)
    with pytest.raises(ContractError, match="offset -1"):
        seam.scatter_into_last_axis(owned, src, -1)
    with pytest.raises(ContractError, match=r"rows 2 or 1"):
        seam.scatter_into_last_axis(owned, sample((3, 3), "float16"), 0)
    assert not owned.data.any()  # nothing written by a refused call


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_scatter_matches_reference(data, dtype) -> None:
    rows, width = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 8))
    src_width = data.draw(st.integers(1, width))
    offset = data.draw(st.integers(0, width - src_width))
    src_rows = data.draw(st.sampled_from([1, rows]))
    seam = TensorSeam()
    dst = seam.zeros((rows, width), dtype, HOST)
    dst.data[...] = sample((rows, width), dtype, seed=1).data
    src = sample((src_rows, src_width), dtype, seed=2)
    want = scatter_reference(dst.data, src.data, offset)
    seam.scatter_into_last_axis(dst, src, offset)
    assert dst.data.tobytes() == want.tobytes()


# -- zeros -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [*SHAPES, (), (3, 0, 2)], ids=str)
def test_zeros(seam: TensorSeam, shape, dtype) -> None:
    z = seam.zeros(shape, dtype, HOST)
    assert z.shape == shape and z.dtype == dtype and z.owned and z.residency == HOST
    assert z.data.dtype == NUMPY_DTYPES[dtype] and not any(z.data.tobytes())


def test_zeros_contract(seam: TensorSeam) -> None:
    with pytest.raises(ContractError, match="unknown dtype 'float64'"):
        seam.zeros((2,), "float64", HOST)
    with pytest.raises(ContractError, match="negative extent"):
        seam.zeros((2, -1), "float32", HOST)
    with pytest.raises(ContractError, match="'cuda' is not 'host'"):
        seam.zeros((2,), "float32", "cuda")
    assert seam.zeros((0, 4), "float32", "cuda:0").residency == HOST  # S2 before S3


# -- argmax_rows -----------------------------------------------------------------------------
SPECIAL_ROWS = [  # (row, expected id) by runtime.md §7
    ([1.0, 3.0, 3.0, 2.0], 1),  # tie: lowest index
    ([NAN, 1.0, 5.0, 5.0], -1),  # a NaN: no finite maximum (NO_TOKEN)
    ([1.0, NAN, 0.0, NAN], -1),
    ([1.0, INF, 2.0, INF], -1),  # +inf: no finite maximum
    ([NAN, -INF, NAN, -INF], -1),
    ([NAN, NAN, NAN, NAN], -1),  # all NaN
    ([-INF, -INF, -INF, -INF], -1),  # all -inf
    ([-INF, -3.0, -INF, -3.0], 1),  # -inf elements are fine (masked ids)
    ([-0.0, 0.0, -1.0, 2.0], 3),
    ([-0.0, 0.0, -1.0, -2.0], 0),  # -0 == +0: a tie
    ([-5.0, -2.0, -3.0, -2.0], 1),
]


def float_rows(rows: list[list[float]], dtype: str) -> Value:
    return Value.host(np.array(rows, np.float32).astype(NUMPY_DTYPES[dtype]), dtype)


def reference_argmax(row: list[float]) -> int:
    """runtime.md §7 one element at a time, in Python floats."""
    if any(math.isnan(x) or x == math.inf for x in row) or max(row) == -math.inf:
        return -1
    best = max(row)
    return min(i for i, x in enumerate(row) if x == best)


@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_special_rows(seam: TensorSeam, dtype) -> None:
    scores = float_rows([row for row, _ in SPECIAL_ROWS], dtype)
    ids = seam.argmax_rows(scores)
    assert ids.dtype == "int32" and ids.data.dtype == np.int32 and ids.kind == "token_ids"
    assert ids.shape == (len(SPECIAL_ROWS),) and ids.owned and ids.residency == HOST
    assert ids.data.tolist() == [want for _, want in SPECIAL_ROWS]
    assert seam.read_token_ids(ids) == [want for _, want in SPECIAL_ROWS]


@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_shapes(seam: TensorSeam, dtype) -> None:
    assert seam.argmax_rows(float_rows([[0.0, 2.0, 1.0]], dtype)).shape == (1,)
    flat = Value.host(np.array([0.0, 2.0, 2.0], np.float32).astype(NUMPY_DTYPES[dtype]), dtype)
    assert seam.argmax_rows(flat).data.tolist() == [1]  # rank 1: [1]
    cube = sample((2, 3, 5), "float32")
    cube = Value.host(cube.data.astype(NUMPY_DTYPES[dtype]), dtype)
    ids = seam.argmax_rows(cube)
    assert ids.shape == (6,)
    assert ids.data.tolist() == [reference_argmax(r) for r in
                                 cube.data.reshape(6, 5).astype(np.float32).tolist()]
    empty = seam.argmax_rows(Value.host(np.zeros((0, 4), NUMPY_DTYPES[dtype]), dtype))
    assert empty.shape == (0,) and empty.residency == HOST and empty.kind == "token_ids"
    with pytest.raises(ContractError, match="width 0"):
        seam.argmax_rows(Value.host(np.zeros((2, 0), NUMPY_DTYPES[dtype]), dtype))
    with pytest.raises(ContractError, match="float32, float16 or bfloat16"):
        seam.argmax_rows(sample((2, 3), "int64"))


def test_bfloat16_widening_is_bit_placement() -> None:
    words = np.arange(1 << 16, dtype=np.uint16)
    wide = widen_bfloat16(np, words)
    assert np.array_equal(wide.view(np.uint32), words.astype(np.uint32) << 16)
    exact = words.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(wide, exact, equal_nan=True)  # ml_dtypes agrees on every value


@settings(max_examples=200, deadline=None)
@given(words=hnp.arrays(np.uint16, hnp.array_shapes(min_dims=2, max_dims=2, max_side=6)))
def test_argmax_bfloat16_any_bits(words) -> None:
    scores = Value(words.view(ml_dtypes.bfloat16), HOST, "bfloat16", owned=True)
    rows = words.view(ml_dtypes.bfloat16).astype(np.float32).tolist()
    assert TensorSeam().argmax_rows(scores).data.tolist() == [reference_argmax(r) for r in rows]


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(["float32", "float16"]), data=st.data())
def test_argmax_matches_reference(dtype, data) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    elements = st.sampled_from([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, 65504.0])
    array = data.draw(hnp.arrays(NUMPY_DTYPES[dtype], shape, elements=elements))
    ids = TensorSeam().argmax_rows(Value.host(array, dtype))
    rows = array.reshape(-1, shape[-1]).astype(np.float32).tolist()
    assert ids.data.tolist() == [reference_argmax(r) for r in rows]


# -- adopt, residency rules (S2-S5), counters ------------------------------------------------
def test_adopt_on_host(seam: TensorSeam) -> None:
    v = sample((2, 3), "bfloat16")
    assert seam.adopt(v, HOST) is v
    empty = Value(np.zeros((0, 3), np.float32), "cuda:0", "float32")  # S2 before S3
    got = seam.adopt(empty, "cuda:0")
    assert got is empty  # already there: v itself
    got = seam.adopt(empty, HOST)
    assert got.residency == HOST and got.shape == (0, 3)
    with pytest.raises(ContractError, match="'gpu0'"):
        seam.adopt(v, "gpu0")


def device_tagged(shape: tuple[int, ...], dtype: str, residency: str = "cuda:0") -> Value:
    return Value(sample(shape, dtype).data, residency, dtype, owned=True)


@pytest.mark.parametrize("residency", ["cuda:0", "tpu:0"])
def test_unknown_device_is_refused_with_both_remedies(seam: TensorSeam, residency) -> None:
    """S3: no implementation for the residency -> ResidencyError, never a host copy."""
    v = device_tagged((2, 3, 4), "float16", residency)
    table = device_tagged((5, 4), "float32", residency)
    scores = device_tagged((2, 5), "bfloat16", residency)
    calls = [
        ("slice_axis", lambda: seam.slice_axis(v, 2, 1, 2), [v]),
        ("slice_axis", lambda: seam.slice_axis(v, 2, 0, 4), [v]),  # whole axis: still refused
        ("last_along_axis", lambda: seam.last_along_axis(v, 1), [v]),
        ("truncate_axis", lambda: seam.truncate_axis(v, 2, 4), [v]),  # length = extent too
        ("gather_rows", lambda: seam.gather_rows(table, [0, 4]), [table]),
        ("scatter_into_last_axis",
         lambda: seam.scatter_into_last_axis(table, device_tagged((1, 2), "float32", residency),
                                             1), [table]),
        ("argmax_rows", lambda: seam.argmax_rows(scores), [scores]),
        ("adopt", lambda: seam.adopt(v, HOST), [v]),
        ("adopt", lambda: seam.adopt(sample((2, 3), "int64"), residency),
         [sample((2, 3), "int64")]),
    ]
    for op, call, operands in calls:
        with pytest.raises(ResidencyError) as caught:
            call()
        assert_residency_message(caught.value, op, operands)
        assert "install" in str(caught.value) and residency in str(caught.value)
    with pytest.raises(ResidencyError) as caught:
        seam.zeros((2, 3), "float32", residency)
    assert "zeros" in str(caught.value) and f"[2, 3] float32 on {residency}" in str(caught.value)
    assert seam.counters.snapshot() == TensorSeam().counters.snapshot()  # nothing crossed


def test_empty_results_live_on_the_host(seam: TensorSeam) -> None:
    """S2: checked before anything else, even for a value the seam cannot otherwise touch."""
    v = device_tagged((2, 3, 4), "float16")
    for got in (seam.slice_axis(v, 1, 1, 0), seam.truncate_axis(v, 2, 0),
                seam.gather_rows(device_tagged((5, 4), "float32"), []),
                seam.argmax_rows(device_tagged((0, 5), "float32")),
                seam.zeros((0,), "bool", "cuda:0")):
        assert got.residency == HOST and got.size == 0 and got.owned


def test_straddling_operands_are_refused(seam: TensorSeam) -> None:
    """S4: never staged; both operands and both remedies named."""
    host_dst = seam.zeros((2, 6), "float32", HOST)
    device_src = device_tagged((2, 3), "float32")
    with pytest.raises(ResidencyError) as caught:
        seam.scatter_into_last_axis(host_dst, device_src, 0)
    assert_residency_message(caught.value, "scatter_into_last_axis", [host_dst, device_src])
    assert "adopt the source into host" in str(caught.value)
    assert "adopt the destination to cuda:0" in str(caught.value)
    with pytest.raises(ResidencyError) as caught:
        seam.scatter_into_last_axis(device_tagged((2, 6), "float32"), sample((2, 3), "float32"),
                                    0)
    assert "straddle" in str(caught.value)
    assert not host_dst.data.any()


def test_host_counters_stay_zero(seam: TensorSeam) -> None:
    v = sample((1, 2, S, 8), "float16")
    seam.truncate_axis(v, 2, 3)
    seam.slice_axis(v, 3, 2, 4)
    table = sample((6, 8), "float16")
    fused = seam.zeros((1, 1, 16), "float16", HOST)
    with seam.write_batch():
        seam.scatter_into_last_axis(fused, seam.gather_rows(table, [3]), 0)
        seam.scatter_into_last_axis(fused, seam.gather_rows(table, [1]), 8)
    seam.read_token_ids(seam.argmax_rows(fused))
    seam.adopt(v, HOST)
    assert all(count == 0 for count in seam.counters.snapshot().values())
    assert seam.ordering == "shared_stream"


# -- Residency: the one reader of device words -------------------------------------------------
@pytest.mark.parametrize(("text", "kind", "ordinal", "name"), [
    ("cpu", "host", 0, "host"), ("host", "host", 0, "host"), ("cuda", "cuda", 0, "cuda:0"),
    ("cuda:0", "cuda", 0, "cuda:0"), ("cuda:3", "cuda", 3, "cuda:3"),
    ("cuda:07", "cuda", 7, "cuda:7")])
def test_residency_parse(text, kind, ordinal, name) -> None:
    residency = Residency.parse(text)
    assert (residency.kind, residency.ordinal, str(residency)) == (kind, ordinal, name)
    assert Residency.parse(str(residency)) == residency


@pytest.mark.parametrize("text", ["tpu", "gpu:0", "cuda:", "cuda:-1", "cuda:x", "CUDA:0",
                                  "cuda:0:1", "", " cpu", 0])
def test_a_bad_residency_names_the_value_and_the_accepted_forms(text) -> None:
    with pytest.raises(ResidencyError) as caught:
        Residency.parse(text)
    problem = caught.value.problems[0]
    assert (problem.path, problem.value) == ("device", text)
    assert problem.expected == "'cpu', 'cuda' or 'cuda:N'"
    assert f"unknown device '{text}'" in str(caught.value)
    assert "pip install 'speculant[cuda]'" in str(caught.value)  # the remedy


# -- make_seam and the CUDA modules without CuPy --------------------------------------------
def test_make_seam_host_and_unknown() -> None:
    for device in ("cpu", "host"):  # no device backend
        with pytest.raises(ResidencyError, match="no 'cuda' implementation"):
            make_seam(device).backend("cuda:0")
    with pytest.raises(ResidencyError, match="unknown device 'tpu'"):
        make_seam("tpu")


def test_make_seam_cuda_without_cupy_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    from speculant.tensors.cuda import CudaBackend

    for device in ("cuda", "cuda:1"):
        with pytest.raises(ResidencyError) as caught:
            make_seam(device)
        text = str(caught.value)
        assert "pip install 'speculant[cuda]'" in text
        assert ("cuda:1" if device == "cuda:1" else "cuda:0") in text
    with pytest.raises(ResidencyError, match=r"speculant\[cuda\]"):
        CudaBackend(0)


def test_onnx_element_types_match_onnx() -> None:
    names = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "int8": "INT8",
             "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8",
             "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL"}
    assert {d: DTYPE_TABLE[d].onnx for d in names} == {
        d: getattr(onnx.TensorProto, n) for d, n in names.items()}
    assert set(NUMPY_DTYPES) == set(names)
    for name in names:  # the table reads both ways
        assert dtype_of_onnx(DTYPE_TABLE[name].onnx) == name
        assert dtype_of_ort(DTYPE_TABLE[name].ort) == name


def test_ort_value_dtype_and_cpu_outputs_are_not_wrapped() -> None:
    f16 = ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float16))
    assert ort_value_dtype(f16) == "float16"
    bf16 = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        np.zeros((2,), np.uint16), onnx.TensorProto.BFLOAT16)
    assert ort_value_dtype(bf16) == "bfloat16"
    with pytest.raises(ContractError, match="lives on 'cpu', not on cuda"):
        adopt_output(f16._ortvalue, "cuda:0", TensorSeam().host, "float16")


class _DeviceOrtValue(ort.OrtValue):
    """A CPU OrtValue that claims to live on CUDA: enough to exercise the guard's check."""

    def device_name(self) -> str:
        return "cuda"


def test_transfer_guard_refuses_device_ort_reads_outside_download() -> None:
    from speculant.tensors import cuda

    plain = ort.OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.float32))
    device = _DeviceOrtValue(plain._ortvalue)
    before = dict(vars(ort.OrtValue))
    with forbid_host_transfers() as patched:
        assert "OrtValue.numpy" in patched
        assert plain.numpy().tolist() == [0.0, 1.0, 2.0]  # host memory: not a crossing
        with pytest.raises(TransferGuardError, match="OrtValue.numpy"):
            device.numpy()
        token = cuda._IN_DOWNLOAD.set(True)  # as inside CudaBackend.download
        try:
            assert device.numpy().tolist() == [0.0, 1.0, 2.0]
        finally:
            cuda._IN_DOWNLOAD.reset(token)
    assert dict(vars(ort.OrtValue)) == before  # restored
    assert issubclass(TransferGuardError, ResidencyError)
