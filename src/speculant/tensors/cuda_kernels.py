"""Hand-written CUDA kernels of the CUDA backend, compiled once per process by CuPy (NVRTC).

Each replaces a chain of CuPy array operations whose launches (one per operation, each with
its Python call) cost more than the work on decode-sized rows. Host semantics are the spec;
the CUDA tests compare both element for element.
"""

from __future__ import annotations

from typing import Any

ARGMAX_THREADS = 256  # threads per row (one block per row)

# The argmax rule over float32 rows [R, V]: the first index of the row's maximum, or -1
# (NO_TOKEN) where that maximum is not finite: a NaN or +inf in the row, or every element -inf.
# Each thread scans a strided slice in increasing index order (strict '>' keeps the first of
# equal values), then the block reduces the (value, index) pairs preferring the larger value,
# then the smaller index, and ORs the threads' "saw a NaN or +inf".
# ``SCORE`` is float, or unsigned short holding float16 bits that ``load`` widens exactly as
# it reads them (PTX cvt.f32.f16: no widened copy, no header).
_FIRST_ARGMAX_SOURCE = r"""
__device__ __forceinline__ float load(const float x) { return x; }
__device__ __forceinline__ float load(const unsigned short bits) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(bits));
    return x;
}
extern "C" __global__ void first_argmax_rows(const SCORE* scores, const int rows,
                                             const int width, int* out) {
    const int row = blockIdx.x;
    const SCORE* r = scores + (long long)row * width;
    float best = 0.0f;
    int best_i = width;  // width: no finite or -inf element seen
    int is_broken = 0;  // a NaN or +inf seen
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = load(r[i]);
        if (isnan(v) || (isinf(v) && v > 0.0f)) { is_broken = 1; continue; }
        if (best_i == width || v > best) { best = v; best_i = i; }
    }
    is_broken = __syncthreads_or(is_broken);
    __shared__ float shared_value[THREADS];
    __shared__ int shared_index[THREADS];
    shared_value[threadIdx.x] = best;
    shared_index[threadIdx.x] = best_i;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float other = shared_value[threadIdx.x + stride];
            const int other_i = shared_index[threadIdx.x + stride];
            const float mine = shared_value[threadIdx.x];
            const int mine_i = shared_index[threadIdx.x];
            if (other_i != width && (mine_i == width || other > mine ||
                                     (other == mine && other_i < mine_i))) {
                shared_value[threadIdx.x] = other;
                shared_index[threadIdx.x] = other_i;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[row] = is_broken || shared_index[0] == width || isinf(shared_value[0])
                   ? -1 : shared_index[0];
}
""".replace("THREADS", str(ARGMAX_THREADS))

# Greedy acceptance (tensors/acceptance.py) in one thread: ``a - 1`` leading drafts equal to
# the choice before them, then ``[a, choices...]`` (the committed ids are the choices: a
# leading accepted draft equals the choice it is compared with).
_ACCEPT_SOURCE = r"""
extern "C" __global__ void accept_greedy(const int* drafts, const int* choices, const int k,
                                         int* out) {
    int matching = 0;
    while (matching < k && drafts[matching] == choices[matching]) ++matching;
    out[0] = matching + 1;
    for (int i = 0; i <= k; ++i) out[1 + i] = choices[i];
}
"""

# A pass's small integer inputs written from kernel arguments (no upload, no temporary):
# up to four values at ``offset``, or ``start + i`` into every slot. ``INT`` is the buffer's
# integer type (int or long long).
_WRITE_INTS_SOURCE = r"""
extern "C" __global__ void write_ints(INT* dst, const int offset, const int count,
                                      const long long v0, const long long v1,
                                      const long long v2, const long long v3) {
    const long long values[4] = {v0, v1, v2, v3};
    for (int i = 0; i < count; ++i) dst[offset + i] = (INT)values[i];
}
extern "C" __global__ void write_arange(INT* dst, const int size, const long long start) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < size; i += blockDim.x * gridDim.x)
        dst[i] = (INT)(start + i);
}
"""
INT_TYPES = {"int32": "int", "int64": "long long"}

_KERNELS: dict[str, Any] = {}


def _kernel(cupy: Any, key: str, source: str, name: str) -> Any:
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS.setdefault(key, cupy.RawKernel(source, name))
    return kernel


def first_argmax_rows(cupy: Any, score_type: str = "float") -> Any:
    """The compiled ``first_argmax_rows`` kernel over ``score_type`` rows (``float``, or
    ``unsigned short``: float16 bits; grid: rows, block: ARGMAX_THREADS)."""
    return _kernel(cupy, f"first_argmax_rows:{score_type}",
                   _FIRST_ARGMAX_SOURCE.replace("SCORE", score_type), "first_argmax_rows")


def accept_greedy_kernel(cupy: Any) -> Any:
    """The compiled ``accept_greedy`` kernel (grid 1, block 1; drafts [k], choices [k + 1]
    int32, out [k + 2] int32)."""
    return _kernel(cupy, "accept_greedy", _ACCEPT_SOURCE, "accept_greedy")


def write_ints_kernel(cupy: Any, dtype: str, name: str) -> Any:
    """``write_ints`` or ``write_arange`` over an ``int32`` or ``int64`` buffer (grid 1,
    block 1 for ``write_ints``; any launch for ``write_arange``)."""
    return _kernel(cupy, f"{name}:{dtype}",
                   _WRITE_INTS_SOURCE.replace("INT", INT_TYPES[dtype]), name)


# Writes at positions that live on the device (tensors/seam_cursor.py): the position or the
# count is read by the kernel, never by the host. ``INT``/``IDX``: integer types of the
# buffer and of the index; ``ELEM``: an unsigned type of the copied elements' size.
_CURSOR_SOURCES = {
    "write_arange_from": r"""
extern "C" __global__ void write_arange_from(INT* dst, const int size, const IDX* start,
                                             const long long offset, const long long step) {
    const long long first = (long long)start[0] + offset;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < size; i += blockDim.x * gridDim.x)
        dst[i] = (INT)(first + step * i);
}
""",
    "take_at": r"""
extern "C" __global__ void take_at(const ELEM* src, ELEM* dst, const IDX* index,
                                   const long long offset, const long long outer,
                                   const long long extent, const long long inner) {
    long long at = (long long)index[0] + offset;
    at = at < 0 ? 0 : (at >= extent ? extent - 1 : at);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < outer * inner;
         i += (long long)blockDim.x * gridDim.x)
        dst[i] = src[((i / inner) * extent + at) * inner + i % inner];
}
""",
    "add_first": r"""
extern "C" __global__ void add_first(INT* total, const IDX* counts) {
    total[0] += (INT)counts[0];
}
""",
}
ELEM_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int",
              8: "unsigned long long"}


def cursor_kernel(cupy: Any, name: str, **types: str) -> Any:
    """The compiled cursor kernel ``name`` with its type names (``INT``, ``IDX``, ``ELEM``)
    replaced: ``write_arange_from`` and ``take_at`` any launch, ``add_first`` grid 1, block 1."""
    source = _CURSOR_SOURCES[name]
    for placeholder, type_name in types.items():
        source = source.replace(placeholder, type_name)
    key = ":".join([name, *(f"{k}={v}" for k, v in sorted(types.items()))])
    return _kernel(cupy, key, source, name)
