"""Llama 3.x, Mistral, Qwen 2/2.5 and Qwen 3 (tests/importers/test_families.py: Gemma and
Phi-3), imported with ``speculant import``'s API from a tiny
random-weight Hugging Face folder and GGUF written here: the declared config is the family's,
and the logits of a prefill, two decode steps and a two-token block equal the numpy
reference of the architecture (tests/export/export_reference.py) in every graph form the
exporter writes (appended and static caches, node by node and fused, float32 and float16).
Models outside the supported families are refused by name, with what to do."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from family_cases import (
    CASES,
    GGUF_CASES,
    drive,
    random_weights,
    write_gguf,
    write_hf_folder,
)

import speculant
from export.export_reference import greedy, target_forward
from speculant_tools.export import ExportError, LlamaConfig, RopeScaling, read_weights
from speculant_tools.importers import ImporterError, import_model, read_checkpoint

BLOCKS = [[7, 3, 41, 12, 25], [9], [33], [48, 2]]  # prefill, two steps, a two-token block
IDS = [token for block in BLOCKS for token in block]
# (dtype, graph, cache): every graph form the exporter writes
FORMS = [("float32", "explicit", "appended"), ("float32", "explicit", "static"),
         ("float32", "fused", "appended"), ("float32", "fused", "static"),
         ("float16", "auto", "static")]
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2.5e-1)}  # logits ~ N(0, 16^2)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """case name -> (weights, HF folder, GGUF path or None)."""
    out = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case.name)
        weights = random_weights(case.config)
        gguf = write_gguf(root / "model.gguf", case, weights) if case.gguf_arch else None
        out[case.name] = (weights, write_hf_folder(root / "hf", case, weights), gguf)
    return out


def reference_logits(config: LlamaConfig, weights) -> np.ndarray:
    return target_forward(config, weights, IDS)[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hf_config_declares_the_family(case):
    assert LlamaConfig.from_hf(case.hf) == case.config
    assert LlamaConfig.from_hf(case.config.to_hf()) == case.config  # export-hf round trip


@pytest.mark.parametrize("case", GGUF_CASES, ids=lambda c: c.name)
def test_gguf_declares_the_family(case, sources):
    weights, _, gguf = sources[case.name]
    checkpoint = read_checkpoint(gguf)
    assert checkpoint.config == case.gguf_config
    assert set(checkpoint.weights) == set(weights)
    for name, array in weights.items():  # the q/k permutation undone for llama only
        np.testing.assert_array_equal(checkpoint.weights[name], array, err_msg=name)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: "-".join(f))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hf_import_logits_equal_the_reference(case, form, sources, tmp_path):
    dtype, graph, cache = form
    weights, folder, _ = sources[case.name]
    root = import_model(folder, tmp_path / "package", dtype=dtype, graph=graph, cache=cache)
    assert read_weights(root)[0] == case.config
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(drive(root, BLOCKS), reference_logits(case.config, weights),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("cache", ["appended", "static"])
@pytest.mark.parametrize("case", GGUF_CASES, ids=lambda c: c.name)
def test_gguf_import_logits_equal_the_reference(case, cache, sources, tmp_path):
    """The reference of the Hugging Face config (llama3 from its parameters), so the GGUF's
    per-frequency factors are checked against the scaling they encode."""
    weights, _, gguf = sources[case.name]
    root = import_model(gguf, tmp_path / "package", cache=cache)
    np.testing.assert_allclose(drive(root, BLOCKS), reference_logits(case.config, weights),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", GGUF_CASES, ids=lambda c: c.name)
def test_gguf_q4_0_linear_layers_stay_quantized_with_biases_and_norms(case, tmp_path):
    """A Q4_0 GGUF of each family keeps its 14 linear layers as MatMulNBits (q/k rows
    un-permuted for ``llama``, biases and QK norms after them); its logits equal the same
    file widened to float32 (--quantize float)."""
    import onnx
    from gguf import GGMLQuantizationType as Q

    path = write_gguf(tmp_path / "m.gguf", case, random_weights(case.config), Q.Q4_0)
    kept = import_model(path, tmp_path / "kept")
    widened = import_model(path, tmp_path / "widened", quantize="float")
    nodes = onnx.load(str(kept / "decoder" / "model.onnx")).graph.node
    assert sum(node.op_type == "MatMulNBits" for node in nodes) == 7 * 2
    expected = drive(widened, BLOCKS)
    np.testing.assert_allclose(drive(kept, BLOCKS), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())


def test_each_declared_field_changes_the_logits(sources):
    """The reference reads every variant field (so equality above is not vacuous)."""
    for case in CASES:
        weights = sources[case.name][0]
        plain = {name: value for name, value in case.config.variant_fields.items()
                 if name not in ("tie_word_embeddings", "layer_types")}
        for name in plain:
            default = LlamaConfig.__dataclass_fields__[name].default
            changed = replace(case.config, **{name: default},
                              **({"layer_types": None} if name == "sliding_window" else {}))
            assert not np.allclose(reference_logits(changed, weights),
                                   reference_logits(case.config, weights), atol=1e-3), \
                (case.name, name)


@pytest.mark.parametrize("graph", ["explicit", "fused"])
def test_sliding_layers_rotate_with_their_local_base_unscaled(graph, tmp_path):
    """Gemma 3's layout with RoPE scaling (its 4B-27B models scale the global layers
    only): a sliding layer rotates at ``rope_local_base_freq`` without the scaling, in both
    graph forms (the global layer scaled: the scaling changes the logits)."""
    from export.export_models import write_tokenizer
    from speculant_tools.export import write_decoder_package
    from speculant_tools.export.config import FULL, SLIDING

    qwen3 = next(case for case in CASES if case.name == "qwen3").config
    config = replace(qwen3, rope_theta=1e6, rope_scaling=RopeScaling("linear", factor=8.0),
                     sliding_window=4, layer_types=(SLIDING, FULL),
                     rope_local_base_freq=10000.0)
    weights = random_weights(config)
    root = write_decoder_package(tmp_path / "package", weights, config,
                                 write_tokenizer(tmp_path / "tokenizer.json"), graph=graph,
                                 cache="static")
    expected = reference_logits(config, weights)
    np.testing.assert_allclose(drive(root, BLOCKS), expected, rtol=1e-4, atol=1e-4)
    unscaled = replace(config, rope_scaling=None)  # the global layer's scaling matters
    assert not np.allclose(reference_logits(unscaled, weights), expected, atol=1e-3)


def test_prompt_lookup_equals_greedy_on_an_imported_family(sources, tmp_path):
    """Qwen 3 (q/k norms, head_dim of its own), static caches: speculative decoding with
    prompt lookup gives the greedy tokens, which are the reference's."""
    case = next(case for case in CASES if case.name == "qwen3")
    weights, folder, _ = sources[case.name]
    engine = speculant.load(import_model(folder, tmp_path / "package"))
    for prompt in ([7, 3, 41, 7, 3, 41, 7, 3], [20, 21, 5, 20, 21]):
        expected, margin = greedy(case.config, weights, prompt, 10)
        assert margin > 1e-3
        tokens = engine.generate(prompt, 10, stop_on_eos=False).token_ids
        assert tokens == expected
        for k in (2, 4):
            assert engine.generate(prompt, 10, stop_on_eos=False, proposer="prompt_lookup",
                                   k=k).token_ids == expected


