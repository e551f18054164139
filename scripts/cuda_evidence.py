"""Run the CUDA evidence on a GPU machine and write one JSON report.

    PYTHONPATH=/tmp/site:$PWD/src python3 scripts/cuda_evidence.py OUT_DIR [--sanitizer]
        [--sanitizer-fast-path]

What it records: the device, driver and package versions; the outcome of every test marked
``cuda`` (tests/tensors, tests/cuda) from a JUnit report; a chained run of the hermetic fixture
per width and dtype with its counters (host staging, read-back bytes, argmax rows) next to the
CPU run's tokens; and, with ``--sanitizer``, the summaries of compute-sanitizer memcheck and
racecheck over the differential tests and one chained run.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

CHAINED_RUN = """
import sys, speculant
from builders.writers import write_chained_package
root = write_chained_package(sys.argv[1], dtype="float16", fmt="onnx")
engine = speculant.load(root, "cuda", use_tf32=False)
run = engine.generate([5, 9, 3], 24, speculative=True, k=4)
print(run.token_ids, engine.seam.counters.snapshot())
"""

# The fast path (issue 12): static caches, the round in place, overlapped runs, eager (a
# captured graph would hide its kernels' launches from the sanitizer's view of our own); greedy
# with a pass queued ahead of the host and its read-back on the reader stream
STATIC_RUN = """
import sys, onnxruntime, speculant
onnxruntime.set_default_logger_severity(3)  # the sanitizer's lines, not ORT's warnings
from speculant.package.builtin import demo
from speculant_tools.export import convert
static = convert(demo(), sys.argv[1] + "/static", "float16", cache="static")
engine = speculant.load(static, "cuda", use_tf32=False, cuda_graphs=False)
run = engine.generate(engine.tokenizer.encode("def fibonacci(n):"), 24, speculative=True, k=4)
print(run.token_ids, run.stats.trace, engine.seam.counters.snapshot())
greedy = engine.generate(engine.tokenizer.encode("def fibonacci(n):"), 24)  # a pass queued ahead
print(greedy.token_ids, engine.seam.counters.snapshot())
"""


# Our own kernels (tensors/cuda_kernels.py: the argmax's shared-memory reduction, the accept
# kernel, the small writes and the cursor), each run by a test that compares it with the host
OWN_KERNEL_TESTS = ["tests/tensors/test_cuda_seam.py", "tests/cuda/test_round_in_place_cuda.py",
                    "tests/cuda/test_rounds_ahead_cuda.py", "-k",
                    "argmax_random or argmax_special or accept_kernel or small_writes"
                    " or cursor_writes"]
# racecheck reports a hazard over two lines: "Error: Race reported between Read access at
# KERNEL+0x300" then "and Write access at KERNEL+0x5430 [24 hazards]"
HAZARD = re.compile(r"(Error|Warning): Race reported between (\w+) access at ([^\s+]+)")
HAZARD_PAIR = re.compile(r"and (\w+) access at ([^\s+]+)\S*(?: \[(\d+) hazards?\])?")


def sanitizer_summary(code: int, log: str) -> dict:
    """The sanitizer's own lines (``=========``) and its hazards by kernel, itemized: per
    "SEVERITY FIRST-ACCESS/SECOND-ACCESS in KERNEL", the reports and the hazards they count."""
    lines = [line for line in log.splitlines() if line.startswith("=========")]
    hazards: dict[str, dict[str, int]] = {}
    for first, second in zip(lines, lines[1:] + [""], strict=True):
        found = HAZARD.search(first)
        if not found:
            continue
        pair = HAZARD_PAIR.search(second)
        kernel = found[3] if not pair or pair[2] == found[3] else f"{found[3]} / {pair[2]}"
        key = f"{found[1]} {found[2]}/{pair[1] if pair else '?'} in {kernel}"
        entry = hazards.setdefault(key, {"reports": 0, "hazards": 0})
        entry["reports"] += 1
        entry["hazards"] += int(pair[3]) if pair and pair[3] else 1
    summary = [line for line in lines if "SUMMARY" in line]
    return {"exit_code": code, "summary": summary, "hazards_by_kernel": hazards,
            "sanitizer_lines": lines[:60], "tail": log[-600:]}


def sh(command: list[str], timeout: int = 600) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout} s: {exc}"


def junit_outcomes(path: Path) -> dict:
    tree = ET.parse(path)
    outcomes: dict[str, str] = {}
    for case in tree.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        outcomes[name] = ("failed" if tags & {"failure", "error"} else
                          "skipped" if "skipped" in tags else "passed")
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"counts": counts, "tests": outcomes}


def chained_runs() -> list[dict]:
    import speculant
    from builders.writers import write_chained_package

    runs = []
    for dtype in ("float32", "float16"):
        root = write_chained_package(tempfile.mkdtemp(), dtype=dtype, fmt="onnx",
                                     max_proposal_width=8, rollback_positions=8)
        cpu = speculant.load(root, "cpu")
        for k in (1, 2, 4, 8):
            engine = speculant.load(root, "cuda", use_tf32=False)
            started = time.perf_counter()
            run = engine.generate([20, 8, 15, 12, 2], 40, speculative=True, k=k)
            elapsed = time.perf_counter() - started
            stats = run.stats
            counters = engine.seam.counters.snapshot()
            rows = 1 + stats.greedy_steps + sum(2 * kr + 1 for kr, _ in stats.trace)
            runs.append({
                "dtype": dtype, "k": k, "tokens_equal_cpu":
                    run.token_ids == cpu.generate([20, 8, 15, 12, 2], 40, speculative=True,
                                                  k=k).token_ids,
                "tokens_equal_cpu_greedy":
                    run.token_ids == cpu.generate([20, 8, 15, 12, 2], 40).token_ids,
                "rounds": stats.rounds, "greedy_steps": stats.greedy_steps,
                "rounds_with_first_draft_accepted": stats.rounds_with_first_draft_accepted,
                "drafts_proposed": stats.drafts_proposed,
                "accepted_drafts": stats.accepted_drafts, "rollbacks": stats.rollbacks,
                "rolled_back_cells": stats.rolled_back_cells,
                "proposer_invocations": stats.proposer_invocations,
                "mean_accepted_length": stats.mean_accepted_length,
                "argmax_rows": stats.argmax_rows, "argmax_rows_expected": rows,
                "readback_bytes_per_round_formula": "4 * (2 k_r + 1)",
                "counters": counters, "seconds": round(elapsed, 4)})
    return runs


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    _, gpu = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                 "--format=csv,noheader"])
    report["device"] = gpu.strip()
    versions = {"python": platform.python_version()}
    for module in ("onnxruntime", "cupy", "numpy", "onnx", "ml_dtypes", "pydantic"):
        try:
            versions[module] = __import__(module).__version__
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            versions[module] = f"unavailable: {exc}"
    import onnxruntime

    report["versions"] = versions
    report["providers"] = onnxruntime.get_available_providers()
    junit = out / "cuda-junit.xml"
    code, log = sh([sys.executable, "-m", "pytest", "-m", "cuda", "tests/tensors", "tests/cuda",
                    "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"], timeout=500)
    report["pytest"] = {"exit_code": code, "tail": log[-4000:], **junit_outcomes(junit)}
    report["chained_runs"] = chained_runs()
    if "--sanitizer" in sys.argv and shutil.which("compute-sanitizer"):
        script = out / "chained_run.py"
        script.write_text(CHAINED_RUN)
        sanitizer = {}
        for tool in ("memcheck", "racecheck"):
            code, log = sh(["compute-sanitizer", f"--tool={tool}", "--error-exitcode=3",
                            sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-x",
                            "-p", "no:cacheprovider", "tests/tensors/test_cuda_seam.py"],
                           timeout=400)
            sanitizer[f"{tool}_differential"] = {"exit_code": code, "tail": log[-1500:]}
            code, log = sh(["compute-sanitizer", f"--tool={tool}", "--error-exitcode=3",
                            sys.executable, str(script), tempfile.mkdtemp()], timeout=300)
            sanitizer[f"{tool}_chained_run"] = {"exit_code": code, "tail": log[-1500:]}
        report["compute_sanitizer"] = sanitizer
    if "--sanitizer-fast-path" in sys.argv and shutil.which("compute-sanitizer"):
        script = out / "static_run.py"
        script.write_text(STATIC_RUN)
        fast = {}
        for tool in ("memcheck", "racecheck"):
            code, log = sh(["compute-sanitizer", f"--tool={tool}", "--error-exitcode=3",
                            sys.executable, str(script), tempfile.mkdtemp()], timeout=240)
            fast[f"{tool}_static_in_place_run"] = sanitizer_summary(code, log)
            code, log = sh(["compute-sanitizer", f"--tool={tool}", "--error-exitcode=3",
                            sys.executable, "-m", "pytest", "-m", "cuda", "-q",
                            "-p", "no:cacheprovider", *OWN_KERNEL_TESTS], timeout=300)
            fast[f"{tool}_own_kernels"] = sanitizer_summary(code, log)
        report["compute_sanitizer_fast_path"] = fast
    (out / "cuda-residency.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: report[k] for k in ("device", "versions")}, indent=1))
    print("pytest", report["pytest"]["exit_code"], report["pytest"]["counts"])
    print(report["pytest"]["tail"][-2500:])


if __name__ == "__main__":
    main()
