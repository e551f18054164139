"""Anchors in `speculant bench`: Hugging Face transformers and onnxruntime-genai on the same
weights, in the same run.

Two tiers. The config-writing, checking and reporting code is pure and tested everywhere,
with the anchors' packages absent or not. The runs themselves need the optional packages
(torch, transformers, safetensors; onnxruntime-genai and onnx_ir for genai) and skip with the
reason when those are missing, as they are in CI. Speed is never asserted, only that it is
measured and that every anchor decodes the same tokens as speculant's greedy.
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speculant.cli import full_app
from speculant_bench import BenchConfig, run_bench
from speculant_bench.anchors import AnchorDecode, AnchorRunner, genai, hf, prepare_anchors
from speculant_bench.anchors import base as anchors_base
from speculant_bench.anchors import report as anchor_report
from speculant_bench.report import markdown, summarize
from speculant_bench.run import RunnerResult, Sample
from speculant_bench.runners import Runner

app = full_app()


DEMO = Path(str(resources.files("speculant") / "demo"))
DEMO_DRAFT = Path(str(resources.files("speculant") / "demo_draft"))

LLAMA = {"vocab_size": 4096, "hidden_size": 192, "intermediate_size": 512,
         "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 32}

BUILT = {  # the shape of what the builder writes (trimmed)
    "model": {
        "bos_token_id": 1, "context_length": 512, "eos_token_id": 0, "pad_token_id": 0,
        "type": "llama", "vocab_size": 4096,
        "decoder": {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                    "filename": "model.onnx", "head_size": 32, "hidden_size": 192,
                    "num_attention_heads": 6, "num_hidden_layers": 5,
                    "num_key_value_heads": 2},
    },
    "search": {"do_sample": False, "max_length": 512},
}


# -- names and availability --------------------------------------------------------------------
def test_anchor_names_parse_from_commas_or_repeats():
    assert anchors_base.parse_anchors(["hf,genai"]) == ("hf", "genai")
    assert anchors_base.parse_anchors(["genai", "hf", "GENAI", " "]) == ("genai", "hf")
    assert anchors_base.parse_anchors(None) == ()
    with pytest.raises(ValueError, match="known: hf, genai"):
        anchors_base.parse_anchors(["hf,vllm"])


def test_missing_packages_are_named_in_the_reason():
    def only(*present):
        return lambda name: object() if name in present else None

    assert anchors_base.why_missing("hf", only("torch", "transformers", "safetensors")) is None
    reason = anchors_base.why_missing("hf", only("torch", "safetensors"))
    assert "transformers is not installed" in reason and "speculant[anchors]" in reason
    reason = anchors_base.why_missing("genai", only("torch", "transformers", "safetensors"))
    assert "onnxruntime_genai, onnx_ir are not installed" in reason


def test_the_skip_logic_follows_what_is_installed():
    """The reason is None exactly when every module of the anchor can be found here."""
    for name in anchors_base.ANCHORS:
        present = all(importlib.util.find_spec(m) is not None
                      for m in anchors_base.REQUIRED_MODULES[name])
        assert (anchors_base.why_missing(name) is None) == present


def test_each_mode_pairs_with_the_speculant_runner_doing_the_same_job():
    def runner(runtime, mode, k):
        return AnchorRunner(runtime, mode, k, decode=None)

    assert runner("hf", "greedy", 0).counterpart == Runner()
    assert runner("hf", "greedy", 0).name == "hf greedy"
    assert runner("hf", "prompt_lookup", 2).counterpart == Runner("prompt_lookup", 2)
    assert runner("hf", "assisted", 4).counterpart == Runner("draft", 4)
    assert runner("genai", "ngram", 8).counterpart == Runner("prompt_lookup", 8)
    assert runner("genai", "draft", 1).counterpart == Runner("draft", 1)
    assert runner("genai", "draft", 1).name == "genai draft k=1"


# -- transformers options ----------------------------------------------------------------------
def test_transformers_options_per_mode():
    assert hf.generate_options("greedy", 0) == {}
    assert hf.generate_options("prompt_lookup", 4) == {"prompt_lookup_num_tokens": 4,
                                                       "max_matching_ngram_size": 3}
    assert hf.generate_options("assisted", 2) == {
        "num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0}
    with pytest.raises(ValueError):
        hf.generate_options("ngram", 2)
    assert hf.torch_device("cpu") == "cpu"
    assert hf.torch_device("cuda") == "cuda:0" and hf.torch_device("cuda:1") == "cuda:1"


def test_transformers_loads_the_checkpoint_in_its_own_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert hf.checkpoint_dtype(tmp_path) == "float16"
    (tmp_path / "config.json").write_text("{}")
    assert hf.checkpoint_dtype(tmp_path) == "float32"


# -- onnxruntime-genai: checks, command line, config edits -------------------------------------
def test_projection_widths_and_the_lm_head_pitfall():
    assert genai.projection_widths(LLAMA) == {
        "q_proj": 192, "k_proj": 64, "v_proj": 64, "o_proj": 192, "gate_proj": 512,
        "up_proj": 512, "down_proj": 192}
    assert genai.lm_head_clashes(LLAMA) == []
    # the builder takes any Linear of the vocabulary's width for the head
    assert genai.lm_head_clashes({**LLAMA, "intermediate_size": 4096}) == ["gate_proj",
                                                                          "up_proj"]
    assert genai.lm_head_clashes({**LLAMA, "vocab_size": 192}) == ["q_proj", "o_proj",
                                                                   "down_proj"]
    no_head_dim = {k: v for k, v in LLAMA.items() if k != "head_dim"}
    assert genai.projection_widths(no_head_dim)["k_proj"] == 64  # hidden / heads per head


def test_the_committed_demo_pair_is_safe_to_build():
    """The demo target and draft: vocabulary 4096 against every projection width."""
    from speculant_tools.export.package import read_settings, read_weights

    for package in (DEMO, DEMO_DRAFT):
        config = read_weights(package)[0].to_hf(read_settings(package).dtype, eos_token_id=0)
        assert config["vocab_size"] == 4096 and genai.lm_head_clashes(config) == []


def test_builder_command_is_offline_fp32_on_the_device():
    command = genai.builder_command(Path("/hf"), Path("/out"), Path("/cache"), "cpu",
                                    python="py")
    assert command == ["py", "-m", "onnxruntime_genai.models.builder", "-i", "/hf", "-o",
                       "/out", "-p", "fp32", "-e", "cpu", "-c", "/cache"]
    assert genai.builder_command(Path("/hf"), Path("/o"), Path("/c"), "cuda:1")[-3] == "cuda"


def test_the_builder_precision_follows_the_checkpoint_dtype():
    assert genai.builder_precision({"torch_dtype": "float32"}) == "fp32"
    assert genai.builder_precision({"torch_dtype": "float16"}) == "fp16"
    assert genai.builder_precision({}) == "fp32"
    with pytest.raises(anchors_base.AnchorError, match="int8"):
        genai.builder_precision({"torch_dtype": "int8"})
    command = genai.builder_command(Path("/hf"), Path("/o"), Path("/c"), "cuda",
                                    precision="fp16")
    assert command[command.index("-p") + 1] == "fp16"


def _graph(outputs_made: bool):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1])
    present = helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Identity", ["x"], ["logits"])]
    if outputs_made:
        nodes.append(helper.make_node("Identity", ["x"], ["present.0.key"]))
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y, present]))


def test_a_built_graph_whose_outputs_no_node_makes_is_refused(tmp_path):
    """The builder's float32 CUDA graph of a GQA model declares present.* that nothing makes."""
    import onnx

    assert genai.missing_outputs(_graph(True)) == []
    assert genai.missing_outputs(_graph(False)) == ["present.0.key"]
    onnx.save(_graph(False), str(tmp_path / "model.onnx"))
    (tmp_path / "genai_config.json").write_text(json.dumps(BUILT))
    command = genai.builder_command(Path("/hf"), tmp_path, Path("/c"), "cuda")
    with pytest.raises(anchors_base.AnchorError, match="present.0.key") as caught:
        genai.check_graph(tmp_path, command)
    assert "-p fp32 -e cuda" in str(caught.value) and "float16" in str(caught.value)
    onnx.save(_graph(True), str(tmp_path / "model.onnx"))
    genai.check_graph(tmp_path, command)


