"""The CUDA evidence script's reading of compute-sanitizer's racecheck log
(`scripts/cuda_evidence.py`): the lines below are the H200's (2026-12-03), a hazard report
spread over two lines, which an earlier one-line pattern never matched (hazards_by_kernel came
out empty beside "77 hazards displayed")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cuda_evidence.py"
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_" \
        "cga1x1x1_kernel0_0"
LOG = "\n".join([
    "========= COMPUTE-SANITIZER",
    f"========= Error: Race reported between Read access at {CUDNN}+0x300",
    f"=========     and Write access at {CUDNN}+0x5430 [24 hazards]",
    "========= ",
    f"========= Error: Race reported between Read access at {CUDNN}+0x300",
    f"=========     and Write access at {CUDNN}+0x5430 [24 hazards]",
    "========= ",
    "========= Warning: Race reported between Write access at argmax_rows+0x10",
    "=========     and Read access at argmax_rows+0x80",
    "..........   [100%]",  # pytest's, not the sanitizer's
    "========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)",
])


def load_script():
    spec = importlib.util.spec_from_file_location("cuda_evidence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_line_hazard_reports_are_counted_by_kernel():
    summary = load_script().sanitizer_summary(3, LOG)
    assert summary["hazards_by_kernel"] == {
        f"Error Read/Write in {CUDNN}": {"reports": 2, "hazards": 48},
        "Warning Write/Read in argmax_rows": {"reports": 1, "hazards": 1},
    }
    assert summary["summary"] == [LOG.splitlines()[-1]] and summary["exit_code"] == 3
    assert "..........   [100%]" not in summary["sanitizer_lines"]


def test_a_clean_log_has_no_hazards():
    clean = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed"
    assert load_script().sanitizer_summary(0, clean)["hazards_by_kernel"] == {}
