"""Longrope (Phi-3 128k) on CUDA: every graph form's two RoPE tables, chosen per forward call
(the long one where the call's end passes ``original_max_position_embeddings``), give the
numpy reference's logits on the CUDA execution provider — GroupQueryAttention's cos/sin cache
inputs chosen by a ``Where`` included (docs/models.md, Phi-3).

Run on the GPU machine: ``pytest -m cuda tests/cuda``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_probe import cuda_marks

sys.path.insert(0, str(Path(__file__).parents[1] / "importers"))
from family_models import (  # noqa: E402
    HF_CONFIGS,
    LONG_IDS,
    hf_weights,
    package_logits,
    reference_logits,
    write_hf_folder,
)

from speculant_tools.importers import import_model  # noqa: E402

pytestmark = cuda_marks()


@pytest.mark.parametrize("cache, dtype, graph", [
    ("static", "float16", "auto"), ("static", "float32", "fused"),
    ("appended", "float32", "fused"), ("static", "float32", "explicit")])
@pytest.mark.parametrize("family", ["phi3-longrope", "phi3-partial-longrope"])
def test_longrope_on_cuda_equals_the_reference_across_the_original_context(
        tmp_path, family, cache, dtype, graph):
    cfg = HF_CONFIGS[family]
    package = import_model(write_hf_folder(tmp_path / "hf", family), tmp_path / "package",
                           dtype=dtype, cache=cache, graph=graph)
    for prefill in (12, 20):  # under the original context (16) decoding across it; over it
        blocks = [prefill] + [1] * (len(LONG_IDS) - prefill)
        expected = reference_logits(cfg, hf_weights(family), LONG_IDS, blocks=blocks)
        actual = package_logits(package, LONG_IDS, prefill, provider="CUDAExecutionProvider")
        np.testing.assert_allclose(actual, expected, rtol=0, err_msg=f"prefill {prefill}",
                                   atol=(2e-2 if dtype == "float16" else 2e-3)
                                   * np.abs(expected).max())
