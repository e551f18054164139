"""Gemma 2, Gemma 3 and Phi-3 import from Hugging Face folders and GGUF files: the package's
logits (a prefill, then decode steps through its own caches, appended and static, node by
node and fused) equal a numpy reference of each architecture written in the tests, and
transformers' model where transformers and torch are installed; a field outside the exported
architecture is refused by name, with what to do."""

from __future__ import annotations

import json

import numpy as np
import pytest
from family_models import (
    HF_CONFIGS,
    IDS,
    LONG_IDS,
    PREFILL,
    expected_config,
    gguf_config,
    hf_weights,
    package_logits,
    reference_logits,
    write_gguf_file,
    write_hf_folder,
)

from speculant_tools.importers import ImporterError, import_model, read_checkpoint

FAMILIES = ("gemma2", "gemma3", "phi3")
# RoPE scaling: Gemma 3 4B-27B's, Phi-3 128k's; Phi-4-mini's partial rotary with longrope
SCALED = ("gemma3-linear", "phi3-longrope", "phi3-partial-longrope")
# (source, cache, dtype, graph): every graph form the exporter writes
FORMS = [("hf", "appended", "float32", "explicit"), ("hf", "static", "float32", "explicit"),
         ("hf", "appended", "float32", "fused"), ("hf", "static", "float32", "fused"),
         ("gguf", "static", "float32", "explicit"), ("gguf", "appended", "float32", "fused"),
         ("hf", "static", "float16", "auto")]


