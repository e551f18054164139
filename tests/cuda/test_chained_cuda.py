"""The chained round on CUDA: resident, counted, and equal to the CPU (evidence.md E1, E5).

Run on the GPU machine: ``pytest -m cuda tests/cuda``. Whether a GPU is present is decided by
asking CuPy's runtime and ONNX Runtime's provider list directly, never speculant's code, so a
regression in the seam or the sessions fails here instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gpu_probe import cuda_marks

import speculant
from builders.transfer_guard import forbid_host_transfers
from builders.writers import write_chained_package
from speculant.workflow.state import DecodeState

pytestmark = cuda_marks()

PROMPTS = ([5, 9, 3], [20, 8, 15, 12, 2])
MAX_NEW = 40
WIDTHS = (1, 2, 4, 8)


@pytest.fixture(scope="module", params=["float32", "float16"])
def package(request, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(f"chained-{request.param}")
    return write_chained_package(root, dtype=request.param, fmt="onnx", max_proposal_width=8,
                                 rollback_positions=8)


@pytest.fixture(scope="module")
def engines(package):
    return {"cpu": speculant.load(package, "cpu"),
            "cuda": speculant.load(package, "cuda", use_tf32=False),
            "staged": speculant.load(package, "cuda", use_tf32=False, outputs_on_host=True)}


def expected_argmax_rows(stats) -> int:
    """1 (prefill) + greedy steps + Σ (2 k_r + 1) (evidence.md §2, residency.md §9)."""
    return 1 + stats.greedy_steps + sum(2 * k + 1 for k, _ in stats.trace)


@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("prompt", PROMPTS, ids=["p3", "p5"])
def test_resident_chain_equals_cpu_and_reads_back_only_ids(engines, prompt, k):
    cpu = engines["cpu"].generate(prompt, MAX_NEW, speculative=True, k=k)
    greedy = engines["cpu"].generate(prompt, MAX_NEW)
    engine = engines["cuda"]
    before = engine.seam.counters.snapshot()
    with forbid_host_transfers():
        run = engine.generate(prompt, MAX_NEW, speculative=True, k=k)
    after = engine.seam.counters.snapshot()
    assert run.token_ids == cpu.token_ids == greedy.token_ids
    assert run.stats.trace == cpu.stats.trace
    assert run.stats.rollbacks > 0 and run.stats.drafts_proposed > 0
    assert after["host_staging_count"] - before["host_staging_count"] == 0
    rows = expected_argmax_rows(run.stats)
    assert run.stats.argmax_rows == rows
    assert after["device_readback_bytes"] - before["device_readback_bytes"] == 4 * rows
    assert after["embedding_table_reads"] == 1
    assert after["embedding_table_mirrors"] == 1


@pytest.mark.parametrize("k", (1, 4, 8))
def test_host_staged_outputs_give_the_same_tokens_and_tally(engines, k):
    for prompt in PROMPTS:
        cpu = engines["cpu"].generate(prompt, MAX_NEW, speculative=True, k=k)
        staged = engines["staged"].generate(prompt, MAX_NEW, speculative=True, k=k)
        assert staged.token_ids == cpu.token_ids
        assert staged.stats.trace == cpu.stats.trace


def test_greedy_on_cuda_reads_back_four_bytes_per_token(engines):
    engine = engines["cuda"]
    before = engine.seam.counters.snapshot()
    with forbid_host_transfers():
        run = engine.generate(PROMPTS[0], MAX_NEW)
    after = engine.seam.counters.snapshot()
    assert run.token_ids == engines["cpu"].generate(PROMPTS[0], MAX_NEW).token_ids
    assert after["host_staging_count"] == before["host_staging_count"]
    assert after["device_readback_bytes"] - before["device_readback_bytes"] == 4 * MAX_NEW


def test_rolled_back_cells_stay_on_the_device_at_the_truncated_length(engines, monkeypatch):
    engine = engines["cuda"]
    seen: list[tuple[int, list[tuple[str, int]]]] = []
    advance = DecodeState.advance

    def recording_advance(self, vp, keep):
        advance(self, vp, keep)
        seen.append((self.consumed, [(v.residency, v.shape[self.plan.cells[n].sequence_axis])
                                     for n, v in self.cells.items()]))

    monkeypatch.setattr(DecodeState, "advance", recording_advance)
    run = engine.generate(PROMPTS[1], MAX_NEW, speculative=True, k=4)
    assert run.stats.rollbacks > 0
    for consumed, cells in seen:
        for residency, extent in cells:
            assert residency == "cuda:0"
            assert extent == consumed


def test_sessions_share_speculants_stream(engines):
    engine = engines["cuda"]
    backend = engine.seam.backend("cuda:0")
    assert engine.seam.ordering == "shared_stream"
    for session in engine.sessions.values():
        options = session.provider_options["CUDAExecutionProvider"]
        assert options["user_compute_stream"] == str(backend.stream.ptr)
        assert options["use_tf32"] == "0"
    engine.generate(PROMPTS[0], MAX_NEW, speculative=True, k=4)
    assert engine.seam.counters.fences == 0


def test_fence_mode_gives_the_same_tokens_and_fences(package, engines):
    fenced = speculant.load(package, "cuda", use_tf32=False, ordering="fence")
    cpu = engines["cpu"].generate(PROMPTS[1], MAX_NEW, speculative=True, k=4)
    run = fenced.generate(PROMPTS[1], MAX_NEW, speculative=True, k=4)
    assert run.token_ids == cpu.token_ids
    assert fenced.seam.ordering == "fence"
    assert fenced.seam.counters.fences > 0


MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys, cupy, speculant
    engine = speculant.load(sys.argv[1], "cuda", use_tf32=False)
    counters = engine.seam.counters
    engine.generate([5, 9, 3], 40, speculative=True, k=4)          # warm-up
    baseline = (counters.live_device_allocations, counters.live_device_bytes)
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    after_each, proposals = [], 0
    while proposals < 100:
        run = engine.generate([5, 9, 3], 40, speculative=True, k=4)
        proposals += run.stats.rounds
        after_each.append((counters.live_device_allocations, counters.live_device_bytes))
    free_after = cupy.cuda.runtime.memGetInfo()[0]
    print(json.dumps({"baseline": baseline, "after_each": after_each, "proposals": proposals,
                      "free_delta": free_before - free_after}))
""")


def test_live_allocations_are_flat_over_100_proposals(package):
    """In a process of its own: the counts are process-wide (residency.md §9 target 4)."""
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(package)], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["proposals"] >= 100
    assert all(tuple(point) == tuple(report["baseline"]) for point in report["after_each"])
    assert abs(report["free_delta"]) < 64 * 2**20


def test_cli_reports_zero_staging_on_cuda(package):
    from typer.testing import CliRunner

    from speculant.cli import full_app

    app = full_app()

    result = CliRunner().invoke(app, ["generate", str(package), "--device", "cuda",
                                      "--speculative", "--k", "4", "--stats",
                                      "--max-new-tokens", "40"])
    assert result.exit_code == 0, result.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in result.stderr.splitlines() if line.count("│") >= 3}
    assert rows["host_staging_count"] == "0"
    assert int(rows["device_readback_bytes"]) == 4 * int(rows["argmax_rows"])
