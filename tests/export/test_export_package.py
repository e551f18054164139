"""Exported packages in speculant: they load, speculative decoding equals greedy for every k
(float32 and after ``convert`` to float16), greedy equals the numpy reference, the metadata
validates against the standard's schema, the weights round-trip exactly, and bad input is an
ExportError that names it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from export_models import (
    CONFIG,
    DRAFT_CONFIG,
    DRAFT_WEIGHTS,
    DRAFTER_WEIGHTS,
    EOS_ID,
    TARGET_WEIGHTS,
)
from export_reference import greedy

import speculant
from speculant_tools.export import (
    ExportError,
    LlamaConfig,
    convert,
    export_hf,
    read_weights,
    write_pair_package,
)

WIDTHS = (1, 2, 4, 8)
PROMPTS = ([7, 3, 41, 12, 25], [20, 21])
MAX_NEW = 20
SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "conformance" / \
    "inference_metadata.schema.json"
NP = {"float32": np.float32, "float16": np.float16}


@pytest.fixture(scope="module")
def engines(pair_roots):
    return {dtype: speculant.load(root) for dtype, root in pair_roots.items()}


def decode(engine, prompt, **options) -> list[int]:
    return engine.generate(list(prompt), MAX_NEW, stop_on_eos=False, **options).token_ids


# -- (2) the packages run in speculant -----------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_greedy_equals_the_reference(engines, dtype):
    """The runtime's cached greedy decode equals a full-recompute numpy greedy, on a path
    whose top-2 logit margins are far above the dtype's error (no near-ties)."""
    for prompt in PROMPTS:
        expected, margin = greedy(CONFIG, TARGET_WEIGHTS, prompt, MAX_NEW)
        assert margin > 0.1, f"near-tie on the reference path (margin {margin:.3g})"
        assert decode(engines[dtype], prompt) == expected


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("k", WIDTHS)
def test_speculative_equals_greedy(engines, dtype, k):
    engine = engines[dtype]
    num_drafts = num_rollbacks = 0
    for prompt in PROMPTS:
        plain = decode(engine, prompt)
        run = engine.generate(list(prompt), MAX_NEW, stop_on_eos=False, speculative=True, k=k)
        assert run.token_ids == plain
        num_drafts += run.stats.drafts_proposed
        num_rollbacks += run.stats.rollbacks
    assert num_drafts > 0 and num_rollbacks > 0


def test_k_above_max_proposal_width_is_refused(engines):
    with pytest.raises(speculant.RequestError, match="max_proposal_width"):
        engines["float32"].generate([3, 4], 4, speculative=True, k=9)


def test_decoder_package_greedy_equals_the_reference(decoder_root):
    engine = speculant.load(decoder_root)
    expected, margin = greedy(DRAFT_CONFIG, DRAFT_WEIGHTS, PROMPTS[0], MAX_NEW)
    assert margin > 1e-3
    assert decode(engine, PROMPTS[0]) == expected


def test_pair_metadata_has_the_chained_shape(pair_root, pair_root_fp16):
    doc = yaml.safe_load((pair_root / "inference_metadata.yaml").read_text())
    last = CONFIG.num_hidden_layers - 1
    chain = doc["speculative"]["proposal_execution"]
    assert chain["token_embedding"] == {"component": "target",
                                        "table": "model.embed_tokens.weight",
                                        "scale": math.sqrt(CONFIG.hidden_size)}
    assert chain["folded_carry_seed"] == {"component": "target", "output": "hidden_states"}
    assert doc["speculative"]["max_proposal_width"] == 8
    assert doc["model"]["max_sequence_length"] == CONFIG.max_position_embeddings
    assert doc["package"]["tokenizer"]["special_tokens"]["eos"] == {"id": EOS_ID,
                                                                   "content": "</s>"}
    wf = doc["pipeline"]["workflow"]
    (name, group), = wf["serving"]["state_service"]["groups"].items()
    assert name == "attention" and group["sequence_axis"] == 2
    assert group["capabilities"]["rollback_positions"] == 8
    assert set(group["ports"]["target"]) == set(wf["state"]) == \
        set(doc["speculative"]["rollback_state"])
    assert len(wf["state"]) == 2 * CONFIG.num_hidden_layers
    assert group["ports"]["assistant"] == {
        f"kv.{last}.key": {"input": "shared_kv.key", "access": "read_only", "role": "key",
                           "layer": last},
        f"kv.{last}.value": {"input": "shared_kv.value", "access": "read_only",
                             "role": "value", "layer": last}}
    fused = wf["components"]["assistant"]["ports"]["inputs"]["inputs_embeds"]
    assert fused["shape"] == ["batch", "sequence", 2 * CONFIG.hidden_size]
    doc16 = yaml.safe_load((pair_root_fp16 / "inference_metadata.yaml").read_text())
    assert doc16["pipeline"]["workflow"]["inputs"]["request.inputs_embeds"]["contract"][
        "dtype"] == fused["dtype"].replace("32", "16") == "float16"


