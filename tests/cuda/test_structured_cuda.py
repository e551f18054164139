"""Constrained decoding with speculation on CUDA: under a JSON schema, chained drafts chosen
on the host step by step (captured step plans) commit the plain constrained output, as on the
CPU (docs/design/structured.md, "Drafts under the grammar").

Run on the GPU machine: ``pytest -m cuda tests/cuda``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_probe import cuda_marks

import speculant
from speculant import GenerationOptions, Grammar

pytestmark = cuda_marks()
pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

DEMO = Path(speculant.__file__).parent / "demo"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "kind": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"}},
          "required": ["name", "kind", "ok"], "additionalProperties": False}


@pytest.mark.parametrize("cache", ["appended", "static"])
def test_chained_constrained_output_on_cuda_is_plain_constrained_output(tmp_path, cache):
    from speculant_tools.export import convert

    root = DEMO if cache == "appended" else convert(DEMO, tmp_path / "static", "float32",
                                                    cache="static")
    engine = speculant.load(root, "cuda", use_tf32=False)
    options = dict(max_new_tokens=60, grammar=Grammar.json_schema(SCHEMA))
    plain = engine.generate("user = ", GenerationOptions(**options))
    for k in (4, "auto"):
        speculative = engine.generate("user = ", GenerationOptions(proposer="chained", k=k,
                                                                   **options))
        assert speculative.token_ids == plain.token_ids
    if plain.finish_reason == "stop":
        assert set(json.loads(plain.text)) == set(SCHEMA["properties"])
