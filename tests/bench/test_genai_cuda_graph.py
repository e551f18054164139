"""onnxruntime-genai's CUDA-graph option as additional anchor runners: the configs it writes
and the runners it adds, checked without genai (it is not installed here)."""

from __future__ import annotations

import json

import pytest

from speculant_bench.anchors import AnchorRunner, genai
from speculant_bench.anchors.base import AnchorError

CUDA_BUILT = {  # what the builder writes for -e cuda (trimmed)
    "model": {"vocab_size": 4096, "eos_token_id": 0, "pad_token_id": 0, "type": "llama",
              "decoder": {"filename": "model.onnx", "session_options": {
                  "log_id": "onnxruntime-genai",
                  "provider_options": [{"cuda": {"enable_skip_layer_norm_strict_mode": "1"}}]}}},
    "search": {"do_sample": False, "max_length": 512, "past_present_share_buffer": False},
}


def test_the_cuda_graph_config_turns_capture_on_in_every_decoder():
    composite = genai.compose_draft_config(CUDA_BUILT, CUDA_BUILT, k=4)
    original = json.dumps(composite)
    config = genai.cuda_graph_config(composite)
    assert json.dumps(composite) == original  # a copy
    for block in (config["model"]["decoder"], config["model"]["draft"]):
        assert block["session_options"]["provider_options"] == [
            {"cuda": {"enable_skip_layer_norm_strict_mode": "1", "enable_cuda_graph": "1"}}]
    assert config["search"]["past_present_share_buffer"] is True
    assert config["model"]["decoder"]["filename"] == "target/model.onnx"


def test_a_config_without_the_cuda_provider_cannot_capture():
    cpu = json.loads(json.dumps(CUDA_BUILT))
    cpu["model"]["decoder"]["session_options"]["provider_options"] = []
    with pytest.raises(AnchorError, match="CUDA provider"):
        genai.cuda_graph_config(cpu)


def test_the_variant_folder_links_the_built_files(tmp_path):
    built = tmp_path / "genai" / "target"
    built.mkdir(parents=True)
    (built / "model.onnx").write_bytes(b"graph")
    (built / "model.onnx.data").write_bytes(b"weights")
    (built / "genai_config.json").write_text(json.dumps(CUDA_BUILT))
    (built / genai.BUILT_CONFIG).write_text(json.dumps(CUDA_BUILT))
    (built / ".speculant-source").write_text("stamp")
    config = genai.cuda_graph_config(CUDA_BUILT)
    for _ in range(2):  # a kept --anchor-dir: written again over the old links
        folder = genai.link_variant(built, tmp_path / "genai" / "target-cuda-graph", config)
    assert sorted(p.name for p in folder.iterdir()) == ["genai_config.json", "model.onnx",
                                                        "model.onnx.data"]
    assert (folder / "model.onnx").is_symlink()
    assert (folder / "model.onnx.data").read_bytes() == b"weights"
    written = json.loads((folder / "genai_config.json").read_text())
    cuda = written["model"]["decoder"]["session_options"]["provider_options"][0]["cuda"]
    assert cuda["enable_cuda_graph"] == "1"
    assert json.loads((built / "genai_config.json").read_text()) == CUDA_BUILT  # untouched


def test_the_composite_variant_links_both_subfolders(tmp_path):
    root = tmp_path / "genai"
    for name in ("target", "draft"):
        (root / name).mkdir(parents=True)
        (root / name / "model.onnx").write_bytes(name.encode())
    composite = genai.compose_draft_config(CUDA_BUILT, CUDA_BUILT, k=2)
    folders = genai.cuda_graph_folders(root, CUDA_BUILT, composite)
    assert set(folders) == {"target+cuda_graph", "composite+cuda_graph"}
    graph = folders["composite+cuda_graph"]
    assert (graph / "draft" / "model.onnx").read_bytes() == b"draft"
    assert ".." not in (graph / "genai_config.json").read_text()  # genai refuses traversal


def test_cuda_graph_runners_sit_beside_the_default_ones_on_cuda_only():
    cpu = genai.runner_modes(["prompt_lookup", "draft"], [1, 4], True, "cpu")
    assert cpu == [("greedy", 0, "target"), ("ngram", 1, "target"), ("ngram", 4, "target"),
                   ("draft", 1, "composite"), ("draft", 4, "composite")]
    cuda = genai.runner_modes(["prompt_lookup", "draft"], [1, 4], True, "cuda:0")
    assert cuda[:5] == cpu
    assert cuda[5:] == [(mode, k, which + "+cuda_graph") for mode, k, which in cpu]
    assert genai.runner_modes([], [4], False, "cuda") == [
        ("greedy", 0, "target"), ("greedy", 0, "target+cuda_graph")]


def test_a_cuda_graph_runner_is_named_and_paired_as_its_mode():
    runner = AnchorRunner("genai", "ngram", 4, decode=None,
                          settings={"enable_cuda_graph": "1"}, variant=genai.CUDA_GRAPH)
    assert runner.name == "genai ngram k=4 (cuda graph)"
    assert runner.counterpart.name == AnchorRunner("genai", "ngram", 4, None).counterpart.name
    assert AnchorRunner("genai", "greedy", 0, None).name == "genai greedy"