def _source(tmp_path, family: str, source: str):
    if source == "hf":
        return write_hf_folder(tmp_path / "hf", family), HF_CONFIGS[family]
    return write_gguf_file(tmp_path / "model.gguf", family), gguf_config(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_window_and_the_variations_matter(family):
    """The reference with its sliding window differs from the same model without it, and
    from a plain Llama reading of the same weights would (so the equalities below are not
    vacuous): the sequence is longer than the window."""
    cfg, weights = HF_CONFIGS[family], hf_weights(family)
    windowed = reference_logits(cfg, weights, IDS)
    assert not np.allclose(windowed, reference_logits(cfg, weights, IDS, sliding=False),
                           atol=1e-3)
    assert len(IDS) > cfg["sliding_window"]


@pytest.mark.parametrize("family", SCALED)
def test_the_rope_scaling_matters(family):
    """Each scaled variant's reference differs from the same model unscaled on the same
    weights, and partial rotary from whole-head rotary (the packages are compared with the
    scaled reference below)."""
    cfg, weights = HF_CONFIGS[family], hf_weights(family)
    unscaled = {**cfg, "rope_scaling": None}
    pairs = [(cfg, unscaled)] + ([(unscaled, {**unscaled, "partial_rotary_factor": 1.0})]
                                 if "partial_rotary_factor" in cfg else [])
    for one, other in pairs:
        a, b = (reference_logits(c, weights, IDS) for c in (one, other))
        assert not np.allclose(a, b, atol=1e-3 * np.abs(b).max())


@pytest.mark.parametrize("source, cache, dtype, graph", FORMS)
@pytest.mark.parametrize("family", FAMILIES + SCALED)
def test_logits_equal_the_numpy_reference(tmp_path, family, source, cache, dtype, graph):
    path, cfg = _source(tmp_path, family, source)
    package = import_model(path, tmp_path / "package", dtype=dtype, cache=cache, graph=graph)
    expected = reference_logits(cfg, hf_weights(family), IDS)
    actual = package_logits(package, IDS, PREFILL)
    scale = np.abs(expected).max()
    tolerance = 2e-2 * scale if dtype == "float16" else 2e-4 * scale
    np.testing.assert_allclose(actual, expected, atol=tolerance, rtol=0)
    assert (actual.argmax(-1) == expected.argmax(-1)).mean() >= (0.8 if dtype == "float16"
                                                                 else 1.0)


@pytest.mark.parametrize("family", FAMILIES + SCALED)
def test_hf_and_gguf_read_the_same_model(tmp_path, family):
    """The two sources of one model give one configuration (up to what a GGUF does not
    carry) and the same weights: Gemma's GGUF norms hold 1 + w, imported with offset 0;
    Phi-3's fused weights split in both."""
    hf = read_checkpoint(write_hf_folder(tmp_path / "hf", family))
    gg = read_checkpoint(write_gguf_file(tmp_path / "m.gguf", family))
    assert hf.config == expected_config(HF_CONFIGS[family])  # the reference's
    offset = hf.config.norm_weight_offset
    assert gg.config.norm_weight_offset == 0.0 and offset == (0.0 if "phi3" in family else 1.0)
    hs, gs = hf.config.rope_scaling, gg.config.rope_scaling  # a GGUF holds float32 factors
    assert (hs is None) == (gs is None)
    if hs is not None:
        assert (gs.rope_type, gs.factor) == (hs.rope_type, hs.factor)
        np.testing.assert_allclose(gs.frequency_factors or 0, hs.frequency_factors or 0,
                                   rtol=1e-7)
        assert (gs.attention_factor or 1.0) == pytest.approx(hs.attention_factor or 1.0,
                                                             rel=1e-7)
        np.testing.assert_allclose(gs.long_factors or 0, hs.long_factors or 0, rtol=1e-7)
        assert gs.long_after == hs.long_after
    assert hf.config.max_position_embeddings == gg.config.max_position_embeddings
    assert sorted(hf.weights) == sorted(gg.weights)
    for name, array in hf.weights.items():
        shift = offset if name.endswith("norm.weight") else 0.0
        np.testing.assert_allclose(gg.weights[name], array + shift, rtol=0, atol=1e-6,
                                   err_msg=name)
    assert hf.config.sliding_layers == gg.config.sliding_layers
    assert hf.config.rope_local_base_freq == gg.config.rope_local_base_freq


def test_phi3_weights_are_split_in_order(tmp_path):
    weights = hf_weights("phi3")
    checkpoint = read_checkpoint(write_hf_folder(tmp_path / "hf", "phi3"))
    qkv = weights["model.layers.1.self_attn.qkv_proj.weight"]
    parts = [checkpoint.weights[f"model.layers.1.self_attn.{c}_proj.weight"] for c in "qkv"]
    assert [p.shape[0] for p in parts] == [32, 16, 16]
    np.testing.assert_array_equal(np.concatenate(parts), qkv)
    gate_up = weights["model.layers.0.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(checkpoint.weights["model.layers.0.mlp.gate_proj.weight"],
                                  gate_up[:64])
    assert not checkpoint.config.tie_word_embeddings


def test_gemma3_layers_and_rope_bases(tmp_path):
    config = read_checkpoint(write_hf_folder(tmp_path / "hf", "gemma3")).config
    assert config.sliding_layers == (True,) * 5 + (False,)
    assert (config.rope_theta, config.rope_local_base_freq) == (100.0, 10000.0)
    assert config.qk_norm and config.post_norms and config.hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_phi3_longrope_reads_both_factor_sets_and_keeps_the_context(tmp_path, source):
    """transformers' longrope: the short factors, the long ones beyond
    original_max_position_embeddings, cos and sin times sqrt(1 + log(max / original) /
    log(original)); the context is the model's own (64)."""
    path, cfg = _source(tmp_path, "phi3-longrope", source)
    config = read_checkpoint(path).config
    scaling, rope = config.rope_scaling, cfg["rope_scaling"]
    assert config.max_position_embeddings == 64
    assert (scaling.long_after, scaling.original_max_position_embeddings) == (16, 16)
    np.testing.assert_allclose(scaling.frequency_factors, rope["short_factor"], rtol=1e-7)
    np.testing.assert_allclose(scaling.long_factors, rope["long_factor"], rtol=1e-7)
    assert scaling.attention_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(16)))


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_longrope_without_long_factors_caps_the_context_and_says_so(tmp_path, source, caplog):
    path, _ = _source(tmp_path, "phi3-longrope-short", source)
    with caplog.at_level("WARNING", logger="speculant_tools.importers"):
        config = read_checkpoint(path).config
    assert config.max_position_embeddings == 16 and config.rope_scaling.long_after is None
    assert "capped at the original 16 tokens (of 64)" in caplog.text