def test_patch_config_sets_threads_masks_eos_and_keeps_the_original():
    original = json.loads(json.dumps(BUILT))
    patched = genai.patch_config(BUILT, threads=2, pad_token_id=4095)
    assert BUILT == original  # a copy: the builder's file is kept as it was
    options = patched["model"]["decoder"]["session_options"]
    assert options == {"log_id": "onnxruntime-genai", "provider_options": [],
                       "intra_op_num_threads": 2}
    assert patched["model"]["eos_token_id"] == [] and patched["model"]["pad_token_id"] == 4095
    untouched = genai.patch_config(BUILT, threads=None, pad_token_id=7)
    assert "intra_op_num_threads" not in untouched["model"]["decoder"]["session_options"]


def test_patch_config_reaches_the_draft_block_and_the_cuda_device():
    cuda = json.loads(json.dumps(BUILT))
    cuda["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {}}]
    composite = genai.compose_draft_config(cuda, cuda, k=2)
    patched = genai.patch_config(composite, threads=1, pad_token_id=9, device_id=1)
    for block in (patched["model"]["decoder"], patched["model"]["draft"]):
        assert block["session_options"]["intra_op_num_threads"] == 1
        assert block["session_options"]["provider_options"] == [{"cuda": {"device_id": "1"}}]


def test_compose_draft_config_points_into_subfolders():
    draft = json.loads(json.dumps(BUILT))
    draft["model"]["decoder"]["hidden_size"] = 96
    composite = genai.compose_draft_config(BUILT, draft, k=4)
    assert composite["model"]["decoder"]["filename"] == "target/model.onnx"
    assert composite["model"]["draft"]["filename"] == "draft/model.onnx"
    assert composite["model"]["draft"]["hidden_size"] == 96
    assert composite["speculative"] == {"max_draft_tokens": 4}
    assert BUILT["model"]["decoder"]["filename"] == "model.onnx"  # inputs untouched
    assert ".." not in json.dumps(composite)  # genai refuses path traversal
    draft["model"]["vocab_size"] = 32000
    with pytest.raises(anchors_base.AnchorError, match="vocabulary"):
        genai.compose_draft_config(BUILT, draft)


def test_the_pad_id_is_one_greedy_never_emits():
    assert genai.unused_token_id(10, {9, 8}, avoid=[7]) == 6
    assert genai.unused_token_id(10, anchors_base.emitted_ids([[1, 9], [2]])) == 8
    with pytest.raises(anchors_base.AnchorError, match="pad id"):
        genai.unused_token_id(3, {0, 1, 2})


def test_speculative_options_per_mode():
    assert genai.speculative_options("greedy", 0) is None
    assert genai.speculative_options("ngram", 4) == {
        "ngram_size": 4, "max_draft_tokens": 4, "min_adaptive_k": 0, "cooldown": False}
    assert genai.speculative_options("draft", 2) == {
        "max_draft_tokens": 2, "min_adaptive_k": 0, "cooldown": False}
    assert genai.device_id("cuda:3") == 3 and genai.device_id("cuda") is None


def test_a_kept_anchor_dir_reuses_what_was_made_from_the_same_files(tmp_path, monkeypatch):
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text("{}")
    out = tmp_path / "genai" / "target"
    out.mkdir(parents=True)
    command = genai.builder_command(source, out, tmp_path / "cache", "cpu")
    made_from = anchors_base.fingerprint(source, extra=" ".join(command[1:]))
    assert not anchors_base.is_current(out, made_from)
    anchors_base.mark(out, made_from)
    (out / genai.BUILT_CONFIG).write_text("{}")
    assert anchors_base.is_current(out, made_from)

    def no_builder(*args, **kwargs):
        raise AssertionError("the builder ran again")
    monkeypatch.setattr(genai.subprocess, "run", no_builder)
    assert genai.build(source, out, tmp_path / "cache", "cpu") == (command, True)
    # the stamp is not part of the digest; any change of the source is
    assert anchors_base.fingerprint(out) == anchors_base.fingerprint(out)
    (source / "model.safetensors").write_bytes(b"x")
    assert not anchors_base.is_current(
        out, anchors_base.fingerprint(source, extra=" ".join(command[1:])))
    with pytest.raises(AssertionError, match="ran again"):
        genai.build(source, out, tmp_path / "cache", "cpu")


# -- the report: records and ratios on literal samples ----------------------------------------
def _result(runner, token_lists, per_repeat_s, ttft_s=0.001, counts=None):
    result = RunnerResult(runner)
    for total in per_repeat_s:
        result.samples.append([Sample(list(t), total, ttft_s, None, None, None)
                               for t in token_lists])
    result.counts = counts or []
    return result


def test_differences_from_greedy_name_each_prompt_and_its_first_token():
    greedy = _result(Runner(), [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]], [0.01])
    other = _result(Runner("chained", 4), [[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 9, 9]], [0.01])
    other.samples.append([Sample(list(t), 0.01, 0.001, None, None, None)  # a second repeat
                          for t in ([1, 2, 3, 4], [5, 6, 7, 0], [9, 0, 9, 9])])
    assert other.differences_from(greedy) == {1: 2, 2: 1}  # the earliest over repeats
    assert greedy.differences_from(greedy) == {}
    short = _result(Runner("chained", 4), [[1, 2], [5, 6, 7, 8], [9, 9, 9, 9]], [0.01])
    assert short.differences_from(greedy) == {0: 2}  # stopped early: differs where it ends


