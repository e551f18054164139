"""Memory flat over 1,000 requests through `speculant serve --max-batch 8` (a subprocess, on
the tiny export pair with a batched graph of 8 rows), and every answer, streamed or not,
equal to its request's answer alone, received exactly once (scripts/serve_memory.py, whose
committed run is docs/evidence/serve-memory-1000.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_memory.py"


def test_a_thousand_requests_keep_memory_flat_and_every_answer_whole(tmp_path):
    spec = importlib.util.spec_from_file_location("serve_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    report = script.measure(tmp_path, script.arguments(["--requests", "1000"]))
    assert report["num_wrong"] == 0, report["wrong"]
    assert report["answered_once_and_equal"] == 1000
    assert report["rss_growth_after_warmup_mib"] <= report["max_growth_mib"] == 3.0
    assert report["mean_rows_per_step"] > 1  # the requests were decoded together
    assert report["passed"]