def _long_runs(cfg: dict, family: str) -> list[tuple[int, list[int], np.ndarray]]:
    """(prefill, the calls' sizes, the reference's logits) of LONG_IDS prefilled so far,
    then one token per call: a prompt shorter than the original context (16) decoding
    across it, and a longer one."""
    runs = [(prefill, [prefill] + [1] * (len(LONG_IDS) - prefill)) for prefill in (12, 20)]
    return [(prefill, blocks, reference_logits(cfg, hf_weights(family), LONG_IDS,
                                               blocks=blocks)) for prefill, blocks in runs]


def test_the_long_table_and_the_call_boundaries_matter():
    """The reference of the rule (a call longer than the original context rotates with the
    long factors; cached keys keep theirs) differs from the short factors alone beyond the
    original context, equals them before it, and differs from one call of the whole
    sequence (all long) before it: the equalities below are not vacuous."""
    cfg, weights = HF_CONFIGS["phi3-longrope"], hf_weights("phi3-longrope")
    (_, _, crossing), _ = _long_runs(cfg, "phi3-longrope")
    short = reference_logits(HF_CONFIGS["phi3-longrope-short"], weights, LONG_IDS)
    whole = reference_logits(cfg, weights, LONG_IDS)
    np.testing.assert_allclose(crossing[:16], short[:16], rtol=1e-12)
    scale = 1e-3 * np.abs(short).max()
    assert np.abs(crossing[16:] - short[16:]).min(axis=-1).max() > scale
    assert np.abs(crossing[:16] - whole[:16]).max() > scale


@pytest.mark.parametrize("source, cache, dtype, graph", FORMS)
@pytest.mark.parametrize("family", ["phi3-longrope", "phi3-partial-longrope"])
def test_longrope_logits_equal_the_reference_beyond_the_original_context(
        tmp_path, family, source, cache, dtype, graph):
    path, cfg = _source(tmp_path, family, source)
    package = import_model(path, tmp_path / "package", dtype=dtype, cache=cache, graph=graph)
    for prefill, _, expected in _long_runs(cfg, family):
        actual = package_logits(package, LONG_IDS, prefill)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(actual, expected, rtol=0, err_msg=f"prefill {prefill}",
                                   atol=(2e-2 if dtype == "float16" else 2e-4) * scale)


def test_the_short_table_alone_misses_the_reference(tmp_path, monkeypatch):
    """The planted defect (every call rotates with the short table) moves the logits of
    every call longer than the original context past the tolerance of the test above (but
    position 0's: an angle of 0 in either table), and those of the shorter calls not."""
    from export.export_reference import long_positions
    from speculant_tools.export import RopeScaling

    cfg = HF_CONFIGS["phi3-longrope"]
    monkeypatch.setattr(RopeScaling, "long_after", property(lambda self: None))
    package = import_model(write_hf_folder(tmp_path / "hf", "phi3-longrope"),
                           tmp_path / "package", graph="explicit")
    for prefill, blocks, expected in _long_runs(cfg, "phi3-longrope"):
        errors = np.abs(package_logits(package, LONG_IDS, prefill) - expected).max(axis=-1)
        is_long, tolerance = long_positions(expected_config(cfg), blocks), 2e-4 * np.abs(
            expected).max()
        assert is_long[1:].any() and errors[~is_long].max(initial=0) < tolerance
        assert errors[1:][is_long[1:]].min() > tolerance


def test_a_batched_pass_chooses_each_rows_table(tmp_path):
    """``--batch``: one pass holds a row under the original context (its padding's positions
    past it) beside a row over it, then both decode; each row equals the reference of its
    own calls."""
    from static_cache.static_driver import BatchedTarget

    cfg = {**HF_CONFIGS["phi3-longrope"], "sliding_window": None}  # the batched pass's form
    package = import_model(write_hf_folder(tmp_path / "hf", "phi3-longrope", cfg),
                           tmp_path / "package", batch=2)
    c = read_checkpoint(tmp_path / "hf").config
    target = BatchedTarget(package / "decoder" / "batched.onnx", 2, 32, np.zeros(
        (c.num_hidden_layers, 2, 2, c.num_key_value_heads, 32, c.head_dim)))
    prompts, ends = (10, 20), len(LONG_IDS)
    rows: list[list[np.ndarray]] = [[], []]
    for step in range(ends - min(prompts) + 1):
        blocks = [LONG_IDS[:p] if step == 0 else LONG_IDS[p + step - 1:p + step]
                  for p in prompts]
        for row, logits in zip(rows, target.run(blocks), strict=True):
            row.append(logits)
    for prompt, row in zip(prompts, rows, strict=True):
        actual = np.concatenate(row)[:ends]
        expected = reference_logits(cfg, hf_weights("phi3-longrope"), LONG_IDS,
                                    blocks=[prompt] + [1] * (ends - prompt))
        np.testing.assert_allclose(actual, expected, atol=2e-4 * np.abs(expected).max(),
                                   rtol=0, err_msg=f"the row of a {prompt}-token prompt")


