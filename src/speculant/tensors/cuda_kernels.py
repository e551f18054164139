"""Hand-written CUDA kernels of the CUDA backend, compiled once per process by CuPy (NVRTC).

Each replaces a chain of CuPy array operations whose launches (one per operation, each with
its Python call) cost more than the work on decode-sized rows. Host semantics are the spec;
the CUDA tests compare both element for element.
"""

from __future__ import annotations

from typing import Any

ARGMAX_THREADS = 256  # threads per row (one block per row)

# The argmax rule over float32 rows [R, V]: the first index of the row's maximum, NaN never
# wins, a row without a non-NaN element yields 0. Each thread scans a strided slice in
# increasing index order (strict '>' keeps the first of equal values), then the block reduces
# the (value, index) pairs preferring the larger value, then the smaller index.
_FIRST_ARGMAX_SOURCE = r"""
extern "C" __global__ void first_argmax_rows(const float* scores, const int rows,
                                             const int width, int* out) {
    const int row = blockIdx.x;
    const float* r = scores + (long long)row * width;
    float best = 0.0f;
    int best_i = width;  // width: no non-NaN element seen
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = r[i];
        if (isnan(v)) continue;
        if (best_i == width || v > best) { best = v; best_i = i; }
    }
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
    if (threadIdx.x == 0) out[row] = shared_index[0] == width ? 0 : shared_index[0];
}
""".replace("THREADS", str(ARGMAX_THREADS))

_KERNELS: dict[str, Any] = {}


def first_argmax_rows(cupy: Any) -> Any:
    """The compiled ``first_argmax_rows`` kernel (grid: rows, block: ARGMAX_THREADS)."""
    kernel = _KERNELS.get("first_argmax_rows")
    if kernel is None:
        kernel = _KERNELS.setdefault("first_argmax_rows", cupy.RawKernel(
            _FIRST_ARGMAX_SOURCE, "first_argmax_rows"))
    return kernel
