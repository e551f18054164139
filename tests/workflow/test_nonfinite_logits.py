"""A target whose weights are NaN (or overflow to +inf) stops the decode with a ContractError
naming its artifact and the remedy, on every path that chooses a token: greedy steps, rounds
with drafts, and sampling. Before, the argmax skipped NaN and took id 0 (the fixture's EOS
here): one token and ``stop: eos``, silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import speculant
from builders.writers import write_decoder_package
from speculant.errors import ContractError


def poisoned_package(root: Path, value: float) -> Path:
    """The tiny decoder with every float initializer set to ``value``."""
    write_decoder_package(root)
    path = root / "decoder" / "model.onnx"
    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f":
            tensor.CopyFrom(numpy_helper.from_array(np.full_like(array, value), tensor.name))
    onnx.save(model, str(path))
    return root


@pytest.fixture(scope="module")
def nan_engine(tmp_path_factory):
    return speculant.load(poisoned_package(tmp_path_factory.mktemp("nan") / "pkg", np.nan))


@pytest.mark.parametrize("options", [
    dict(max_new_tokens=8),
    dict(max_new_tokens=8, proposer="prompt_lookup", k=2),
    dict(max_new_tokens=8, temperature=0.8, seed=1),
], ids=["greedy", "prompt_lookup", "sampling"])
def test_nan_weights_are_a_typed_error(nan_engine, options) -> None:
    with pytest.raises(ContractError) as info:
        nan_engine.generate([5, 6, 7, 5, 6], speculant.GenerationOptions(**options))
    message = str(info.value)
    assert "model.onnx" in message and "pipeline.workflow.components.decoder" in message
    assert "no finite maximum (NaN or +inf)" in message
    assert "Remedy: check the target's weights for NaN" in message


def test_infinite_weights_are_a_typed_error(tmp_path: Path) -> None:
    engine = speculant.load(poisoned_package(tmp_path / "pkg", np.inf))
    with pytest.raises(ContractError, match="no finite maximum"):
        engine.generate([5, 6, 7], speculant.GenerationOptions(max_new_tokens=4))
