"""Each Llama, Mistral and Qwen case's tiny Hugging Face folder (family_cases) loaded by
transformers' own model class and imported by speculant: the logits of the whole sequence
equal the imported package's, pass by pass (appended and static caches); ``export-hf``
writes back a folder transformers loads as the same family.

Needs torch, transformers and safetensors, which are not project dependencies: the module
skips with a reason without them (a throwaway environment runs it:
``pip install torch transformers safetensors pytest -e '.[cpu]'``).
"""

from __future__ import annotations

import numpy as np
import pytest
from family_cases import CASES, drive, random_weights, write_hf_folder
from test_family_cases import BLOCKS, IDS

from speculant_tools.export import export_hf
from speculant_tools.importers import import_model

torch = pytest.importorskip("torch", reason="torch is not installed (not a project dependency)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("safetensors", reason="safetensors is not installed")


def transformers_logits(folder) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].double().numpy()


@pytest.mark.parametrize("cache", ["appended", "static"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_imported_logits_equal_transformers(case, cache, tmp_path):
    folder = write_hf_folder(tmp_path / "hf", case, random_weights(case.config))
    expected = transformers_logits(folder)
    root = import_model(folder, tmp_path / "package", cache=cache)
    np.testing.assert_allclose(drive(root, BLOCKS), expected, rtol=1e-4, atol=1e-4)
    written = export_hf(root, tmp_path / "written")  # the same family back out
    np.testing.assert_allclose(transformers_logits(written), expected, rtol=1e-5, atol=1e-5)