@pytest.mark.parametrize("rope_key", ["partial_rotary_factor", "rope_parameters"])
def test_partial_rotary_is_read_for_the_llama_like_families(rope_key):
    """Llama, Mistral and Qwen read partial_rotary_factor (top level, or in transformers 5's
    rope_parameters) as Phi-3 does: int(head_dim * factor) values turned; 1 is all."""
    from speculant_tools.importers.families import fields_from_hf

    llama = {"model_type": "llama", "vocab_size": 48, "hidden_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 32}
    for factor, expected in ((0.75, 24), (1.0, None)):
        change = {rope_key: factor} if rope_key != "rope_parameters" else {
            rope_key: {"rope_type": "default", "partial_rotary_factor": factor}}
        assert fields_from_hf({**llama, **change})["rotary_dim"] == expected


@pytest.mark.parametrize("layout", ["language_model.model.", "model.language_model."])
def test_a_gemma3_multimodal_folder_imports_its_text_model(tmp_path, layout):
    """A Gemma3ForConditionalGeneration folder (4B-27B): text_config (its omitted fields
    Gemma3TextConfig's defaults), the text weights under transformers' two layouts, the
    vision tower not read; the package equals the text model's reference."""
    from safetensors.numpy import save_file

    text = HF_CONFIGS["gemma3-linear"]
    folder = write_hf_folder(tmp_path / "mm", "gemma3-linear", {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "eos_token_id": text["eos_token_id"], "vision_config": {"model_type": "siglip"},
        "text_config": {k: v for k, v in text.items() if k not in (
            "architectures", "model_type", "rope_local_base_freq", "sliding_window_pattern",
            "eos_token_id")}})
    weights = {layout + name.removeprefix("model."): array
               for name, array in hf_weights("gemma3-linear").items()}
    weights["vision_tower.vision_model.post_layernorm.weight"] = np.ones(4, np.float32)
    save_file(weights, str(folder / "model.safetensors"))
    checkpoint = read_checkpoint(folder)
    assert checkpoint.config == expected_config(text)
    assert sorted(checkpoint.weights) == sorted(hf_weights("gemma3-linear"))
    package = import_model(folder, tmp_path / "package")
    expected = reference_logits(text, hf_weights("gemma3-linear"), IDS)
    np.testing.assert_allclose(package_logits(package, IDS, PREFILL), expected,
                               atol=2e-4 * np.abs(expected).max(), rtol=0)


# -- transformers -------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES + SCALED)
def test_logits_equal_transformers(tmp_path, family):
    torch = pytest.importorskip("torch", reason="transformers' check needs torch")
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    folder = write_hf_folder(tmp_path / "hf", family)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = model(torch.tensor([IDS])).logits[0].double().numpy()
    np.testing.assert_allclose(expected, reference_logits(HF_CONFIGS[family],
                                                          hf_weights(family), IDS),
                               atol=1e-4 * np.abs(expected).max(), rtol=0)
    for cache in ("appended", "static"):
        package = import_model(folder, tmp_path / cache, cache=cache)
        np.testing.assert_allclose(package_logits(package, IDS, PREFILL), expected,
                                   atol=2e-4 * np.abs(expected).max(), rtol=0)


@pytest.mark.parametrize("family", ["phi3-longrope", "phi3-partial-longrope"])
def test_longrope_beyond_the_original_context_equals_transformers(tmp_path, family):
    """transformers' own Phi-3 through its cache, prefilled then one token per call (its
    longrope choice is per call), equals the reference of the same calls and the package."""
    torch = pytest.importorskip("torch", reason="transformers' check needs torch")
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    folder = write_hf_folder(tmp_path / "hf", family)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    package = import_model(folder, tmp_path / "package")
    for prefill, _, reference in _long_runs(HF_CONFIGS[family], family):
        rows, past = [], None
        with torch.no_grad():
            for block in [LONG_IDS[:prefill], *([t] for t in LONG_IDS[prefill:])]:
                out = model(torch.tensor([block]), past_key_values=past, use_cache=True)
                rows.append(out.logits[0].double().numpy())
                past = out.past_key_values
        expected = np.concatenate(rows)
        tolerance = 2e-4 * np.abs(expected).max()
        np.testing.assert_allclose(reference, expected, atol=tolerance, rtol=0)
        np.testing.assert_allclose(package_logits(package, LONG_IDS, prefill), expected,
                                   atol=tolerance, rtol=0)


def test_phi3_written_back_as_mistral_equals_transformers(tmp_path):
    """export-hf's Mistral config.json of a Phi-3 package computes the Phi-3's logits in
    transformers' own MistralForCausalLM."""
    torch = pytest.importorskip("torch", reason="transformers' check needs torch")
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    pytest.importorskip("safetensors", reason="export_hf writes safetensors")
    from speculant_tools.export import export_hf

    package = import_model(write_hf_folder(tmp_path / "hf", "phi3"), tmp_path / "package")
    written = export_hf(package, tmp_path / "back")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        written, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(model).__name__ == "MistralForCausalLM"
    with torch.no_grad():
        actual = model(torch.tensor([IDS])).logits[0].double().numpy()
    expected = reference_logits(HF_CONFIGS["phi3"], hf_weights("phi3"), IDS)
    np.testing.assert_allclose(actual, expected, atol=1e-4 * np.abs(expected).max(), rtol=0)


# -- refused, by name ---------------------------------------------------------------------
@pytest.mark.parametrize("family, change, field", [
    ("gemma3", {"rope_scaling": {"rope_type": "yarn", "factor": 8.0}},
     "config.rope_scaling.rope_type"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "linear",
                                                          "factor": 8.0}}},
     "config.rope_parameters.sliding_attention.rope_type"),
    ("phi3", {"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 8,
                               "short_factor": [1.0] * 7}}, "config.rope_scaling.short_factor"),
    ("phi3", {"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 7,
                               "short_factor": [1.0] * 8}}, "config.rope_scaling.long_factor"),
    ("phi3", {"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 7 + [float("nan")],
                               "short_factor": [1.0] * 8}},
     "config.rope_scaling.long_factors"),
    ("phi3", {"rope_scaling": {"type": "yarn", "factor": 4.0}},
     "config.rope_scaling.rope_type"),
    ("phi3", {"partial_rotary_factor": 1.5}, "config.partial_rotary_factor"),
    ("gemma2", {"hidden_activation": "relu"}, "config.hidden_activation"),
    ("gemma2", {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
     "model_type"),
])
def test_unsupported_fields_are_refused_with_a_remedy(tmp_path, family, change, field):
    folder = write_hf_folder(tmp_path / "hf", family, {**HF_CONFIGS[family], **change})
    with pytest.raises(ImporterError) as caught:
        import_model(folder, tmp_path / "out")
    problem = caught.value.problems[0]
    assert caught.value.paths == [field]
    assert problem.file.endswith("config.json") and problem.remedy
    assert not (tmp_path / "out").exists()


