"""The three proposers on CUDA, greedy and sampled: the same tokens and traces as on the CPU,
and nothing but ids (and the accepted count) read back (evidence.md E1, E5, E7).

Read-back accounting under sampling: 4 bytes for the prefill's draw, 4 per sampled draft, and
per verification (greedy steps included) 4 (k_r + 1) (keyed draws: the target's draw of every
row) or 8 (rejection sampling: [a, token]). Keyed draws on the device equal plain sampling
with the same seed at every k, auto included.

Run on the GPU machine: ``pytest -m cuda tests/cuda``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_probe import cuda_marks

import speculant
from builders import DEFAULT_DEVIATION_POSITIONS
from builders.transfer_guard import forbid_host_transfers
from builders.writers import write_chained_package, write_decoder_package

pytestmark = cuda_marks()

PROMPTS = ([5, 9, 3], [20, 8, 15, 12, 2])
MAX_NEW = 40
PROPOSERS = ("chained", "draft", "prompt_lookup")
DRAFT_DEVIATIONS = (DEFAULT_DEVIATION_POSITIONS - {7, 17, 40}) | {10, 28, 50}


@pytest.fixture(scope="module", params=["float32", "float16"])
def roots(request, tmp_path_factory) -> tuple[Path, Path]:
    pair = write_chained_package(tmp_path_factory.mktemp(f"pair-{request.param}"),
                                 dtype=request.param, fmt="onnx", max_proposal_width=8,
                                 rollback_positions=8)
    draft = write_decoder_package(tmp_path_factory.mktemp(f"draft-{request.param}"),
                                  dtype=request.param, rollback_positions=8,
                                  deviation_positions=DRAFT_DEVIATIONS)
    return pair, draft


@pytest.fixture(scope="module")
def engines(roots):
    pair, draft = roots
    return {"cpu": speculant.load(pair, "cpu", draft=draft),
            "cuda": speculant.load(pair, "cuda", draft=draft, use_tf32=False)}


def draft_draws(stats) -> int:
    """Sampled drafts: every draft of the chain and the draft model; none for lookup."""
    return 0 if stats.proposer == "prompt_lookup" else stats.drafts_proposed


@pytest.mark.parametrize("k", (1, 4, 8))
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_equals_cpu_and_reads_back_only_ids(engines, proposer, k):
    engine = engines["cuda"]
    for prompt in PROMPTS:
        cpu = engines["cpu"].generate(prompt, MAX_NEW, proposer=proposer, k=k)
        before = engine.seam.counters.snapshot()
        with forbid_host_transfers():
            run = engine.generate(prompt, MAX_NEW, proposer=proposer, k=k)
        after = engine.seam.counters.snapshot()
        assert run.token_ids == cpu.token_ids
        assert run.stats.trace == cpu.stats.trace
        assert after["host_staging_count"] == before["host_staging_count"]
        assert after["device_readback_bytes"] - before["device_readback_bytes"] == \
            4 * run.stats.argmax_rows


@pytest.mark.parametrize("acceptance", ("gumbel", "rejection"))
@pytest.mark.parametrize("k", (1, 4))
@pytest.mark.parametrize("proposer", (None, *PROPOSERS))
def test_sampled_equals_cpu_and_reads_back_only_ids(engines, proposer, k, acceptance):
    """The same seed draws the same noise (uniforms); the rows are computed on the device,
    so the CUDA run commits the CPU run's tokens, and reads back ids and a only."""
    engine = engines["cuda"]
    options = {"proposer": proposer, "k": k} if proposer else {}
    for prompt in PROMPTS:
        for seed in (0, 1, 2):
            sampling = {"temperature": 2.5, "top_p": 0.95, "seed": seed,
                        "acceptance": acceptance, **options}
            cpu = engines["cpu"].generate(prompt, MAX_NEW, **sampling)
            before = engine.seam.counters.snapshot()
            with forbid_host_transfers():
                run = engine.generate(prompt, MAX_NEW, **sampling)
            after = engine.seam.counters.snapshot()
            assert run.token_ids == cpu.token_ids
            assert run.stats.trace == cpu.stats.trace
            stats = run.stats
            assert after["host_staging_count"] == before["host_staging_count"]
            verified = stats.drafts_proposed + stats.rounds + stats.greedy_steps  # rows
            per_pass = 4 * verified if acceptance == "gumbel" else \
                8 * (stats.rounds + stats.greedy_steps)
            # the first token, the prefill row's finiteness check (its argmax id, once a
            # request: workflow/state.py record_prefill) and each sampled draft: one id each
            assert after["device_readback_bytes"] - before["device_readback_bytes"] == \
                4 * (2 + draft_draws(stats)) + per_pass


@pytest.mark.parametrize("k", (1, 2, 4, 8, "auto"))
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_speculative_equals_plain_sampling_on_the_device(engines, proposer, k):
    """Keyed draws: speculation on CUDA commits plain sampling's tokens for the seed."""
    engine = engines["cuda"]
    for prompt in PROMPTS:
        for seed in (0, 7):
            sampling = {"temperature": 2.5, "top_p": 0.95, "seed": seed, "stop_on_eos": False}
            plain = engine.generate(prompt, MAX_NEW, **sampling)
            run = engine.generate(prompt, MAX_NEW, proposer=proposer, k=k, **sampling)
            assert run.token_ids == plain.token_ids, (proposer, k, prompt, seed)
