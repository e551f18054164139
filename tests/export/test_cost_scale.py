"""Cost-scaled targets (speculant_tools.export.cost_scale) on the tiny export pair: the scaled
target's logits and tokens equal the trained target's, the parameter count follows its
formula, the added units and layers contribute exactly zero, the drafter still borrows the
trained last layer, speculation equals greedy with unchanged traces; external data; CLI."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import yaml
from export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS
from typer.testing import CliRunner

import speculant
from speculant.cli import full_app
from speculant_tools.export import ExportError, LlamaConfig, convert, read_weights, target_shapes
from speculant_tools.export.cost_scale import (
    check_identical,
    layer_order,
    parameter_count,
    parse_params,
    plan,
    prefill_logits,
    scale_target,
)
from speculant_tools.export.graphs import CONFIG_KEY

app = full_app()


LAYERS, WIDTH = 5, 96  # trained: 2 layers, intermediate 40
PROMPTS = ([7, 3, 41, 12, 25], [20, 21], list(range(2, 34)))
NEW = 20
O_DOWN = ("self_attn.o_proj.weight", "mlp.down_proj.weight")

DEMO = LlamaConfig(vocab_size=4096, hidden_size=192, num_hidden_layers=5,
                   num_attention_heads=6, num_key_value_heads=2, intermediate_size=512,
                   max_position_embeddings=512, head_dim=32)


@pytest.fixture(scope="module")
def scaled(pair_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("scaled") / "pair"
    result = scale_target(pair_root, out, "1K", num_layers=LAYERS, intermediate_size=WIDTH,
                          seed=5, check_tokens=NEW)
    return result


@pytest.fixture(scope="module")
def scaled_engine(scaled):
    return speculant.load(scaled.root, threads=1)


@pytest.fixture(scope="module")
def trained_engine(pair_root):
    return speculant.load(pair_root, threads=1)


# -- sizes --------------------------------------------------------------------------------
def test_parameter_count_formula():
    for config in (CONFIG, DEMO, dataclasses.replace(DEMO, num_hidden_layers=16,
                                                     intermediate_size=108288)):
        assert parameter_count(config) == sum(np.prod(s) for s in target_shapes(config).values())


def test_plan_reaches_100m_and_1b_on_the_demo_sizes():
    small, large = plan(DEMO, "100M"), plan(DEMO, "1B")
    assert (small.num_hidden_layers, small.intermediate_size) == (12, 14080)
    assert (large.num_hidden_layers, large.intermediate_size) == (16, 108288)
    assert parameter_count(small) == 99_291_840
    assert parameter_count(large) == 1_000_347_840
    for scaled in (small, large):  # only depth and MLP width change
        assert (scaled.hidden_size, scaled.num_attention_heads, scaled.head_dim,
                scaled.num_key_value_heads, scaled.vocab_size,
                scaled.max_position_embeddings) == (192, 6, 32, 2, 4096, 512)
        assert scaled.drafter_intermediate_size == 512
    assert parse_params("1.5B") == 1_500_000_000 and parse_params("250m") == 250_000_000


def test_written_parameters_match_the_count(scaled):
    model = onnx.load(str(scaled.root / "target" / "model.onnx"))
    counted = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                  if t.name.startswith("model."))
    assert counted == scaled.parameters == parameter_count(scaled.config)
    assert scaled.config.num_hidden_layers == LAYERS
    assert scaled.config.intermediate_size == WIDTH


# -- the function is the trained one ------------------------------------------------------
def test_logits_are_identical(pair_root, scaled):
    for prompt in PROMPTS:
        reference = prefill_logits(pair_root, prompt)
        logits = prefill_logits(scaled.root, prompt)
        assert np.abs(reference - logits).max() <= 1e-5 * np.abs(reference).max()
        assert (reference.argmax(-1) == logits.argmax(-1)).all()
    check = scaled.check
    assert check["greedy_equal"] and check["chained_trace_equal"]
    assert check["max_abs_logit_diff"] <= 1e-5 * check["max_abs_logit"]


def test_greedy_tokens_are_identical(trained_engine, scaled_engine):
    for prompt in PROMPTS:
        assert scaled_engine.generate(prompt, NEW, stop_on_eos=False).token_ids == \
            trained_engine.generate(prompt, NEW, stop_on_eos=False).token_ids


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_speculative_equals_greedy_with_the_trained_trace(trained_engine, scaled_engine, k):
    """Same target tokens, same drafter inputs: the chained proposer accepts exactly what
    it accepted against the trained target."""
    for prompt in PROMPTS:
        greedy = scaled_engine.generate(prompt, NEW, stop_on_eos=False).token_ids
        run = scaled_engine.generate(prompt, NEW, stop_on_eos=False, speculative=True, k=k)
        trained = trained_engine.generate(prompt, NEW, stop_on_eos=False, speculative=True,
                                          k=k)
        assert run.token_ids == greedy
        assert run.stats.trace == trained.stats.trace


def test_the_draft_model_keeps_its_acceptance(pair_root, scaled, decoder_root):
    trained = speculant.load(pair_root, threads=1, draft=decoder_root)
    engine = speculant.load(scaled.root, threads=1, draft=decoder_root)
    for prompt in PROMPTS:
        run = engine.generate(prompt, NEW, stop_on_eos=False, proposer="draft", k=4)
        before = trained.generate(prompt, NEW, stop_on_eos=False, proposer="draft", k=4)
        assert run.token_ids == before.token_ids
        assert run.stats.trace == before.stats.trace


# -- the structure that makes it so -------------------------------------------------------
def test_added_units_and_layers_contribute_exactly_zero(scaled):
    config, target, drafter = read_weights(scaled.root)
    order = layer_order(CONFIG.num_hidden_layers, LAYERS)
    assert order == [0, None, None, None, 1] == scaled.layer_order
    f = CONFIG.intermediate_size
    for j, source in enumerate(order):
        layer = {kind: target[f"model.layers.{j}.{kind}"] for kind in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight", "input_layernorm.weight")}
        if source is None:
            for kind in O_DOWN:
                assert not layer[kind].any(), (j, kind)  # exactly zero
            for kind, array in layer.items():
                if kind not in O_DOWN:  # random, like real weights (not zeros, not constant)
                    assert np.all(array != 0) and array.std() > 0, (j, kind)
            continue
        trained = {kind: TARGET_WEIGHTS[f"model.layers.{source}.{kind}"] for kind in layer}
        for kind in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            assert np.array_equal(layer[kind][:f], trained[kind])
            assert np.all(layer[kind][f:] != 0) and layer[kind][f:].std() > 0
        assert np.array_equal(layer["mlp.down_proj.weight"][:, :f],
                              trained["mlp.down_proj.weight"])
        assert not layer["mlp.down_proj.weight"][:, f:].any()
        for kind in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "input_layernorm.weight"):
            assert np.array_equal(layer[kind], trained[kind])
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        assert np.array_equal(target[name], TARGET_WEIGHTS[name])
    assert drafter.keys() == DRAFTER_WEIGHTS.keys()
    for name, array in drafter.items():  # the trained drafter, its own width
        assert np.array_equal(array, DRAFTER_WEIGHTS[name])
    assert config.drafter_intermediate_size == CONFIG.intermediate_size


def test_the_drafter_borrows_the_trained_last_layer(scaled):
    document = yaml.safe_load((scaled.root / "inference_metadata.yaml").read_text())
    last = LAYERS - 1
    assert scaled.layer_order[last] == CONFIG.num_hidden_layers - 1
    group = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"]["attention"]
    borrowed = group["ports"]["assistant"]
    assert {alias["layer"] for alias in borrowed.values()} == {last}
    assert set(borrowed) == {f"kv.{last}.key", f"kv.{last}.value"}
    cells = {f"kv.{i}.{part}" for i in range(LAYERS) for part in ("key", "value")}
    assert set(document["speculative"]["rollback_state"]) == cells
    assert set(document["pipeline"]["workflow"]["state"]) == cells
    assert set(group["ports"]["target"]) == cells


def test_config_records_the_drafter_width_only_when_it_differs(pair_root, scaled):
    def stored(path):
        props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        return LlamaConfig.from_json(props[CONFIG_KEY]), props[CONFIG_KEY]

    config, text = stored(pair_root / "target" / "model.onnx")
    assert "drafter_intermediate_size" not in text  # trained packages are written as before
    assert config.drafter_intermediate_size == config.intermediate_size
    config, text = stored(scaled.root / "assistant" / "model.onnx")
    assert (config.intermediate_size, config.drafter_intermediate_size) == (WIDTH, 40)


# -- external data, float16, command line, refusals ---------------------------------------
def test_external_data_forced_at_small_scale(pair_root, scaled, tmp_path):
    out = scale_target(pair_root, tmp_path / "ext", "1K", num_layers=LAYERS,
                       intermediate_size=WIDTH, seed=5, external_data=True,
                       check_tokens=0).root
    for component in ("target", "assistant"):
        graph = out / component / "model.onnx"
        assert (out / component / "model.onnx.data").is_file()
        assert graph.stat().st_size < 100_000  # the weights are beside it
        model = onnx.load(str(graph), load_external_data=False)
        assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    _, inline, _ = read_weights(scaled.root)
    _, external, _ = read_weights(out)
    assert all(np.array_equal(inline[name], external[name]) for name in inline)
    engine = speculant.load(out, threads=1)
    expected = speculant.load(scaled.root, threads=1).generate(PROMPTS[0], NEW,
                                                               stop_on_eos=False).token_ids
    assert engine.generate(PROMPTS[0], NEW, stop_on_eos=False).token_ids == expected
    run = engine.generate(PROMPTS[0], NEW, stop_on_eos=False, speculative=True, k=4)
    assert run.token_ids == expected
    half = convert(out, tmp_path / "ext-fp16", "float16", external_data=True)
    assert (half / "target" / "model.onnx.data").is_file()
    engine = speculant.load(half, threads=1)
    greedy = engine.generate(PROMPTS[0], NEW, stop_on_eos=False).token_ids
    assert engine.generate(PROMPTS[0], NEW, stop_on_eos=False, speculative=True,
                           k=4).token_ids == greedy


def test_float16_by_convert(scaled, tmp_path):
    half = convert(scaled.root, tmp_path / "fp16", "float16")
    config, target, drafter = read_weights(half)
    assert config == scaled.config
    assert target["model.layers.1.mlp.down_proj.weight"].dtype == np.float16
    assert not target["model.layers.1.mlp.down_proj.weight"].any()
    engine = speculant.load(half, threads=1)
    for k in (1, 4, 8):
        greedy = engine.generate(PROMPTS[0], NEW, stop_on_eos=False).token_ids
        assert engine.generate(PROMPTS[0], NEW, stop_on_eos=False, speculative=True,
                               k=k).token_ids == greedy


def test_cli(pair_root, tmp_path):
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["scale-target", str(pair_root), str(out), "--params",
                                      "20K", "--layers", "3", "--check-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "target parameters" in result.output and "trace equal: True" in result.output
    config, _, _ = read_weights(out)
    assert config.num_hidden_layers == 3 and (out / "cost_scale.json").is_file()
    check = check_identical(pair_root, out, 8)
    assert check["greedy_equal"] and check["chained_equals_greedy"]
    refused = CliRunner().invoke(app, ["scale-target", str(pair_root), str(tmp_path / "x"),
                                       "--layers", "1"])
    assert refused.exit_code == 2 and "keeps every trained layer" in refused.output


def test_refusals(pair_root, decoder_root, tmp_path):
    with pytest.raises(ExportError, match="narrower"):
        scale_target(pair_root, tmp_path / "a", "1K", intermediate_size=8, check_tokens=0)
    with pytest.raises(ExportError, match="chained pair"):
        scale_target(decoder_root, tmp_path / "b", "1K", check_tokens=0)
    with pytest.raises(ExportError, match="itself"):
        scale_target(pair_root, pair_root, "1K", check_tokens=0)
    with pytest.raises(ExportError, match="params"):
        parse_params("lots")