def test_anchor_records_and_ratios_on_literal_samples():
    tokens = [[1, 2, 3, 4], [5, 6, 7, 8]]
    greedy = _result(Runner(), tokens, [0.010, 0.012])
    lookup = _result(Runner("prompt_lookup", 2), tokens, [0.005, 0.006])
    theirs = AnchorRunner("hf", "greedy", 0, decode=None)
    their_lookup = AnchorRunner("hf", "prompt_lookup", 2, decode=None,
                                settings=hf.generate_options("prompt_lookup", 2))
    a_greedy = _result(theirs, tokens, [0.020, 0.024],
                       counts=[{"target_passes": 4}, {"target_passes": 4}])
    a_lookup = _result(their_lookup, [[1, 2, 3, 4], [5, 6, 7, 9]], [0.010, 0.010],
                       counts=[{"target_passes": 3}, {"target_passes": 3}])
    record = anchor_report.summarize_anchor(a_greedy, greedy, new_tokens=(4, 4))
    assert record["matches_greedy"] is True and record["decoded_every_token"] is True
    assert record["counterpart"] == "greedy" and record["target_passes"] == 8
    assert record["tokens_per_round"] == 1.0  # 6 tokens after the first over 6 passes
    # 4 tokens in 0.010 s per prompt → decode (0.010 − 0.001) s for 3 tokens
    assert record["decode_tokens_per_s"]["values"][0] == pytest.approx(6 / 0.038)
    assert record["total_ms_per_prompt"]["values"] == [20.0, 24.0]
    mismatch = anchor_report.summarize_anchor(a_lookup, greedy, new_tokens=(4, 4))
    assert mismatch["matches_greedy"] is False and mismatch["tokens_per_round"] == 1.5

    ours = [greedy, lookup]
    ours_records = [{"name": r.runner.name, "decoded_every_token": True,
                     "matches_greedy": None if r is greedy else True,
                     "decode_tokens_per_s": r.per_repeat(
                         lambda s: sum(len(x.token_ids) - 1 for x in s)
                         / sum(x.decode_s for x in s)).as_dict(),
                     "end_to_end_tokens_per_s": r.per_repeat(
                         lambda s: sum(len(x.token_ids) for x in s)
                         / sum(x.total_s for x in s)).as_dict()}
                    for r in ours]
    ratios = anchor_report.ratios(ours, ours_records, [a_greedy, a_lookup], [record, mismatch])
    pair = ratios["per_mode"][0]
    assert (pair["speculant"], pair["anchor"]) == ("greedy", "hf greedy")
    assert pair["end_to_end_tokens_per_s"]["ratio"] == pytest.approx(2.0)
    assert pair["end_to_end_tokens_per_s"]["per_repeat"]["values"] == pytest.approx([2, 2])
    assert mismatch["prompts_equal_to_greedy"] == "1/2"
    assert record["prompts_equal_to_greedy"] == "2/2"
    best = ratios["best"][0]["end_to_end_tokens_per_s"]
    # an anchor's tokens may differ (float16 near-ties): it still counts, and says so
    assert (best["speculant"], best["anchor"]) == ("prompt_lookup k=2", "hf prompt_lookup k=2")
    # medians over the repeats: (8/0.010 + 8/0.012) / 2 against 8/0.020
    assert best["ratio"] == pytest.approx((800 + 8 / 0.012) / 2 / 400)
    assert best["anchor_matches_greedy"] is False
    assert ratios["per_mode"][1]["anchor_matches_greedy"] is False
    # an anchor that did not decode every token never stands for its runtime
    short = _result(their_lookup, [[1, 2, 3], [5, 6, 7]], [0.002, 0.002])
    short_record = anchor_report.summarize_anchor(short, greedy, new_tokens=(4, 4))
    ratios = anchor_report.ratios(ours, ours_records, [a_greedy, short], [record, short_record])
    assert ratios["best"][0]["end_to_end_tokens_per_s"]["anchor"] == "hf greedy"


