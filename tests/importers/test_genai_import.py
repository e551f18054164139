"""onnxruntime-genai folders: the graph is copied and its IO mapped onto the metadata.

Hermetic: a folder in genai's layout around an exported decoder graph (its IO carries genai's
default names, with position_ids). Where onnxruntime-genai (and torch, for its builder) is
installed: the builder's own graph (GroupQueryAttention, no position_ids) gives the tokens of
onnxruntime-genai's Generator and of the Hugging Face import of the same checkpoint, and
prompt lookup equals greedy on it (a multi-token pass over a past).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_models import CONFIG, EOS_ID

import speculant
from speculant_tools.export import LlamaConfig, target_shapes
from speculant_tools.importers import ImporterError, import_model

PROMPTS = ([7, 3, 41, 12, 25], [7, 3, 41, 7, 3, 41, 7, 3])
MAX_NEW = 10


def decode(root, prompt, **options) -> list[int]:
    return speculant.load(root).generate(list(prompt), MAX_NEW, stop_on_eos=False,
                                         **options).token_ids


def genai_config(config: LlamaConfig, **decoder_inputs) -> dict:
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
              "past_value_names": "past_key_values.%d.value", **decoder_inputs}
    return {"model": {
        "bos_token_id": 1, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID, "type": "llama",
        "context_length": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "decoder": {"filename": "model.onnx", "head_size": config.head_dim,
                    "hidden_size": config.hidden_size,
                    "num_attention_heads": config.num_attention_heads,
                    "num_hidden_layers": config.num_hidden_layers,
                    "num_key_value_heads": config.num_key_value_heads, "inputs": inputs,
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}}}}


@pytest.fixture
def genai_folder(imported_appended, tmp_path) -> Path:
    folder = tmp_path / "genai"
    folder.mkdir()
    shutil.copyfile(imported_appended / "decoder" / "model.onnx", folder / "model.onnx")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(imported_appended / name, folder / name)
    (folder / "genai_config.json").write_text(json.dumps(genai_config(CONFIG)))
    return folder


def test_a_genai_folder_decodes_as_its_graph(genai_folder, imported, tmp_path):
    package = import_model(genai_folder, tmp_path / "package")
    for prompt in PROMPTS:
        assert decode(package, prompt) == decode(imported, prompt)
        assert decode(package, prompt, proposer="prompt_lookup", k=4) == decode(package, prompt)
    assert json.loads((package / "tokenizer_config.json").read_text())["eos_token"] == \
        "<|im_end|>"


@pytest.mark.parametrize("edit, field", [
    ({"inputs_embeds": "inputs_embeds"}, "model.decoder.inputs.inputs_embeds"),
    ({"past_key_names": "past.%d.k"}, "model.decoder.inputs.past_key_names"),
])
def test_io_without_a_role_or_renamed_is_refused_by_name(genai_folder, tmp_path, edit, field):
    (genai_folder / "genai_config.json").write_text(json.dumps(genai_config(CONFIG, **edit)))
    with pytest.raises(ImporterError) as caught:
        import_model(genai_folder, tmp_path / "out")
    assert caught.value.paths == [field]


def test_the_graph_is_not_converted(genai_folder, tmp_path):
    with pytest.raises(ImporterError, match="--dtype float32"):
        import_model(genai_folder, tmp_path / "out", dtype="float16")


# -- onnxruntime-genai's own builder and generator -----------------------------------------
GENAI_CONFIG = LlamaConfig(vocab_size=48, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                           max_position_embeddings=64, head_dim=16)  # GQA: head_size % 16


def test_the_builders_graph_gives_genais_tokens(imported, tmp_path):
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    pytest.importorskip("torch", reason="onnxruntime-genai's builder needs torch")
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)
    weights = {name: (rng.standard_normal(shape) / np.sqrt(shape[-1]) * (3 if len(shape) > 1
                                                                          else 0.1)
                      + (len(shape) == 1)).astype(np.float32)
               for name, shape in target_shapes(GENAI_CONFIG).items()}
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    save_file(weights, str(checkpoint / "model.safetensors"))
    (checkpoint / "config.json").write_text(json.dumps(
        {**GENAI_CONFIG.to_hf(eos_token_id=EOS_ID), "bos_token_id": 1}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(imported / name, checkpoint / name)
    built = tmp_path / "built"
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
                    str(checkpoint), "-o", str(built), "-p", "fp32", "-e", "cpu", "-c",
                    str(tmp_path / "cache")], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    package = import_model(built, tmp_path / "from-genai")
    reference = import_model(checkpoint, tmp_path / "from-hf")
    model = og.Model(str(built))
    lengths = []
    for prompt in PROMPTS:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + MAX_NEW, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        expected = []
        while not generator.is_done():
            generator.generate_next_token()
            expected.append(int(generator.get_next_tokens()[0]))
        lengths.append(len(expected))
        ours = decode(package, prompt)
        assert ours[:len(expected)] == expected  # genai stops at EOS, speculant here does not
        assert ours == decode(reference, prompt)
        assert decode(package, prompt, proposer="prompt_lookup", k=4) == ours
    assert max(lengths) == MAX_NEW  # at least one decode ran its full length in genai
