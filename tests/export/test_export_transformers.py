"""The exported target against Hugging Face's own LlamaForCausalLM on the same random weights,
loaded from the checkpoint ``export_hf`` writes back: greedy tokens equal
``generate(do_sample=False)``, logits and the (post-RoPE) KV cache match.

Needs torch, transformers and safetensors, which are not project dependencies: the module
skips with a reason without them. To run it, use a throwaway virtual environment:

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers safetensors \
        pytest jsonschema -e '.[cpu]' && /tmp/tv/bin/pytest -q tests/export
"""

from __future__ import annotations

import numpy as np
import pytest
from export_models import CONFIG
from test_export_graphs import empty_past, run_target, session

import speculant
from speculant_tools.export import LlamaConfig, export_hf

torch = pytest.importorskip("torch", reason="torch is not installed (not a project dependency)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("safetensors", reason="safetensors is not installed")

PROMPTS = ([7, 3, 41, 12, 25], [20, 21])
MAX_NEW = 20


@pytest.fixture(scope="module")
def hf_model(pair_root, tmp_path_factory):
    out = export_hf(pair_root, tmp_path_factory.mktemp("hf") / "checkpoint")
    model = transformers.LlamaForCausalLM.from_pretrained(out, attn_implementation="eager",
                                                          dtype=torch.float32)
    model.generation_config.eos_token_id = None  # run to the budget, as the engine below
    model.generation_config.pad_token_id = 0
    return model.eval()


def cache_layer(cache, i: int) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return cache.layers[i].keys.numpy(), cache.layers[i].values.numpy()
    return cache[i][0].numpy(), cache[i][1].numpy()


def test_checkpoint_loads_with_every_weight_and_the_tied_head(hf_model):
    assert hf_model.lm_head.weight.data_ptr() == hf_model.model.embed_tokens.weight.data_ptr()
    assert LlamaConfig.from_hf(hf_model.config) == CONFIG  # a transformers config object


def test_greedy_tokens_equal_transformers_generate(hf_model, pair_root):
    engine = speculant.load(pair_root)
    for prompt in PROMPTS:
        with torch.no_grad():
            generated = hf_model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW,
                                          do_sample=False, min_new_tokens=MAX_NEW)
        expected = generated[0, len(prompt):].tolist()
        assert engine.generate(prompt, MAX_NEW, stop_on_eos=False).token_ids == expected
        assert engine.generate(prompt, MAX_NEW, stop_on_eos=False, speculative=True,
                               k=4).token_ids == expected


def test_logits_and_cache_match_transformers(hf_model, pair_root):
    stream = PROMPTS[0] + [9, 33, 48, 2]
    with torch.no_grad():
        reference = hf_model(torch.tensor([stream]), use_cache=True)
    out = run_target(session(pair_root, "target"), stream, empty_past("float32"), "float32")
    np.testing.assert_allclose(out["logits"], reference.logits.numpy(), rtol=1e-4, atol=1e-4)
    for i in range(CONFIG.num_hidden_layers):
        keys, values = cache_layer(reference.past_key_values, i)
        np.testing.assert_allclose(out[f"present.{i}.key"], keys, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out[f"present.{i}.value"], values, rtol=1e-4, atol=1e-4)