def test_markdown_names_anchors_ratios_and_skips():
    spread = {"median": 100.0, "q1": 100.0, "q3": 100.0, "min": 90.0, "max": 110.0,
              "values": [90.0, 110.0]}
    ratio = {"ratio": 1.5, "per_repeat": {**spread, "min": 1.4, "max": 1.6}}
    record = {"name": "genai ngram k=2", "runtime": "genai", "mode": "ngram", "k": 2,
              "counterpart": "prompt_lookup k=2", "decode_tokens_per_s": spread,
              "end_to_end_tokens_per_s": spread, "time_to_first_token_ms": spread,
              "decode_ms_per_prompt": spread, "total_ms_per_prompt": spread,
              "tokens_per_prompt": [4], "decoded_every_token": True, "matches_greedy": False,
              "prompts_equal_to_greedy": "3/4",
              "target_passes": None, "draft_passes": None, "tokens_per_round": 2.5,
              "genai_stats": {"rounds": 3, "draft_tokens_accepted": 4}}
    report = {"anchors": {
        "requested": ["hf", "genai"], "runners": [record],
        "runtimes": {"genai": {"versions": {"onnxruntime-genai": "0.18.0"}, "precision": "fp32",
                               "config_patch": {"intra_op_num_threads": 1, "eos_token_id": [],
                                                "pad_token_id": 4095},
                               "ngram_size": 4, "lm_head_check": "ok"}},
        "skipped": [{"name": "hf (every mode)", "runtime": "hf",
                     "reason": "torch is not installed"}],
        "ratios": {"per_mode": [{"anchor": "genai ngram k=2", "speculant": "prompt_lookup k=2",
                                 "decode_tokens_per_s": ratio,
                                 "end_to_end_tokens_per_s": None}],
                   "best": [{"runtime": "genai",
                             "decode_tokens_per_s": {"speculant": "draft k=2",
                                                     "anchor": "genai ngram k=2", **ratio},
                             "end_to_end_tokens_per_s": {"speculant": "greedy",
                                                         "anchor": "genai ngram k=2", **ratio}}]},
    }}
    text = "\n".join(anchor_report.markdown(report))
    assert "| genai ngram k=2 | prompt_lookup k=2 | 100 [90–110] |" in text
    assert "| NO (3/4 prompts equal) | yes |" in text
    assert "| best vs genai best | draft k=2 | genai ngram k=2 | 1.50× [1.40–1.60] |" in text
    assert "(greedy ÷ genai ngram k=2)" in text  # the end-to-end best is another pair
    assert "| same mode | prompt_lookup k=2 | genai ngram k=2 | 1.50× [1.40–1.60] | – |" in text
    assert "- hf (every mode): torch is not installed" in text
    assert "pad_token_id 4095" in text and "rounds 3, draft_tokens_accepted 4" in text
    assert anchor_report.markdown({}) == []


