"""The tensor seam: `Value`, `TensorOps` and its implementations (residency.md)."""

from speculant.tensors.ops import ResidencyCounters, TensorOps
from speculant.tensors.seam import TensorSeam, make_seam
from speculant.tensors.value import HOST, NUMPY_DTYPES, Value

__all__ = ["HOST", "NUMPY_DTYPES", "ResidencyCounters", "TensorOps", "TensorSeam", "Value",
           "make_seam"]
