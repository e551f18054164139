"""Every tensor type the gguf package dequantizes imports as gguf dequantizes it; the types
MatMulNBits computes with exactly (Q4_0, Q3_K) stay quantized and give the logits of the
same file widened to float32; a type gguf cannot dequantize is refused by tensor, type and
remedy. The model is a one-layer Llama wide enough (256) for the K-quants' 256-value blocks;
types gguf cannot quantize in numpy are written as random valid blocks (gguf_models)."""

from __future__ import annotations

import gguf
import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_models import llama_cpp_permute, random_weights, stored_weights, write_gguf

from speculant_tools.export import LlamaConfig
from speculant_tools.export.cost_scale import prefill_logits
from speculant_tools.importers import ImporterError, import_model, read_checkpoint
from speculant_tools.importers.gguf_file import _hf_name
from speculant_tools.importers.gguf_quant import KEPT, can_dequantize

WIDE = LlamaConfig(vocab_size=48, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=256, max_position_embeddings=64,
                   head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0)
TYPES = [kind for kind in Q if can_dequantize(kind.name)]


def _kinds(kind: Q) -> dict[str, Q]:
    """``kind`` for every matrix (the embedding and the linear layers); norms stay F32."""
    return {name: kind for name, array in random_weights(config=WIDE).items()
            if array.ndim == 2}


@pytest.fixture(scope="module")
def wide_weights():
    return random_weights(config=WIDE)


def file_weights(path) -> dict[str, np.ndarray]:
    """The file's tensors as gguf dequantizes them, in HF names and layout (q and k rows
    through the inverse of llama.cpp's permute)."""
    heads = {"attn_q": WIDE.num_attention_heads, "attn_k": WIDE.num_key_value_heads}
    weights = {}
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type
        shape = tuple(int(n) for n in reversed(tensor.shape))
        raw = np.asarray(tensor.data)
        values = raw if kind == Q.F64 else gguf.quants.dequantize(raw, kind)
        array = np.asarray(values, np.float32).reshape(shape)
        part = tensor.name.split(".")[-2]
        if part in heads:
            order = llama_cpp_permute(np.arange(shape[0]), WIDE.num_attention_heads,
                                      heads[part])
            array = array[np.argsort(order)]
        weights[_hf_name(tensor.name)] = array
    return weights


def test_the_types_gguf_dequantizes_are_the_ones_expected():
    names = {kind.name for kind in TYPES}
    assert {"F32", "F16", "BF16", "F64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
            "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "TQ2_0"} <= names
    assert not {"Q8_K", "Q8_1", "I8", "I32"} & names


@pytest.mark.parametrize("kind", TYPES, ids=lambda kind: kind.name)
def test_every_type_imports_as_gguf_dequantizes_it(tmp_path, wide_weights, kind):
    """The checkpoint's weights are gguf's dequantization of the file's bytes (q and k rows
    back in HF order), bit for bit; the kept types also carry their MatMulNBits form, which
    gives the same weights back."""
    kinds = _kinds(kind)
    path = write_gguf(tmp_path / "m.gguf", wide_weights, kinds=kinds, config=WIDE)
    checkpoint = read_checkpoint(path)
    expected = file_weights(path)
    assert set(expected) == set(checkpoint.weights)
    if kind in (Q.F32, Q.F16, Q.BF16, Q.F64, Q.Q8_0, Q.Q4_0):  # gguf quantized real weights
        for name, array in stored_weights(wide_weights, kinds).items():
            np.testing.assert_array_equal(expected[name], array, err_msg=name)
    for name, array in expected.items():
        np.testing.assert_array_equal(checkpoint.weights[name], array, err_msg=name)
    linear = {name for name in kinds if name.endswith("proj.weight")}
    assert set(checkpoint.kept) == (linear if kind.name in KEPT else set())
    for name, nbits in checkpoint.kept.items():
        np.testing.assert_array_equal(nbits.weight(), expected[name], err_msg=name)


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q3_K], ids=lambda kind: kind.name)
def test_kept_blocks_give_the_widened_logits(tmp_path, wide_weights, kind):
    """A kept type becomes MatMulNBits (4-bit, no zero point, float32 compute) for all seven
    linear layers; its logits equal those of the same file imported with every weight
    widened to float32 (--quantize float) within float32 rounding, with the same argmax."""
    path = write_gguf(tmp_path / "m.gguf", wide_weights, kinds=_kinds(kind), config=WIDE)
    kept = import_model(path, tmp_path / "kept")
    widened = import_model(path, tmp_path / "widened", quantize="float")
    nodes = onnx.load(str(kept / "decoder" / "model.onnx")).graph.node
    assert sum(node.op_type == "MatMulNBits" for node in nodes) == 7
    assert not any(node.op_type == "MatMulNBits" for node in
                   onnx.load(str(widened / "decoder" / "model.onnx")).graph.node)
    prompt = [5, 17, 3, 40, 22, 9]
    kept_logits, widened_logits = prefill_logits(kept, prompt), prefill_logits(widened, prompt)
    scale = np.abs(widened_logits).max()
    np.testing.assert_allclose(kept_logits, widened_logits, rtol=0, atol=1e-5 * scale)
    assert (kept_logits.argmax(-1) == widened_logits.argmax(-1)).all()
    size = sum(p.stat().st_size for p in (kept / "decoder").iterdir())
    assert size < 0.5 * sum(p.stat().st_size for p in (widened / "decoder").iterdir())


def test_a_float16_package_widens_the_kept_types(tmp_path, wide_weights):
    path = write_gguf(tmp_path / "m.gguf", wide_weights, kinds=_kinds(Q.Q4_0), config=WIDE)
    package = import_model(path, tmp_path / "fp16", dtype="float16")
    assert not any(node.op_type == "MatMulNBits" for node in
                   onnx.load(str(package / "decoder" / "model.onnx")).graph.node)


def test_a_type_gguf_cannot_dequantize_is_refused_by_tensor_type_and_remedy(tmp_path,
                                                                           wide_weights):
    name = "model.layers.0.mlp.up_proj.weight"
    path = write_gguf(tmp_path / "m.gguf", wide_weights, kinds={name: Q.Q8_1}, config=WIDE)
    with pytest.raises(ImporterError) as caught:
        import_model(path, tmp_path / "out")
    problem = caught.value.problems[0]
    assert (problem.path, problem.value) == ("tensors.blk.0.ffn_up.weight.type", "Q8_1")
    assert "llama-quantize" in problem.remedy and "Hugging Face folder" in problem.remedy
    assert not (tmp_path / "out").exists()
    assert gguf.GGML_QUANT_SIZES[Q.Q8_1][0] == 32  # a real block format, not a made-up one