# -- skipping, end to end, with the packages made to look absent -------------------------------
def test_a_missing_anchor_is_skipped_with_its_reason_and_the_run_goes_on(pair_path,
                                                                         monkeypatch):
    monkeypatch.setattr(anchors_base, "missing_modules",
                        lambda anchor, find_spec=None, **_: ["transformers"])
    notes = []
    setup = prepare_anchors(("hf", "genai"), package=pair_path, draft=None, device="cpu",
                            threads=1, proposers=("prompt_lookup",), ks=(2,),
                            reference=[[1, 2]], check_prompt=[1, 2], note=notes.append)
    assert setup.runners == []
    assert [s["runtime"] for s in setup.skipped] == ["hf", "genai"]
    assert all("transformers is not installed" in s["reason"] for s in setup.skipped)
    assert any("skipping the hf anchor" in n for n in notes)

    run = run_bench(BenchConfig(pair_path, new_tokens=4, warmup=0, repeats=2, threads=1,
                                proposers=("prompt_lookup",), ks=(2,), width_repeats=2,
                                anchors=("hf",)))
    report = summarize(run, "speculant bench --anchors hf")
    assert report["anchors"]["runners"] == []
    assert "transformers is not installed" in report["anchors"]["skipped"][0]["reason"]
    assert "Anchors skipped:" in markdown(report)