def test_phi3_long_factors_alone_are_refused_by_tensor(tmp_path):
    path = write_gguf_file(tmp_path / "m.gguf", "phi3",
                           extra={"rope_factors_long.weight": np.ones(8)})
    with pytest.raises(ImporterError) as caught:
        import_model(path, tmp_path / "out")
    assert caught.value.paths == ["tensors.rope_factors_long.weight"]


def test_phi3_long_factors_of_the_wrong_shape_are_refused_by_tensor(tmp_path):
    path = write_gguf_file(tmp_path / "m.gguf", "phi3-longrope",
                           extra={"rope_factors_long.weight": np.ones(7)})
    with pytest.raises(ImporterError) as caught:
        import_model(path, tmp_path / "out")
    assert caught.value.paths == ["tensors.rope_factors_long.weight"]


@pytest.mark.parametrize("change, field", [
    ({"long_factors": (1.0,) * 7}, "config.rope_scaling.long_factors"),
    ({"long_factors": (1.0,) * 7 + (0.0,)}, "config.rope_scaling.long_factors"),
    ({"long_factors": (1.0,) * 8, "original_max_position_embeddings": None},
     "config.rope_scaling.original_max_position_embeddings"),
])
def test_invalid_long_factors_are_refused_by_field(change, field):
    from speculant_tools.export import ExportError, RopeScaling

    short = {"frequency_factors": (1.0,) * 8, "attention_factor": 1.2,
             "original_max_position_embeddings": 16}
    with pytest.raises(ExportError) as caught:
        RopeScaling("longrope", **{**short, **change})
    assert caught.value.paths == [field]