# -- refusals: the family or field named, and what to do ------------------------------------
def _refusal(data: dict) -> ExportError:
    with pytest.raises(ExportError) as caught:
        LlamaConfig.from_hf(data)
    return caught.value


def test_an_unknown_architecture_is_refused_with_the_supported_list():
    error = _refusal({**CASES[0].hf, "architectures": ["GPTNeoXForCausalLM"],
                      "model_type": "gpt_neox"})
    problem = error.problems[0]
    assert problem.path == "config.model_type" and problem.value == "gpt_neox"
    assert "qwen3" in problem.expected and "docs/models.md" in problem.remedy


@pytest.mark.parametrize("rope_type", ["yarn", "longrope"])
def test_an_unsupported_rope_type_is_refused_with_the_remedy(rope_type):
    error = _refusal({**CASES[0].hf, "rope_scaling": {"rope_type": rope_type, "factor": 4.0}})
    problem = error.problems[0]
    assert problem.value == rope_type and "llama3" in problem.expected
    assert "original context" in problem.remedy


def test_incomplete_llama3_scaling_names_the_missing_key():
    rope = {k: v for k, v in CASES[0].hf["rope_scaling"].items() if k != "high_freq_factor"}
    assert "high_freq_factor" in str(_refusal({**CASES[0].hf, "rope_scaling": rope}))


def test_mixed_attention_layer_types_outside_the_two_kinds_are_refused():
    qwen3 = next(case for case in CASES if case.name == "qwen3")
    error = _refusal({**qwen3.hf, "layer_types": ["full_attention", "chunked_attention"],
                      "sliding_window": 4})
    assert error.problems[0].path == "config.layer_types"


def test_dynamic_rope_is_plain_rope_capped_at_the_original_context():
    data = {**CASES[3].hf, "max_position_embeddings": 64,
            "rope_scaling": {"rope_type": "dynamic", "factor": 2.0,
                             "original_max_position_embeddings": 32}}
    config = LlamaConfig.from_hf(data)
    assert config.rope_scaling is None and config.max_position_embeddings == 32


