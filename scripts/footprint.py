"""The built-in ``smollm2``'s footprint: its import's peak memory, the start time and the memory
resident once loaded. Each figure comes from a fresh Python process (``/proc/self/status``:
VmHWM is the peak resident set, VmRSS the current one), so nothing one phase left in memory
counts toward the next.

    uv run --extra cpu python scripts/footprint.py [--cache DIR] [--keep] [--import-only]

Phases, each its own process:

* ``import``: build the package from the GGUF into an empty cache (``smollm2()``); its peak
  resident set is the import's peak.
* ``start`` (run three times, the median reported): ``speculant.load("smollm2")`` from the
  built cache and one generated token; the wall time from the process's launch (Python's own
  start and the imports included) to the token, the resident set then and its peak.

The weights' size is the package's ONNX files and their external data, as stored (the target's
and the drafter's), so "resident / weights" reads against the goal of issue 39 (at most 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}
phase = sys.argv[1]
if phase == "import":
    from speculant_tools.builtin import smollm2
    print(json.dumps({"folder": str(smollm2("cpu")), **status()}))
else:
    import speculant
    engine = speculant.load("smollm2")
    engine.generate("Hello", 1)
    print(json.dumps({"folder": str(engine.package.root), **status()}))
"""


def run_phase(phase: str, cache: Path) -> dict:
    env = {**os.environ, "SPECULANT_CACHE": str(cache)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, phase], env=env, check=True,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - began
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "seconds": seconds}


def stored_weights(folder: Path) -> int:
    """Bytes of the package's graphs and their external data (tokenizer and YAML excluded)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()
               and path.suffix not in (".json", ".yaml", ".yml", ".jinja", ".lock"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="the cache to build into (default: a "
                        "temporary folder, removed afterwards unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--import-only", action="store_true",
                        help="measure the import's peak only (no start phases)")
    args = parser.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="speculant-footprint-"))
    try:
        built = run_phase("import", cache)
        if args.import_only:
            print(json.dumps({"import_seconds": round(built["seconds"], 1),
                              "import_peak_MiB": round(built["VmHWM"] / (1 << 20))}, indent=1))
            return
        starts = [run_phase("start", cache) for _ in range(args.starts)]
        weights = stored_weights(Path(built["folder"]))
        mib = 1 << 20
        median = {key: statistics.median(s[key] for s in starts)
                  for key in ("seconds", "VmRSS", "VmHWM")}
        report = {
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, "
                       f"load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}",
            "import_seconds": round(built["seconds"], 1),
            "import_peak_MiB": round(built["VmHWM"] / mib),
            "start_seconds": round(median["seconds"], 2),
            "resident_MiB": round(median["VmRSS"] / mib),
            "start_peak_MiB": round(median["VmHWM"] / mib),
            "weights_MiB": round(weights / mib),
            "resident_over_weights": round(median["VmRSS"] / weights, 2),
        }
        print(json.dumps(report, indent=1))
    finally:
        if args.cache is None and not args.keep:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
