"""A pair written with ``draft_vocab_size = N < vocab_size``: the drafter's LM head is the
target table's first N rows (carried under the target's name, the rest not written), its
logits are N wide, the metadata says ``vocabulary: {kind: subset, proposer_vocab_size: N}``,
the weights round-trip and convert keeps the subset, and speculation equals greedy, greedy
and sampled alike in what admission lets through."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS

import speculant
from speculant_tools.export import ExportError, LlamaConfig, convert, read_weights
from speculant_tools.export import write_pair_package as write_pair
from speculant_tools.export.config import EMBEDDING

N = 30  # of the tiny target's 50 ids
SUBSET = dataclasses.replace(CONFIG, draft_vocab_size=N)
PROMPTS = ([7, 3, 41, 12, 25], [20, 21])
MAX_NEW = 20


@pytest.fixture(scope="module")
def subset_roots(tmp_path_factory, tokenizer_path):
    root = write_pair(tmp_path_factory.mktemp("subset") / "pair", TARGET_WEIGHTS, SUBSET,
                      DRAFTER_WEIGHTS, tokenizer_path)
    return {"float32": root, "float16": convert(root, root.parent / "pair-fp16", "float16")}


@pytest.fixture(scope="module")
def identical_root(tmp_path_factory, tokenizer_path):
    return write_pair(tmp_path_factory.mktemp("identical") / "pair", TARGET_WEIGHTS, CONFIG,
                      DRAFTER_WEIGHTS, tokenizer_path)


def test_config_validates_and_stores_draft_vocab_size():
    assert SUBSET.has_subset_vocabulary and not CONFIG.has_subset_vocabulary
    assert CONFIG.draft_vocab_size == CONFIG.vocab_size
    assert "draft_vocab_size" not in CONFIG.to_json()  # the default: packages as they were
    assert LlamaConfig.from_json(SUBSET.to_json()) == SUBSET
    for bad in (0, CONFIG.vocab_size + 1):
        with pytest.raises(ExportError) as caught:
            dataclasses.replace(CONFIG, draft_vocab_size=bad)
        assert caught.value.paths == ["config.draft_vocab_size"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_metadata_and_the_drafter_graph_declare_the_subset(subset_roots, dtype):
    root = subset_roots[dtype]
    document = yaml.safe_load((root / "inference_metadata.yaml").read_text())
    assert document["speculative"]["vocabulary"] == {"kind": "subset",
                                                     "proposer_vocab_size": N}
    assistant = document["pipeline"]["workflow"]["components"]["assistant"]
    assert assistant["ports"]["outputs"]["logits"]["shape"] == ["batch", "sequence", N]
    model = onnx.load(str(root / "assistant" / "model.onnx"))
    head = next(t for t in model.graph.initializer if t.name == EMBEDDING)
    assert list(head.dims) == [N, CONFIG.hidden_size]
    table = TARGET_WEIGHTS[EMBEDDING].astype(dtype)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(head), table[:N])
    config, _, drafter = read_weights(root)
    assert config == SUBSET and list(drafter) == list(DRAFTER_WEIGHTS)


def test_subset_logits_are_the_identical_drafters_first_columns(subset_roots, identical_root):
    """The same inputs through both drafter graphs: the subset's logits are the first N
    columns of the identical drafter's, and the carries are equal."""
    rng = np.random.default_rng(4)
    extent = 6
    kv = (1, CONFIG.num_key_value_heads, extent, CONFIG.head_dim)
    feeds = {"inputs_embeds": rng.standard_normal((1, 3, 2 * CONFIG.hidden_size)),
             "position_ids": np.full((1, 3), extent - 1, np.int64),
             "attention_mask": np.ones((1, extent), np.int64),
             "shared_kv.key": rng.standard_normal(kv), "shared_kv.value": rng.standard_normal(kv)}
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    runs = {}
    for name, root in (("subset", subset_roots["float32"]), ("identical", identical_root)):
        session = ort.InferenceSession(str(root / "assistant" / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        runs[name] = session.run(["logits", "projected_state"], feeds)
    assert runs["subset"][0].shape == (1, 3, N)
    np.testing.assert_allclose(runs["subset"][0], runs["identical"][0][..., :N], rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_array_equal(runs["subset"][1], runs["identical"][1])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("k", (1, 2, 4))
def test_speculation_with_the_subset_drafter_equals_greedy(subset_roots, dtype, k):
    engine = speculant.load(subset_roots[dtype])
    assert engine.package.document.speculative.vocabulary.proposer_vocab_size == N
    num_drafts = 0
    for prompt in PROMPTS:
        plain = engine.generate(list(prompt), MAX_NEW, stop_on_eos=False).token_ids
        run = engine.generate(list(prompt), MAX_NEW, stop_on_eos=False, speculative=True, k=k)
        assert run.token_ids == plain
        num_drafts += run.stats.drafts_proposed
        sampled = engine.generate(list(prompt), MAX_NEW, stop_on_eos=False, speculative=True,
                                  k=k, temperature=1.0, seed=3)
        assert len(sampled.token_ids) == MAX_NEW and sampled.stats.sampled_rows > 0
    assert num_drafts > 0