@pytest.mark.parametrize("which", ["pair", "pair_fp16", "decoder"])
def test_metadata_validates_against_the_published_schema(pair_root, pair_root_fp16,
                                                        decoder_root, which):
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip(f"no schema at {SCHEMA} (a clone without ../shared)")
    root = {"pair": pair_root, "pair_fp16": pair_root_fp16, "decoder": decoder_root}[which]
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    document = yaml.safe_load((root / "inference_metadata.yaml").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []


def test_graphs_are_single_files_with_the_hf_initializer_names(pair_root):
    target = onnx.load(str(pair_root / "target" / "model.onnx"))
    names = {t.name for t in target.graph.initializer}
    assert set(TARGET_WEIGHTS) <= names
    assert not list(pair_root.rglob("*.data"))
    assistant = onnx.load(str(pair_root / "assistant" / "model.onnx"))
    names = {t.name for t in assistant.graph.initializer}
    assert set(DRAFTER_WEIGHTS) | {"model.embed_tokens.weight"} <= names
    assert not any(name.startswith("model.layers.") for name in names)


# -- (3) read-back, convert, write-back ---------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_read_weights_round_trips_exactly(pair_roots, dtype):
    config, target, drafter = read_weights(pair_roots[dtype])
    assert config == CONFIG
    for written, read in ((TARGET_WEIGHTS, target), (DRAFTER_WEIGHTS, drafter)):
        assert list(read) == list(written)
        for name, array in written.items():
            assert read[name].dtype == NP[dtype], name
            np.testing.assert_array_equal(read[name], array.astype(NP[dtype]), err_msg=name)


def test_read_weights_of_a_decoder_package(decoder_root):
    config, weights, drafter = read_weights(decoder_root)
    assert config == DRAFT_CONFIG and drafter is None
    assert all(np.array_equal(weights[n], a) for n, a in DRAFT_WEIGHTS.items())


def test_a_drafter_retrained_at_another_mlp_width_reads_back_beside_the_old_target(
        pair_root, tokenizer_path, tmp_path):
    """The demo's way of adopting a retrained drafter: only ``assistant/model.onnx`` is
    replaced; its MLP width is its own graph's, not the unchanged target's."""
    import dataclasses
    import shutil

    from export_models import random_weights

    from speculant_tools.export import drafter_shapes

    wide = dataclasses.replace(CONFIG, drafter_intermediate_size=CONFIG.intermediate_size + 24)
    drafter = random_weights(drafter_shapes(wide), seed=5)
    retrained = write_pair_package(tmp_path / "retrained", TARGET_WEIGHTS, wide, drafter,
                                   tokenizer_path)
    root = Path(shutil.copytree(pair_root, tmp_path / "pair"))
    shutil.copy(retrained / "assistant" / "model.onnx", root / "assistant" / "model.onnx")
    config, target, read = read_weights(root)
    assert config == wide
    assert all(np.array_equal(read[n], a) for n, a in drafter.items())
    assert all(np.array_equal(target[n], a) for n, a in TARGET_WEIGHTS.items())
    engine = speculant.load(convert(root, tmp_path / "fp16", "float16"))
    assert decode(engine, PROMPTS[0], speculative=True, k=4) == decode(engine, PROMPTS[0])


def test_convert_back_to_float32_keeps_the_float16_values(pair_root_fp16, tmp_path):
    root = convert(pair_root_fp16, tmp_path / "back", dtype="float32")
    _, target, drafter = read_weights(root)
    _, target16, drafter16 = read_weights(pair_root_fp16)
    for name, array in {**target16, **drafter16}.items():
        np.testing.assert_array_equal({**target, **drafter}[name], array.astype(np.float32))


def test_convert_of_a_decoder_package(decoder_root, tmp_path):
    root = convert(decoder_root, tmp_path / "draft16")
    engine = speculant.load(root)
    assert engine.generate(PROMPTS[0], 4).token_ids


def test_convert_refuses_to_overwrite_its_source(pair_root):
    with pytest.raises(ExportError, match="out_root is the package itself"):
        convert(pair_root, pair_root)


def test_export_hf_writes_a_checkpoint(pair_root, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy", reason="safetensors is not "
                                      "installed (export_hf's clear error is tested below)")
    out = export_hf(pair_root, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == EOS_ID
    assert LlamaConfig.from_hf(config) == CONFIG
    tensors = safetensors.load_file(str(out / "model.safetensors"))
    assert tensors.keys() == TARGET_WEIGHTS.keys()
    assert all(np.array_equal(tensors[n], a) for n, a in TARGET_WEIGHTS.items())
    drafter = safetensors.load_file(str(out / "drafter.safetensors"))
    assert all(np.array_equal(drafter[n], a) for n, a in DRAFTER_WEIGHTS.items())
    assert (out / "tokenizer.json").is_file()


def test_export_hf_without_safetensors_is_a_clear_error(pair_root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)  # import fails
    with pytest.raises(ExportError, match="needs the safetensors package"):
        export_hf(pair_root, tmp_path / "hf")


# -- bad input -------------------------------------------------------------------------------
def write(tmp_path, tokenizer_path, target=None, drafter=None, config=CONFIG, **options):
    return write_pair_package(tmp_path / "pair", TARGET_WEIGHTS if target is None else target,
                              config, DRAFTER_WEIGHTS if drafter is None else drafter,
                              tokenizer_path, **options)


def test_missing_unexpected_and_misshapen_weights_are_listed(tmp_path, tokenizer_path):
    target = dict(TARGET_WEIGHTS)
    del target["model.norm.weight"]
    target["model.layers.0.self_attn.q_proj.bias"] = np.zeros(16, np.float32)
    target["model.layers.1.mlp.up_proj.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ExportError) as error:
        write(tmp_path, tokenizer_path, target=target)
    message = str(error.value)
    assert "missing model.norm.weight" in message
    assert "unexpected model.layers.0.self_attn.q_proj.bias" in message
    assert "model.layers.1.mlp.up_proj.weight (3, 3) (expected (40, 16))" in message


def test_a_tied_lm_head_is_accepted_and_an_untied_one_refused(tmp_path, tokenizer_path):
    tied = {**TARGET_WEIGHTS, "lm_head.weight": TARGET_WEIGHTS["model.embed_tokens.weight"]}
    write(tmp_path, tokenizer_path, target=tied)
    untied = {**tied, "lm_head.weight": tied["lm_head.weight"] + 1}
    with pytest.raises(ExportError, match="lm_head.weight differs"):
        write(tmp_path, tokenizer_path, target=untied)


def test_drafter_weights_need_the_drafter_names(tmp_path, tokenizer_path):
    drafter = dict(DRAFTER_WEIGHTS)
    drafter["drafter.layer.self_attn.k_proj.weight"] = np.zeros((8, 16), np.float32)
    with pytest.raises(ExportError, match="unexpected drafter.layer.self_attn.k_proj"):
        write(tmp_path, tokenizer_path, drafter=drafter)


def test_float16_overflow_is_refused(tmp_path, tokenizer_path):
    target = {**TARGET_WEIGHTS, "model.norm.weight": np.full(16, 1e6, np.float32)}
    with pytest.raises(ExportError, match="non-finite values in float16: model.norm.weight"):
        write(tmp_path, tokenizer_path, target=target, dtype="float16")


@pytest.mark.parametrize("change, key", [  # what no family of importers/families.py computes
    ({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_hf_configs_outside_the_architecture_are_refused(change, key):
    with pytest.raises(ExportError, match=f"config.{key}"):
        LlamaConfig.from_hf({**CONFIG.to_hf(), **change})


def test_hf_config_mappings_round_trip():
    assert LlamaConfig.from_hf(CONFIG.to_hf()) == CONFIG
    legacy = {k: v for k, v in CONFIG.to_hf().items() if k not in ("rope_theta", "head_dim")}
    legacy["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0}
    assert LlamaConfig.from_hf(legacy).rope_theta == 500.0
    assert LlamaConfig.from_hf(legacy).head_dim == CONFIG.hidden_size // 4


def test_rollback_below_the_width_and_bad_dtype_are_refused(tmp_path, tokenizer_path):
    with pytest.raises(ExportError, match="rollback_positions"):
        write(tmp_path, tokenizer_path, max_proposal_width=8, rollback_positions=4)
    with pytest.raises(ExportError, match="dtype"):
        write(tmp_path, tokenizer_path, dtype="bfloat16")


def test_an_eos_the_tokenizer_lacks_is_refused(tmp_path, tokenizer_path):
    with pytest.raises(ExportError, match="eos_id is not a token"):
        write(tmp_path, tokenizer_path, eos_id=999)


def test_a_drafter_table_that_differs_from_the_target_is_refused(pair_root, tmp_path):
    import shutil

    root = Path(shutil.copytree(pair_root, tmp_path / "pair"))
    path = root / "assistant" / "model.onnx"
    model = onnx.load(str(path))
    table = next(t for t in model.graph.initializer if t.name == "model.embed_tokens.weight")
    array = onnx.numpy_helper.to_array(table) + 1
    table.CopyFrom(onnx.numpy_helper.from_array(array, table.name))
    onnx.save(model, str(path))
    with pytest.raises(ExportError, match="tied LM head"):
        read_weights(root)
