"""What the argmax rule's "no finite maximum -> NO_TOKEN" guard costs (runtime.md §7).

Times ``argmax_rows`` on score rows of decode shapes ([1, V] a greedy step, [k + 1, V] a
round) with the guard and without it: on the host the numpy rule against plain ``np.argmax``;
on CUDA, where CuPy is installed, the kernel of ``tensors/cuda_kernels.py`` against the same
kernel from an older ``cuda_kernels.py`` (``--baseline FILE``, e.g. written by
``git show 1d0c65c:src/speculant/tensors/cuda_kernels.py > /tmp/old_kernels.py``). Prints one
line per (device, shape) with the median of several repeats in microseconds.

    python scripts/argmax_guard_cost.py [--baseline /tmp/old_kernels.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import timeit

import numpy as np

from speculant.tensors.cuda_kernels import ARGMAX_THREADS, first_argmax_rows
from speculant.tensors.host import argmax_rows_numpy

SHAPES = [(1, 4096), (1, 49152), (5, 49152), (9, 151936)]
REPEATS = 7


def unguarded_numpy(scores: np.ndarray) -> np.ndarray:
    return np.argmax(scores, axis=1).astype(np.int32)


def host_lines(rng: np.random.Generator) -> list[str]:
    lines = []
    for rows, width in SHAPES:
        scores = rng.standard_normal((rows, width)).astype(np.float32)
        times = {}
        for name, fn in [("unguarded", unguarded_numpy), ("guarded", argmax_rows_numpy)]:
            runs = timeit.repeat(lambda fn=fn, scores=scores: fn(scores), number=200,
                                 repeat=REPEATS)
            times[name] = statistics.median(runs) / 200 * 1e6
        lines.append(f"host [{rows}, {width}]: unguarded {times['unguarded']:.1f} us, "
                     f"guarded {times['guarded']:.1f} us")
    return lines


def cuda_lines(rng: np.random.Generator, baseline: str | None) -> list[str]:
    import cupy as cp

    kernels = {"guarded": first_argmax_rows(cp, "float")}
    if baseline:
        spec = importlib.util.spec_from_file_location("old_kernels", baseline)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        kernels["unguarded"] = old.first_argmax_rows(cp, "float")
    lines = []
    for rows, width in SHAPES:
        scores = cp.asarray(rng.standard_normal((rows, width)).astype(np.float32))
        out = cp.zeros((rows,), cp.int32)
        times = {}
        arguments = (scores, np.int32(rows), np.int32(width), out)
        for name, kernel in kernels.items():
            for _ in range(20):
                kernel((rows,), (ARGMAX_THREADS,), arguments)
            samples = []
            for _ in range(REPEATS):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(200):
                    kernel((rows,), (ARGMAX_THREADS,), arguments)
                end.record()
                end.synchronize()
                samples.append(cp.cuda.get_elapsed_time(start, end) / 200 * 1e3)
            times[name] = statistics.median(samples)
        lines.append(f"cuda [{rows}, {width}]: " + ", ".join(
            f"{name} {t:.2f} us" for name, t in sorted(times.items(), reverse=True)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="an older cuda_kernels.py, for the CUDA baseline")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for line in host_lines(rng):
        print(line)
    if importlib.util.find_spec("cupy") is not None:
        for line in cuda_lines(rng, args.baseline):
            print(line)


if __name__ == "__main__":
    main()
