"""The tensor seam: `Value`, `Backend` and its backends (docs/design/spec/residency.md)."""

from speculant.tensors.backend import Backend, ResidencyCounters
from speculant.tensors.devices import make_seam
from speculant.tensors.seam import TensorSeam
from speculant.tensors.value import HOST, NO_TOKEN, NUMPY_DTYPES, Residency, Value

__all__ = ["HOST", "NO_TOKEN", "NUMPY_DTYPES", "Backend", "Residency", "ResidencyCounters",
           "TensorSeam", "Value", "make_seam"]
