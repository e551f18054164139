"""GGUF import: exact dequantization, the rotary permutation undone, greedy tokens equal the
numpy reference of the stored weights and the Hugging Face folder import of the same weights,
the tokenizer and chat template carried over, unsupported fields refused by name."""

from __future__ import annotations

import json

import gguf
import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_models import BOS_ID, CHAT_TEMPLATE, CONFIG, EOS_ID, write_gguf
from onnx import numpy_helper

import speculant
from export.export_reference import greedy, target_forward
from speculant_tools.importers import ImporterError, import_model, read_checkpoint
from speculant_tools.importers.gguf_file import _hf_name, permute_rows, unpermute_rows

PROMPTS = ([7, 3, 41, 12, 25], [20, 21, 5])
MAX_NEW = 12


def decode(engine, prompt, **options) -> list[int]:
    return engine.generate(list(prompt), MAX_NEW, stop_on_eos=False, **options).token_ids


# -- the weights --------------------------------------------------------------------------
def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    return raw.reshape(-1, block_bytes)


def _scale(blocks: np.ndarray, start: int = 0) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def decode_q8_0(raw: np.ndarray) -> np.ndarray:
    """ggml's block_q8_0: a float16 scale d, then 32 int8 q; x = d * q."""
    blocks = _blocks(raw, 34)
    return (_scale(blocks) * blocks[:, 2:].copy().view(np.int8)).reshape(-1)


def _nibbles(blocks: np.ndarray) -> np.ndarray:
    """The 32 4-bit values of a block: the low nibbles are 0..15, the high ones 16..31."""
    return np.concatenate([blocks & 0x0F, blocks >> 4], axis=1).astype(np.float32)


def decode_q4_0(raw: np.ndarray) -> np.ndarray:
    """block_q4_0: float16 d, 16 bytes of nibbles; x = d * (q - 8)."""
    blocks = _blocks(raw, 18)
    return (_scale(blocks) * (_nibbles(blocks[:, 2:]) - 8)).reshape(-1)


def decode_q4_1(raw: np.ndarray) -> np.ndarray:
    """block_q4_1: float16 d and m, 16 bytes of nibbles; x = d * q + m."""
    blocks = _blocks(raw, 20)
    return (_scale(blocks) * _nibbles(blocks[:, 4:]) + _scale(blocks, 2)).reshape(-1)


DECODERS = {Q.Q8_0: decode_q8_0, Q.Q4_0: decode_q4_0, Q.Q4_1: decode_q4_1}


def graph_weights(root) -> dict[str, np.ndarray]:
    """The HF weights the decoder graph computes with: float initializers by name, and each
    MatMulNBits' blocks decoded here (two 4-bit values per byte, low nibble first; no zero
    point: w = (q - 8) * scale, one scale per block_size values)."""
    model = onnx.load(str(root / "decoder" / "model.onnx"))
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        assert (attrs["bits"], attrs["accuracy_level"], len(node.input)) == (4, 1, 3)
        packed, scales = tensors[node.input[1]], tensors[node.input[2]]  # [N, blocks, b/2]
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(attrs["N"], -1)
        w = (q.astype(np.float32) - 8) * np.repeat(scales.reshape(attrs["N"], -1),
                                                   attrs["block_size"], axis=1)
        tensors[node.input[1].removesuffix(".nbits").removesuffix(".T_Q4")] = \
            w[:, :attrs["K"]]
    return tensors


