"""The bench's k = auto runners, its verify-width curve's block sizes, its --chat prompts and
the genai anchor on a prebuilt folder (--genai-model): the option logic, checked without
onnxruntime-genai, torch or a real model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import speculant
from builders import encode
from speculant.cli import full_app
from speculant.errors import RequestError
from speculant_bench import BenchConfig, run_bench
from speculant_bench.anchors import AnchorDecode, AnchorRunner, genai, prepare_anchors
from speculant_bench.anchors import base as anchors_base
from speculant_bench.anchors.base import AnchorError
from speculant_bench.prompts import read_prompts
from speculant_bench.runners import Runner, fixed_widths, parse_widths

app = full_app()

BUILT = {"model": {"vocab_size": 4096, "eos_token_id": 0, "pad_token_id": 0, "type": "llama",
                   "decoder": {"filename": "model.onnx", "session_options": {}}},
         "search": {"do_sample": False, "max_length": 512}}


# -- k = auto ----------------------------------------------------------------------------------
def test_widths_parse_as_integers_or_auto():
    assert parse_widths(["1", "4", "AUTO", "4", " 2 "]) == (1, 4, "auto", 2)
    for bad in ("0", "-1", "x", "2.5", ""):
        with pytest.raises(ValueError, match="neither a width"):
            parse_widths([bad])
    assert fixed_widths((1, "auto", 4)) == [1, 4]


def test_the_cli_refuses_a_k_that_is_not_a_width():
    result = CliRunner().invoke(app, ["bench", "--k", "0"])
    assert result.exit_code == 2 and "--k" in result.output and "auto" in result.output


def test_an_auto_runner_decodes_greedy_tokens_beside_the_fixed_ones(pair_path, tmp_path):
    run = run_bench(BenchConfig(pair_path, new_tokens=8, warmup=0, repeats=2, threads=1,
                                proposers=("chained",), ks=(2, "auto"), width_repeats=2))
    names = [result.runner.name for result in run.results]
    assert names == ["greedy", "chained k=2", "chained k=auto"]
    greedy = run.results[0].samples[-1]
    for result in run.results[1:]:
        assert [s.token_ids for s in result.samples[-1]] == [s.token_ids for s in greedy]
    from rich.console import Console

    from speculant_bench.command import write_report
    from speculant_bench.report import summarize

    report = summarize(run, "speculant bench --k 2 --k auto")
    assert report["config"]["k"] == [2, "auto"]
    write_report(report, tmp_path, Console(file=open(tmp_path / "log", "w")))  # noqa: SIM115
    assert (tmp_path / "bench.md").is_file()  # the plots skip auto's row on the k axis
    assert "warning" not in (tmp_path / "log").read_text()
    # a runner that left greedy on one prompt: the table and the console name how many and where
    report["runners"][1].update(matches_greedy=False, prompts_differing_from_greedy={"1": 5})
    with open(tmp_path / "log2", "w") as log:
        write_report(report, tmp_path / "planted", Console(file=log, width=200))
    assert "matches greedy: False (prompt: first differing token {'1': 5})" in \
        (tmp_path / "log2").read_text()
    prompts = len(report["runners"][1]["tokens_per_prompt"])
    assert f"| NO (1 of {prompts} prompts) |" in (tmp_path / "planted" / "bench.md").read_text()


def test_genai_auto_is_its_adaptive_width_paired_with_speculant_auto():
    assert genai.speculative_options("ngram", "auto") == {
        "ngram_size": genai.NGRAM_SIZE, "max_draft_tokens": genai.ADAPTIVE_MAX_DRAFT_TOKENS,
        "min_adaptive_k": 1}
    assert genai.speculative_options("draft", "auto")["min_adaptive_k"] == 1
    assert ("ngram", "auto", "target") in genai.runner_modes(("prompt_lookup",), (2, "auto"),
                                                              False, "cpu")
    runner = AnchorRunner("genai", "ngram", "auto", decode=None)
    assert runner.name == "genai ngram k=auto"
    assert runner.counterpart == Runner("prompt_lookup", "auto")


# -- --verify-widths ---------------------------------------------------------------------------
def test_the_verify_width_curve_times_the_block_sizes_asked_for(pair_path, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "bench", str(pair_path), "--proposer", "prompt_lookup", "--k", "2", "--new-tokens", "4",
        "--warmup", "0", "--repeats", "2", "--threads", "1", "--verify-widths", "5",
        "--verify-widths", "1", "--verify-widths", "5", "--width-repeats", "2", "--out",
        str(out)])
    assert result.exit_code == 0, result.output
    curve = json.loads((out / "bench.json").read_text())["verify_width"]
    assert [w["width"] for w in curve["widths"]] == [1, 5] and curve["repeats"] == 2
    assert all(len(w["pass_ms"]["values"]) == 2 for w in curve["widths"])


def test_the_cli_refuses_a_block_size_below_one():
    result = CliRunner().invoke(app, ["bench", "--verify-widths", "0"])
    assert result.exit_code == 2 and "--verify-widths" in result.output


# -- --chat ------------------------------------------------------------------------------------
def test_chat_prompts_are_rendered_before_they_are_encoded(tmp_path, pair_path):
    tokenizer = speculant.load(pair_path).tokenizer
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(["f(x)", [3, 4]]))
    _, prompts = read_prompts(path, tokenizer, lambda text: f"def {text}:")
    assert prompts == [encode("def f(x):"), [3, 4]]  # token ids are taken as they are


def test_chat_on_a_package_without_a_chat_template_names_the_problem(pair_path):
    with pytest.raises(RequestError, match="no chat template"):
        run_bench(BenchConfig(pair_path, chat=True, new_tokens=4, warmup=0, repeats=2))


# -- --genai-model -----------------------------------------------------------------------------
def _prebuilt(folder, config=BUILT, *, kept: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(b"graph")
    (folder / "genai_config.json").write_text(json.dumps(config))
    if kept is not None:  # what an earlier bench run keeps beside its patched config
        (folder / genai.BUILT_CONFIG).write_text(json.dumps(kept))
    return folder


def test_a_prebuilt_folder_is_read_and_refused_with_the_reason(tmp_path):
    assert genai.read_prebuilt(_prebuilt(tmp_path / "built")) == BUILT
    patched = json.loads(json.dumps(BUILT))
    patched["model"]["eos_token_id"] = []
    kept = _prebuilt(tmp_path / "kept", patched, kept=BUILT)
    assert genai.read_prebuilt(kept) == BUILT  # the builder's own config, not the patch
    with pytest.raises(AnchorError, match=r"empty holds no genai_config\.json"):
        genai.read_prebuilt(tmp_path / "empty")
    (tmp_path / "built" / "model.onnx").unlink()
    with pytest.raises(AnchorError, match="names the decoder 'model.onnx'"):
        genai.read_prebuilt(tmp_path / "built")


def test_a_prebuilt_folder_needs_only_onnxruntime_genai():
    def only(*present):
        return lambda name: object() if name in present else None

    assert anchors_base.why_missing("genai", only("onnxruntime_genai"), prebuilt=True) is None
    assert "torch" in anchors_base.why_missing("genai", only("onnxruntime_genai"))
    reason = anchors_base.why_missing("genai", only(), prebuilt=True)
    assert reason.startswith("onnxruntime-genai anchor skipped: onnxruntime_genai is not")


def test_a_prebuilt_folder_skips_the_checkpoint_and_reaches_genai(tmp_path, monkeypatch):
    folder = _prebuilt(tmp_path / "built")
    seen = {}

    def no_export(package, draft, work):
        raise AssertionError("a prebuilt genai folder needs no checkpoint")

    def fake_prepare(setup, **kwargs):
        seen.update(kwargs)
        setup.runners.append(AnchorRunner("genai", "greedy", 0,
                                          lambda p, n, count=False: AnchorDecode([0] * n, 1, 0)))

    monkeypatch.setattr(anchors_base, "missing_modules", lambda anchor, find_spec=None, *,
                        prebuilt=False: [] if prebuilt else ["torch"])
    monkeypatch.setattr("speculant_bench.anchors._checkpoints", no_export)
    monkeypatch.setattr(genai, "prepare", fake_prepare)
    setup = prepare_anchors(("genai",), package=tmp_path, draft=tmp_path / "draft",
                            device="cpu", threads=1, proposers=("draft", "prompt_lookup"),
                            ks=(4,), reference=[[1]], check_prompt=[1], work=tmp_path / "w",
                            note=lambda message: None, genai_model=folder)
    assert seen["prebuilt"] == folder and seen["target_hf"] is None
    assert [r.name for r in setup.runners] == ["genai greedy"]
    assert setup.skipped == [{"name": "genai draft (every k)", "runtime": "genai",
                              "reason": "a prebuilt genai folder (--genai-model) is the target "
                                        "alone; genai's draft mode needs both built here"}]


@pytest.mark.parametrize(("arguments", "words"), [
    (["--genai-model", "{folder}"], "add --anchors genai"),
    (["--anchors", "genai", "--genai-model", "{empty}"], "holds no genai_config.json"),
])
def test_the_cli_checks_the_prebuilt_folder_before_loading(tmp_path, arguments, words):
    folder, empty = _prebuilt(tmp_path / "built"), tmp_path / "empty"
    empty.mkdir()
    argv = ["bench", *(a.format(folder=folder, empty=empty) for a in arguments)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and words in result.output and "--genai-model" in result.output
