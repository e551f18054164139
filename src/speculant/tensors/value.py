"""`Value`: an array, where it lives, and its metadata dtype (docs/design/spec/residency.md §2)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from speculant.dtypes import DTYPES, NUMPY_DTYPES
from speculant.errors import INSTALL_CUDA, ContractError, ResidencyError

HOST = "host"
NO_TOKEN = -1  # the id of scores without a finite maximum (docs/design/spec/runtime.md §7)
FLOAT_DTYPES = tuple(name for name in NUMPY_DTYPES if DTYPES[name].is_float)


def window_is_view(shape: Sequence[int], axis: int, length: int) -> bool:
    """Whether the window ``length`` of ``axis`` is a view.

    True exactly when the extents before ``axis`` multiply to 1 (the window is one contiguous
    range of the storage) or the window is the whole axis; any other window is strided and is
    assembled into an owned contiguous copy.
    """
    return math.prod(shape[:axis]) == 1 or length == shape[axis]


_NAME_OF_NUMPY = {np_dtype: name for name, np_dtype in NUMPY_DTYPES.items()}


def dtype_of_numpy(array_dtype: np.dtype) -> str:
    """The metadata dtype name of a numpy dtype (bfloat16 through ml_dtypes)."""
    name = _NAME_OF_NUMPY.get(np.dtype(array_dtype))
    if name is None:
        raise TypeError(f"numpy dtype {array_dtype} has no metadata dtype")
    return name


@dataclass(eq=False)
class Value:
    """A tensor and where its bytes are.

    ``data`` is a C-contiguous ``numpy.ndarray`` (host) or ``cupy.ndarray`` (CUDA).
    ``dtype`` is the normalized metadata dtype and is authoritative (bfloat16 is stored as
    ``uint16`` words on CUDA). ``owner`` keeps the storage alive (an ``OrtValue`` or the parent
    of a view). Only ``owned`` buffers (allocated by speculant) may be written.
    """

    data: Any
    residency: str
    dtype: str
    owner: Any = None
    owned: bool = False
    kind: Literal["tensor", "token_ids"] = "tensor"
    _extra: dict = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape  # numpy and CuPy both keep a tuple of Python ints

    @property
    def rank(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def describe(self) -> str:
        return f"{list(self.shape)} {self.dtype} on {self.residency}"

    @classmethod
    def host(cls, array: np.ndarray, dtype: str | None = None, *, owned: bool = True) -> Value:
        """Wrap a host array (made C-contiguous) as a host value."""
        array = np.asarray(array, order="C")
        return cls(array, HOST, dtype or dtype_of_numpy(array.dtype), owned=owned)


@dataclass(frozen=True)
class Residency:
    """Where a value's bytes live: the host, or the CUDA device ``ordinal``.

    :meth:`parse` is the one reader of the words for it (``cpu`` or ``host``, ``cuda``,
    ``cuda:N``); ``str()`` is the name a :class:`Value` carries (``host`` or ``cuda:N``), and
    ``Residency.parse(str(r)) == r``.
    """

    kind: Literal["host", "cuda"]
    ordinal: int = 0  # the CUDA device; 0 on the host

    def __str__(self) -> str:
        return HOST if self.kind == HOST else f"cuda:{self.ordinal}"

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def parse(text: str) -> Residency:
        """The residency ``text`` names (cached: the hot path asks per operation); anything
        else is a :class:`ResidencyError` naming the value and the accepted forms."""
        kind, colon, ordinal = str(text).partition(":")
        if text in ("cpu", HOST):
            return Residency(HOST)
        if kind == "cuda" and (ordinal.isdecimal() or not colon):
            return Residency("cuda", int(ordinal or 0))
        raise ResidencyError(
            f"unknown device '{text}': speculant runs on the host ('cpu') or on CUDA ('cuda', "
            "'cuda:N')", path="device", value=text, expected="'cpu', 'cuda' or 'cuda:N'",
            remedy=f"load with device='cpu', or device='cuda:N' after {INSTALL_CUDA}")


@functools.lru_cache(maxsize=64)
def cuda_ordinal(residency: str) -> int:
    """``N`` of a ``cuda:N`` residency; any other is a typed error (cached: the hot path asks
    for it per operation)."""
    place = Residency.parse(residency)
    if place.kind != "cuda":
        raise ContractError(f"residency {residency!r} is not a CUDA residency",
                            value=residency, expected="'cuda:N'")
    return place.ordinal