def test_quantized_tensors_dequantize_exactly(gguf_path, imported):
    """Each Q8_0 / Q4_0 / Q4_1 / F16 / F32 tensor as ggml's block layout defines it (decoded
    here from the bytes in the file), bit for bit, in the package's graph: the Q4_0 linear
    layers as MatMulNBits (kept quantized), the others as float32 initializers."""
    target = graph_weights(imported)
    kept = {n.input[1].removesuffix(".nbits") for n in onnx.load(
        str(imported / "decoder" / "model.onnx")).graph.node if n.op_type == "MatMulNBits"}
    assert kept == {f"model.layers.{i}.{p}.weight" for i in range(CONFIG.num_hidden_layers)
                    for p in ("self_attn.q_proj", "mlp.up_proj")}  # the Q4_0 ones
    reader = gguf.GGUFReader(gguf_path)
    seen = set()
    for tensor in reader.tensors:
        if "attn_q" in tensor.name or "attn_k" in tensor.name:
            continue  # permuted: checked below
        kind = tensor.tensor_type
        raw = np.asarray(tensor.data)
        if kind in DECODERS:
            expected = DECODERS[kind](raw.view(np.uint8).reshape(-1))
        else:
            expected = raw.astype(np.float32).reshape(-1)
        name = _hf(tensor.name)
        np.testing.assert_array_equal(target[name].reshape(-1), expected, err_msg=tensor.name)
        seen.add(kind.name)
    assert seen == {"Q8_0", "Q4_0", "Q4_1", "F16", "F32"}
    assert read_checkpoint(gguf_path).config == CONFIG


def _hf(name: str) -> str:
    return _hf_name(name)


def test_the_rotary_permutation_is_undone(gguf_path, weights, stored):
    """q and k come back in Hugging Face's layout (the F32-exact rows of the writer's
    llama.cpp permute inverted), and the inverse really inverts."""
    checkpoint = read_checkpoint(gguf_path)
    for i in range(CONFIG.num_hidden_layers):
        for part in ("q_proj", "k_proj"):
            name = f"model.layers.{i}.self_attn.{part}.weight"
            np.testing.assert_array_equal(checkpoint.weights[name], stored[name])
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(permute_rows(q, 4), q)
    np.testing.assert_array_equal(unpermute_rows(permute_rows(q, 4), 4), q)


