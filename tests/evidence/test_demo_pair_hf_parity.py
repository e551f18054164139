"""The committed demo target decodes exactly like Hugging Face `transformers` on the same
weights: `speculant export-hf` writes the checkpoint back out of the package, and
`LlamaForCausalLM.generate(do_sample=False)` must give the same greedy tokens as speculant.

Needs torch, transformers and safetensors (not project dependencies): skips with a reason
without them. Run it with them installed, e.g. in a throwaway venv (see recipes/demo_pair).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional: HF parity)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("safetensors", reason="safetensors is not installed")

import speculant  # noqa: E402
from speculant_tools.export import export_hf  # noqa: E402

DEMO = Path(str(resources.files("speculant") / "demo"))
NUM_PROMPTS, NEW_TOKENS = 8, 48


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    if not (DEMO / "val_prompts.json").is_file():
        pytest.skip("the bundled demo package has no val_prompts.json")
    out = export_hf(DEMO, tmp_path_factory.mktemp("hf"))
    model = transformers.LlamaForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
    return model.eval()


def test_greedy_tokens_equal_transformers(hf_model):
    engine = speculant.load(DEMO)
    prompts = json.loads((DEMO / "val_prompts.json").read_text())["prompts"][:NUM_PROMPTS]
    for item in prompts:
        prompt = item["prompt"]
        ours = engine.generate(prompt, NEW_TOKENS, stop_on_eos=False).token_ids
        with torch.no_grad():
            output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                       min_new_tokens=NEW_TOKENS, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)
        theirs = output[0, len(prompt):].tolist()
        assert ours == theirs