def test_a_failing_mode_is_skipped_with_the_runtime_error(pair_path, monkeypatch):
    """A mode whose first decode raises is dropped with the exact error, the others kept."""
    def fake_prepare(setup, **_):
        def works(prompt, n, count=False):
            return AnchorDecode([0] * n, 0.01, 0.001)

        def fails(prompt, n, count=False):
            raise RuntimeError("ngram_size must be 0 or between 2 and 16")
        setup.runners += [AnchorRunner("hf", "greedy", 0, works),
                          AnchorRunner("hf", "prompt_lookup", 2, fails)]

    monkeypatch.setattr(anchors_base, "missing_modules", lambda anchor, find_spec=None, **_: [])
    monkeypatch.setattr("speculant_bench.anchors._checkpoints",
                        lambda package, draft, work: (work / "t", None))
    monkeypatch.setattr(hf, "prepare", fake_prepare)
    setup = prepare_anchors(("hf",), package=pair_path, draft=None, device="cpu", threads=1,
                            proposers=("prompt_lookup",), ks=(2,), reference=[[1]],
                            check_prompt=[1], note=lambda message: None)
    assert [r.name for r in setup.runners] == ["hf greedy"]
    assert setup.skipped == [{"name": "hf prompt_lookup k=2", "runtime": "hf",
                              "reason": "RuntimeError: ngram_size must be 0 or between 2 and "
                                        "16"}]
    setup.close()