def test_greedy_equals_the_numpy_reference(imported, stored):
    """The imported package decodes the stored weights' greedy tokens; the same decode of the
    still-permuted weights differs (so this test fails if the permutation is not undone)."""
    engine = speculant.load(imported)
    permuted = dict(stored)
    for i in range(CONFIG.num_hidden_layers):
        q, k = (f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qk")
        permuted[q] = permute_rows(stored[q], CONFIG.num_attention_heads)
        permuted[k] = permute_rows(stored[k], CONFIG.num_key_value_heads)
    for prompt in PROMPTS:
        expected, margin = greedy(CONFIG, stored, prompt, MAX_NEW)
        assert margin > 1e-3
        assert decode(engine, prompt) == expected
        assert greedy(CONFIG, permuted, prompt, MAX_NEW)[0] != expected


@pytest.mark.parametrize("k", [1, 2, 4])
def test_prompt_lookup_equals_greedy(imported, k):
    engine = speculant.load(imported)
    prompt = [7, 3, 41, 7, 3, 41, 7, 3]
    assert decode(engine, prompt, proposer="prompt_lookup", k=k) == decode(engine, prompt)


def test_hf_folder_import_gives_the_same_tokens(imported, stored, tmp_path):
    from safetensors.numpy import save_file

    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(stored, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG.to_hf(eos_token_id=EOS_ID)))
    (folder / "tokenizer.json").write_text((imported / "tokenizer.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        (imported / "tokenizer_config.json").read_text())
    package = import_model(folder, tmp_path / "package")
    for prompt in PROMPTS:
        assert decode(speculant.load(package), prompt) == decode(speculant.load(imported),
                                                                 prompt)
    assert json.loads((package / "tokenizer_config.json").read_text())["chat_template"] == \
        CHAT_TEMPLATE


# -- tokenizer, special tokens, chat template ----------------------------------------------
def test_tokenizer_and_chat_template_come_from_the_gguf(imported):
    config = json.loads((imported / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    engine = speculant.load(imported)
    assert engine.package.plan.eos_ids == (EOS_ID,) or EOS_ID in engine.package.plan.eos_ids
    tokenizer = engine.tokenizer
    ids = tokenizer.encode("<|im_start|>the ab<|im_end|>")
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID  # special tokens are single ids
    assert tokenizer.decode(ids) == "the ab"  # specials skipped, byte-level spaces restored
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>the ab<|im_end|>"


def test_float16_import_runs(gguf_path, tmp_path):
    package = import_model(gguf_path, tmp_path / "fp16", dtype="float16")
    assert len(decode(speculant.load(package), PROMPTS[0])) == MAX_NEW


# -- refused, by name ----------------------------------------------------------------------
@pytest.mark.parametrize("arch, edit, kinds, tokenizer_model, field", [
    ("gptneox", None, None, "gpt2", "general.architecture"),
    ("llama", lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN), None, "gpt2",
     "llama.rope.scaling.type"),
    ("llama", None, {"model.layers.0.mlp.up_proj.weight": Q.Q8_1}, "gpt2",
     "tensors.blk.0.ffn_up.weight.type"),
    ("llama", None, None, "bert", "tokenizer.ggml.model"),
])
def test_unsupported_fields_are_refused_by_name(tmp_path, weights, arch, edit, kinds,
                                                tokenizer_model, field):
    path = write_gguf(tmp_path / "bad.gguf", weights, arch=arch, edit=edit, kinds=kinds,
                      tokenizer_model=tokenizer_model)
    with pytest.raises(ImporterError) as caught:
        import_model(path, tmp_path / "out")
    assert caught.value.paths == [field]
    assert not (tmp_path / "out").exists()


# -- int4 ---------------------------------------------------------------------------------
def int4_weights(root, stored) -> dict[str, np.ndarray]:
    """The HF weights an int4 package computes with: each MatMulNBits' blocks decoded here
    (two 4-bit values per byte, low nibble first; symmetric: w = (q - 8) * scale)."""
    model = onnx.load(str(root / "decoder" / "model.onnx"))
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = dict(stored)
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, 32, 1)
        packed, scales = tensors[node.input[1]], tensors[node.input[2]]  # [N, blocks, 16]
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(attrs["N"], -1)
        w = (q.astype(np.float32) - 8) * np.repeat(scales.reshape(attrs["N"], -1), 32, axis=1)
        name = node.input[1].removesuffix(".T_Q4").removesuffix(".nbits")
        weights["lm_head.weight" if name == "model.embed_tokens.weight" else name] = \
            w[:, :attrs["K"]]
    return weights


def test_int4_greedy_equals_the_reference_and_speculation_stays_exact(gguf_path, stored,
                                                                     tmp_path):
    """Every linear layer and the LM head become MatMulNBits at float32 compute; greedy is
    the numpy reference of those int4 weights, and prompt lookup equals it at every k."""
    root = import_model(gguf_path, tmp_path / "int4", quantize="int4")
    weights = int4_weights(root, stored)
    head = weights.pop("lm_head.weight")
    engine = speculant.load(root)
    model = onnx.load(str(root / "decoder" / "model.onnx"))
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == \
        7 * CONFIG.num_hidden_layers + 1
    assert not any(n.op_type == "MatMul" and "proj" in n.name for n in model.graph.node)
    for prompt in PROMPTS:
        expected, margin = greedy_with_head(weights, head, prompt)
        assert margin > 1e-3
        assert decode(engine, prompt) == expected
    repeat = [7, 3, 41, 7, 3, 41, 7, 3]
    for k in (1, 2, 4):
        assert decode(engine, repeat, proposer="prompt_lookup", k=k) == decode(engine, repeat)


def greedy_with_head(weights, head, prompt):
    """export_reference.greedy with an LM head of its own (the int4 head, not the table)."""
    ids, margin = list(prompt), np.inf
    for _ in range(MAX_NEW):
        hidden = target_forward(CONFIG, weights, ids)[1][-1]
        row = hidden @ head.astype(np.float64).T
        top = np.sort(row)[-2:]
        margin = min(margin, top[1] - top[0])
        ids.append(int(np.argmax(row)))
    return ids[len(prompt):], margin


def test_int4_is_float32_only(gguf_path, tmp_path):
    with pytest.raises(ImporterError, match="--dtype float32 --quantize int4") as caught:
        import_model(gguf_path, tmp_path / "out", dtype="float16", quantize="int4")
    assert caught.value.paths == ["quantize"]


def test_a_file_that_is_not_gguf_and_a_nonempty_output_are_refused(tmp_path, gguf_path):
    (tmp_path / "x.bin").write_bytes(b"not a gguf")
    with pytest.raises(ImporterError, match="GGUF magic"):
        import_model(tmp_path / "x.bin", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ImporterError, match="not empty"):
        import_model(gguf_path, tmp_path / "full")
