"""``--quantize-drafter int4``: the chained drafter's linear layers as MatMulNBits, the
target untouched, the outputs still greedy's (a draft is only ever verified)."""

from __future__ import annotations

import onnx
import pytest

import speculant
from speculant_tools.export import convert, export_hf
from speculant_tools.export.config import ExportError
from speculant_tools.export.cost_scale import scale_target

PROMPTS = ([3, 7, 11], [1, 2, 3, 4, 5, 6])


def op_counts(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.fixture(scope="module", params=["float32", "float16"])
def quantized(request, pair_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4-drafter") / request.param
    return convert(pair_root, out, request.param, cache="static", quantize_drafter="int4")


def test_only_the_drafter_is_quantized(quantized):
    graph = onnx.load(str(quantized / "assistant" / "model.onnx")).graph
    weights = {t.name for t in graph.initializer}
    assert op_counts(quantized / "assistant" / "model.onnx")["MatMulNBits"] == 7  # in, q, o,
    # the MLP's three and the head; what MatMul is left multiplies activations (attention)
    assert not [n.input for n in graph.node if n.op_type == "MatMul" and weights & set(n.input)]
    assert "MatMulNBits" not in op_counts(quantized / "target" / "model.onnx")


@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_the_int4_drafter_keeps_greedy_outputs(quantized, k):
    engine = speculant.load(quantized)
    for prompt in PROMPTS:
        greedy = engine.generate(prompt, 24, stop_on_eos=False)
        chained = engine.generate(prompt, 24, stop_on_eos=False, proposer="chained", k=k)
        assert chained.token_ids == greedy.token_ids
        assert chained.stats.drafts_proposed > 0


def test_scale_target_checks_the_float_drafter_then_quantizes(pair_root, tmp_path):
    result = scale_target(pair_root, tmp_path / "scaled", "1K", num_layers=3,
                          intermediate_size=48, check_tokens=8, external_data=True,
                          quantize_drafter="int4")
    drafter = result.root / "assistant" / "model.onnx"
    assert result.check["greedy_equal"] and result.check["chained_trace_equal"]
    assert op_counts(drafter)["MatMulNBits"] == 7
    assert not (drafter.parent / "model.onnx.data").exists()  # inline now, nothing stale
    engine = speculant.load(result.root)
    assert engine.generate(PROMPTS[0], 16, proposer="chained", k=4).token_ids == \
        engine.generate(PROMPTS[0], 16).token_ids


def test_refusals(pair_root, decoder_root, tmp_path):
    with pytest.raises(ExportError, match="unknown drafter quantization") as bad:
        convert(pair_root, tmp_path / "a", quantize_drafter="int8")
    assert bad.value.problems[0].path == "quantize_drafter" and not (tmp_path / "a").exists()
    with pytest.raises(ExportError, match="no chained drafter") as none:
        convert(decoder_root, tmp_path / "b", quantize_drafter="int4")
    assert none.value.problems[0].remedy and not (tmp_path / "b").exists()


def test_an_int4_drafter_cannot_be_read_back_but_its_target_exports(quantized, tmp_path):
    with pytest.raises(ExportError, match="int4") as error:
        convert(quantized, tmp_path / "again", "float32")
    assert "--quantize-drafter" in error.value.problems[0].remedy
    out = export_hf(quantized, tmp_path / "hf")  # the anchors' checkpoint: the target alone
    assert (out / "model.safetensors").is_file() and not (out / "drafter.safetensors").exists()