def test_hf_folder_refusal_names_the_config_file(sources, tmp_path):
    folder = sources["qwen2"][1]
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folder.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    data = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**data, "architectures": ["Phi9ForX"],
                                                    "model_type": "phi9"}))
    with pytest.raises(ImporterError) as caught:
        import_model(broken, tmp_path / "out")
    problem = caught.value.problems[0]
    assert problem.file == str(broken / "config.json") and problem.value == "phi9"
    assert "qwen2" in problem.expected and problem.path == "model_type"


def test_gguf_refusals_name_the_key_and_what_to_do(sources, tmp_path):
    import gguf

    case = next(case for case in GGUF_CASES if case.name == "qwen2")
    weights = sources[case.name][0]
    for arch in ("gptneox",):
        with pytest.raises(ImporterError) as caught:
            read_checkpoint(write_gguf(tmp_path / f"{arch}.gguf", replace(case, gguf_arch=arch),
                                       weights))
        assert caught.value.problems[0].path == "general.architecture"
        assert "qwen3" in caught.value.problems[0].expected
    yarn = replace(case, gguf_keys={"qwen2.rope.scaling.type": "yarn",
                                    "qwen2.rope.scaling.factor": 4.0})
    with pytest.raises(ImporterError) as caught:
        read_checkpoint(write_gguf(tmp_path / "yarn.gguf", yarn, weights))
    problem = caught.value.problems[0]
    assert problem.path == "qwen2.rope.scaling.type" and problem.value == "yarn"
    assert "gguf-new-metadata --remove-metadata qwen2.rope.scaling.type" in problem.remedy
    assert gguf.GGUFReader  # the writer's own package read it back above


def test_rope_scaling_is_validated():
    with pytest.raises(ExportError):
        RopeScaling("llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0,
                    original_max_position_embeddings=64)
    with pytest.raises(ExportError):
        RopeScaling("linear", factor=float("nan"))
    with pytest.raises(ExportError, match="head_dim / 2"):
        replace(CASES[0].config, rope_scaling=RopeScaling("factors", frequency_factors=(1.0,)))


def test_export_hf_refuses_what_no_config_json_expresses():
    """A GGUF's per-frequency RoPE factors and a QK-normed model with q/k/v biases but no o
    bias (no family has both) are refused by field, not written as another model."""
    llama3 = next(case for case in GGUF_CASES if case.name == "llama3")
    with pytest.raises(ExportError) as caught:
        llama3.gguf_config.to_hf()
    assert caught.value.paths == ["config.rope_scaling"]
    mixed = replace(next(case for case in CASES if case.name == "qwen3").config,
                    attention_bias=True)
    with pytest.raises(ExportError) as caught:
        mixed.to_hf()
    assert caught.value.problems[0].value == {"qk_norm": True, "attention_bias": True}


def test_tools_that_compute_plain_llama_refuse_a_declared_family(sources, tmp_path):
    """Widening (cost_scale) and train-drafter's frozen target compute the plain Llama
    graph: a family's declared field is refused by name, not computed wrongly."""
    from speculant_tools.export.widen import widened_config
    from speculant_tools.train_drafter.errors import TrainDrafterError
    from speculant_tools.train_drafter.source import read_source

    case = next(case for case in CASES if case.name == "qwen3")
    with pytest.raises(ExportError, match="plain Llama"):
        widened_config(case.config, {"hidden_size": 64})
    package = import_model(sources[case.name][1], tmp_path / "package")
    for source in (sources[case.name][1], package):
        with pytest.raises(TrainDrafterError) as caught:
            read_source(source)
        assert caught.value.problems[0].path.endswith("qk_norm")


def test_bfloat16_safetensors_read_exactly(sources, tmp_path):
    """A bfloat16 checkpoint (what Llama 3, Qwen and Mistral publish), written here in the
    safetensors layout, reads back as the float32 values its bfloat16 bits hold."""
    case = next(case for case in CASES if case.name == "qwen2")
    weights, folder, _ = sources[case.name]
    bits = {name: (array.view(np.uint32) >> 16).astype("<u2") for name, array in weights.items()}
    header, offset = {}, 0
    for name, raw in bits.items():
        header[name] = {"dtype": "BF16", "shape": list(raw.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        offset += raw.nbytes
    text = json.dumps(header).encode()
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    for path in folder.iterdir():
        if path.suffix != ".safetensors":
            (bf16 / path.name).write_bytes(path.read_bytes())
    (bf16 / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + b"".join(
        raw.tobytes() for raw in bits.values()))
    checkpoint = read_checkpoint(bf16)
    for name, raw in bits.items():
        expected = (raw.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(checkpoint.weights[name], expected, err_msg=name)