def test_the_cli_refuses_an_unknown_anchor():
    result = CliRunner().invoke(app, ["bench", "--anchors", "hf,vllm"])
    assert result.exit_code == 2 and "unknown anchor 'vllm'" in result.output


# -- the anchors themselves (optional packages) --------------------------------------------------
def _needs(*modules):
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is not installed (optional: the "
                                           "anchors extra)")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    items = json.loads((DEMO / "val_prompts.json").read_text())["prompts"][:2]
    path = tmp_path_factory.mktemp("anchors") / "prompts.json"
    path.write_text(json.dumps([item["prompt"] for item in items]))
    return path


def _anchor_run(prompts_file, tmp_path, anchor):
    run = run_bench(BenchConfig(DEMO, draft=DEMO_DRAFT, prompts_file=prompts_file,
                                new_tokens=12, warmup=0, repeats=2, threads=1,
                                proposers=("draft", "prompt_lookup"), ks=(2,),
                                width_repeats=2, anchors=(anchor,), anchor_dir=tmp_path))
    return summarize(run, f"speculant bench --anchors {anchor}")


def _check_anchor_report(report, runtime, modes):
    section = report["anchors"]
    assert section["skipped"] == []
    records = section["runners"]
    assert [(r["mode"], r["k"]) for r in records] == modes
    for record in records:
        assert record["runtime"] == runtime
        assert record["decoded_every_token"] and record["tokens_per_prompt"] == [12, 12]
        assert record["matches_greedy"] is True, record["name"]
        assert record["decode_tokens_per_s"]["median"] > 0
        assert record["time_to_first_token_ms"]["median"] > 0
    ratios = section["ratios"]
    assert len(ratios["per_mode"]) == len(records)
    assert all(row["decode_tokens_per_s"]["ratio"] > 0 for row in ratios["per_mode"])
    assert ratios["best"][0]["runtime"] == runtime


def test_transformers_decodes_the_same_tokens_in_the_same_run(prompts_file, tmp_path):
    _needs("torch", "transformers", "safetensors")
    report = _anchor_run(prompts_file, tmp_path, "hf")
    _check_anchor_report(report, "hf", [("greedy", 0), ("prompt_lookup", 2), ("assisted", 2)])
    records = {r["mode"]: r for r in report["anchors"]["runners"]}
    assert records["greedy"]["target_passes"] == 2 * 12  # prefill + 11 steps per prompt
    assert records["assisted"]["draft_passes"] > 0
    assert report["anchors"]["runtimes"]["hf"]["torch_threads"] == 1


def test_onnxruntime_genai_decodes_the_same_tokens_in_the_same_run(prompts_file, tmp_path):
    _needs("onnxruntime_genai", "onnx_ir", "torch", "transformers", "safetensors")
    report = _anchor_run(prompts_file, tmp_path, "genai")
    _check_anchor_report(report, "genai", [("greedy", 0), ("ngram", 2), ("draft", 2)])
    runtime = report["anchors"]["runtimes"]["genai"]
    assert runtime["config_patch"]["intra_op_num_threads"] == 1
    written = json.loads((tmp_path / "genai" / "target" / "genai_config.json").read_text())
    assert written["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 1
    assert written["model"]["eos_token_id"] == []
    composite = json.loads((tmp_path / "genai" / "genai_config.json").read_text())
    assert composite["model"]["draft"]["filename"] == "draft/model.onnx"
    stats = {r["mode"]: r["genai_stats"] for r in report["anchors"]["runners"]}
    assert stats["draft"]["draft_forward_passes"] > 0
    assert runtime["reused_builds"] == []
    again = _anchor_run(prompts_file, tmp_path, "genai")  # the kept folder is reused
    assert again["anchors"]["runtimes"]["genai"]["reused_builds"] == ["target", "draft"]
    assert all(r["matches_greedy"] for r in again["anchors"]["runners"])
