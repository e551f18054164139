"""The `Backend` protocol: both implementations define it, the host one as the reference; the
seam reaches a backend by residency and formats error context only when it raises."""

from __future__ import annotations

import gc
import inspect
import weakref

import numpy as np
import pytest

from speculant.errors import ContractError, ResidencyError
from speculant.tensors import HOST, NUMPY_DTYPES, Backend, TensorSeam, Value
from speculant.tensors.cuda import CudaBackend
from speculant.tensors.host import HostBackend

METHODS = sorted(name for name, member in vars(Backend).items()
                 if callable(member) and not name.startswith("_"))


def test_the_protocol_lists_every_operation_transfer_and_primitive():
    assert METHODS == sorted([
        "window", "gather", "scatter", "zeros", "write_ints", "write_arange", "write_ids",
        "write_arange_from", "take_at", "add_first", "accept", "argmax", "distribution",
        "sample", "rejection", "keyed",
        "download", "mark", "is_done", "seconds_between", "upload", "peer_copy", "synchronize",
        "write_batch", "unsupported_reason", "pointer", "compute_stream", "wrap"])


@pytest.mark.parametrize("implementation", [HostBackend, CudaBackend])
def test_each_backend_implements_the_protocol(implementation):
    for name in METHODS:
        declared = inspect.signature(getattr(Backend, name))
        defined = inspect.signature(getattr(implementation, name))
        assert list(defined.parameters) == list(declared.parameters), (implementation, name)
    assert isinstance(implementation.device_kind, str)


def test_the_seam_reaches_backends_by_residency():
    seam = TensorSeam()
    assert seam.backend(HOST) is seam.host and seam.host.counters is seam.counters
    with pytest.raises(ResidencyError, match=r"no 'cuda' implementation.*speculant\[cuda\]"):
        seam.backend("cuda:0")


def test_host_pointer_is_the_first_byte_and_needs_contiguity():
    host = HostBackend()
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert host.pointer(Value.host(array)) == array.ctypes.data
    strided = Value(array[:, 1:3], HOST, "float32")
    with pytest.raises(ContractError, match="not C-contiguous"):
        host.pointer(strided)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_host_wrap_shares_the_memory_and_keeps_its_owner(dtype):
    host = HostBackend()

    class Owner:  # stands in for an OrtValue
        def __init__(self, array):
            self.array = array

    owner = Owner(np.arange(6).astype(NUMPY_DTYPES[dtype]).reshape(2, 3))
    expected = owner.array.copy()
    wrapped = host.wrap(owner.array.ctypes.data, (2, 3), dtype, HOST, owner)
    assert wrapped.owner is owner and not wrapped.owned and wrapped.dtype == dtype
    assert wrapped.data.dtype == expected.dtype and np.array_equal(wrapped.data, expected)
    assert not wrapped.data.flags.writeable  # someone else's memory: read only
    alive = weakref.ref(owner)
    data = wrapped.data
    del owner, wrapped
    gc.collect()
    assert alive() is not None  # the array over the memory keeps its owner
    assert np.array_equal(data, expected)
    del data
    gc.collect()
    assert alive() is None


def test_host_wrap_of_nothing_is_an_owned_host_value():
    empty = HostBackend().wrap(0, (2, 0), "float16", HOST, None)
    assert empty.shape == (2, 0) and empty.owned and empty.data.dtype == np.float16


def test_host_transfers_are_copies_and_ordering_is_free():
    host = HostBackend()
    value = Value.host(np.arange(4, dtype=np.int32))
    for copy in (Value.host(host.download(value)), host.upload(value, HOST),
                 host.peer_copy(value, HOST)):
        assert copy.owned and np.array_equal(copy.data, value.data)
        assert not np.shares_memory(copy.data, value.data)
    with host.write_batch():
        host.synchronize(HOST)
    assert host.compute_stream(HOST) is None
    assert host.unsupported_reason(HOST) is None
    assert "not the host" in host.unsupported_reason("cuda:0")


def test_success_never_formats_error_context(monkeypatch):
    """The operands' descriptions are built only when an error is raised."""
    seam = TensorSeam()
    cube = Value.host(np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4))
    table = Value.host(np.arange(12, dtype=np.float32).reshape(3, 4))

    def no_describe(self):
        raise AssertionError("describe() on the success path")

    monkeypatch.setattr(Value, "describe", no_describe)
    seam.slice_axis(cube, 2, 1, 2)
    seam.slice_axis(cube, 1, 0, 1)
    seam.truncate_axis(cube, 2, 3)
    seam.last_along_axis(cube, 2)
    fused = seam.zeros((1, 1, 8), "float32", HOST)
    seam.scatter_into_last_axis(fused, seam.gather_rows(table, [2]), 0)
    seam.read_token_ids(seam.argmax_rows(table))
    seam.adopt(cube, HOST)
    monkeypatch.undo()
    with pytest.raises(ResidencyError, match=r"\[2, 3\] float32 on cuda:0"):
        seam.slice_axis(Value(np.zeros((2, 3), np.float32), "cuda:0", "float32"), 1, 0, 1)