def test_a_plain_llama_package_is_unchanged(tmp_path):
    """The variations' defaults write nothing new: a Llama config's JSON has none of them."""
    from gguf_models import CONFIG

    assert set(json.loads(CONFIG.to_json())) == {
        "head_dim", "hidden_size", "intermediate_size", "max_position_embeddings",
        "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps",
        "rope_theta", "vocab_size"}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_decodes_the_reference_greedy_tokens(tmp_path, family):
    """The runtime drives an imported package (static caches, the import's default) to the
    reference's greedy continuation, recomputed from scratch at every step."""
    import speculant

    package = import_model(write_hf_folder(tmp_path / "hf", family), tmp_path / "package")
    cfg, weights, ids = HF_CONFIGS[family], hf_weights(family), list(IDS[:4])
    for _ in range(6):
        ids.append(int(reference_logits(cfg, weights, ids)[-1].argmax()))
    result = speculant.load(package).generate(IDS[:4], 6, stop_on_eos=False)
    assert result.token_ids == ids[4:]


def test_convert_keeps_the_family_and_export_hf_writes_what_transformers_computes(tmp_path):
    """A Phi-3 package converts to float16 as any other (its configuration travels in the
    graph); written back it is a Mistral config.json (an untied Llama sliding on every
    layer, q/k/v and gate/up split), which reads back as the same configuration. A Gemma
    package is refused by field: no family export-hf writes has its variations."""
    from speculant_tools.export import ExportError, LlamaConfig, convert, export_hf

    package = import_model(write_hf_folder(tmp_path / "hf", "phi3"), tmp_path / "package",
                           graph="explicit")
    half = convert(package, tmp_path / "half", "float16")
    expected = reference_logits(HF_CONFIGS["phi3"], hf_weights("phi3"), IDS)
    np.testing.assert_allclose(package_logits(half, IDS, PREFILL), expected,
                               atol=2e-2 * np.abs(expected).max(), rtol=0)
    pytest.importorskip("safetensors", reason="export_hf writes safetensors")
    written = json.loads((export_hf(package, tmp_path / "back") / "config.json").read_text())
    assert written["architectures"] == ["MistralForCausalLM"]
    assert LlamaConfig.from_hf(written) == read_checkpoint(tmp_path / "hf").config
    gemma = import_model(write_hf_folder(tmp_path / "gemma", "gemma2"), tmp_path / "g")
    with pytest.raises(ExportError) as caught:
        export_hf(gemma, tmp_path / "gemma-back")
    assert caught.value.paths == ["config.embedding_multiplier"]


@pytest.mark.parametrize("change, field", [
    ({"layer_types": ("full_attention",)}, "config.layer_types"),
    ({"layer_types": ("sliding_attention", "local")}, "config.layer_types"),
    ({"layer_types": ("sliding_attention", "full_attention")}, "config.sliding_window"),
    ({"hidden_act": "relu"}, "config.hidden_act"),
    ({"attn_logit_softcapping": 0.0}, "config.attn_logit_softcapping"),
    ({"embedding_multiplier": float("nan")}, "config.embedding_multiplier"),
    ({"norm_weight_offset": float("inf")}, "config.norm_weight_offset"),
    ({"sliding_window": 0}, "config.sliding_window"),
])
def test_invalid_variations_are_refused_by_field(change, field):
    from dataclasses import replace

    from gguf_models import CONFIG

    from speculant_tools.export import ExportError

    with pytest.raises(ExportError) as caught:
        replace(CONFIG, **change)
    assert caught.value.paths == [field]
