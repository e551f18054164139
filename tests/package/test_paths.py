"""Path confinement P1–P3 (metadata.md §2.3) and tokenizer resolution (§2.4)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from package_builders import WF, base, build_graph, mutated, setv, write_package

from speculant.errors import AdmissionError, MetadataError
from speculant.package import load_package

ARTIFACT = f"{WF}.components.decoder.implementation.artifact"


def load_error(root: Path, kind: type = MetadataError):
    with pytest.raises(kind) as info:
        load_package(root)
    return info.value


def only_problem_at(error, path: str, rule: str = "4"):
    hits = [p for p in error.problems if p.path == path]
    assert len(hits) == 1, error
    assert {p.kind for p in error.problems} == {type(error)}
    assert hits[0].rule == rule  # P1-P3 are rule 4 of metadata.md §6
    return hits[0]


def test_artifact_missing(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"), graphs={"decoder": None})
    problem = only_problem_at(load_error(tmp_path), ARTIFACT)
    assert "artifact 'decoder/model.onnx' does not exist" in problem.message


def test_artifact_absolute(tmp_path: Path) -> None:
    outside = tmp_path / "outside.onnx"
    onnx.save(build_graph(base("greedy"), "decoder"), str(outside))
    write_package(tmp_path / "pkg", setv(base("greedy"), ARTIFACT, str(outside)))
    problem = only_problem_at(load_error(tmp_path / "pkg"), ARTIFACT)
    assert "is absolute" in problem.message and problem.value == str(outside)


def test_artifact_with_dotdot(tmp_path: Path) -> None:
    onnx.save(build_graph(base("greedy"), "decoder"), str(tmp_path / "outside.onnx"))
    write_package(tmp_path / "pkg", setv(base("greedy"), ARTIFACT, "decoder/../../outside.onnx"))
    problem = only_problem_at(load_error(tmp_path / "pkg"), ARTIFACT)
    assert "'..' component" in problem.message


def test_artifact_through_an_escaping_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "model.onnx"
    outside.parent.mkdir()
    onnx.save(build_graph(base("greedy"), "decoder"), str(outside))
    root = tmp_path / "pkg"
    write_package(root, base("greedy"), graphs={"decoder": None})
    (root / "decoder").mkdir()
    os.symlink(outside, root / "decoder" / "model.onnx")
    problem = only_problem_at(load_error(root), ARTIFACT)
    assert "outside the package folder" in problem.message


def test_artifact_through_an_escaping_folder_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    onnx.save(build_graph(base("greedy"), "decoder"), str(outside / "model.onnx"))
    root = tmp_path / "pkg"
    write_package(root, base("greedy"), graphs={"decoder": None})
    os.symlink(outside, root / "decoder")
    assert "outside the package folder" in only_problem_at(load_error(root), ARTIFACT).message


def test_symlink_inside_the_root_is_accepted(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    write_package(root, base("greedy"), graphs={"decoder": None})
    (root / "store").mkdir()
    onnx.save(build_graph(base("greedy"), "decoder"), str(root / "store" / "decoder.onnx"))
    (root / "decoder").mkdir()
    os.symlink(root / "store" / "decoder.onnx", root / "decoder" / "model.onnx")
    package = load_package(root)
    assert package.artifacts["decoder"] == root.resolve() / "store" / "decoder.onnx"


def test_artifact_not_a_regular_file(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"), graphs={"decoder": None})
    (tmp_path / "decoder" / "model.onnx").mkdir(parents=True)
    assert "not a regular file" in only_problem_at(load_error(tmp_path), ARTIFACT).message


def test_bad_artifact_extension(tmp_path: Path) -> None:
    write_package(tmp_path, setv(base("greedy"), ARTIFACT, "decoder/model.pt"))  # exists
    problem = only_problem_at(load_error(tmp_path), ARTIFACT)
    assert "neither .onnx nor .onnx.textproto" in problem.message


# -- tokenizer (§2.4) ----------------------------------------------------------------------
def test_declared_tokenizer_missing(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"), tokenizer=False)
    problem = only_problem_at(load_error(tmp_path), "package.tokenizer.artifacts.0.location")
    assert "tokenizer artifact 'tokenizer.json' does not exist" in problem.message


def test_declared_tokenizer_escaping(tmp_path: Path) -> None:
    (tmp_path / "tok.json").write_text("{}")
    root = tmp_path / "pkg"
    write_package(root, base("greedy"), tokenizer=False)
    os.symlink(tmp_path / "tok.json", root / "tokenizer.json")
    problem = only_problem_at(load_error(root), "package.tokenizer.artifacts.0.location")
    assert "outside the package folder" in problem.message


def test_chat_template_file_escaping(tmp_path: Path) -> None:
    # tokenizer_config.json (the chat template) is confined like every other package file
    (tmp_path / "outside.json").write_text('{"chat_template": "{{ messages }}"}')
    root = tmp_path / "pkg"
    write_package(root, base("greedy"))
    os.symlink(tmp_path / "outside.json", root / "tokenizer_config.json")
    problem = only_problem_at(load_error(root), "package.tokenizer")
    assert "chat template file 'tokenizer_config.json' resolves to" in problem.message
    assert "outside the package folder" in problem.message
    assert "copy tokenizer_config.json into the package folder" in problem.remedy
    assert "Remedy: copy tokenizer_config.json" in str(load_error(root))


def test_chat_template_file_dangling_or_not_a_file(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"))
    os.symlink(tmp_path / "gone.json", tmp_path / "tokenizer_config.json")  # dangling
    assert "does not exist" in only_problem_at(load_error(tmp_path), "package.tokenizer").message
    os.unlink(tmp_path / "tokenizer_config.json")
    os.mkfifo(tmp_path / "tokenizer_config.json")  # reading it would block
    problem = only_problem_at(load_error(tmp_path), "package.tokenizer")
    assert "is not a regular file" in problem.message


def test_chat_template_file_inside_the_root_is_accepted(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"))
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "config.json").write_text('{"chat_template": "{{ messages }}"}')
    os.symlink(tmp_path / "store" / "config.json", tmp_path / "tokenizer_config.json")
    assert load_package(tmp_path).tokenizer_file == tmp_path.resolve() / "tokenizer.json"


def test_sole_declared_tokenizer_with_another_name(tmp_path: Path) -> None:
    doc = setv(base("greedy"), "package.tokenizer.artifacts", [{"location": "tok/vocab.json"}])
    write_package(tmp_path, doc, tokenizer=False)
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.json").write_text("{}")
    assert load_package(tmp_path).tokenizer_file == tmp_path.resolve() / "tok" / "vocab.json"


def test_tokenizer_json_preferred_among_several(tmp_path: Path) -> None:
    doc = setv(base("greedy"), "package.tokenizer.artifacts",
               [{"location": "merges.txt"}, {"location": "tokenizer.json"}])
    write_package(tmp_path, doc)
    (tmp_path / "merges.txt").write_text("")
    assert load_package(tmp_path).tokenizer_file == tmp_path.resolve() / "tokenizer.json"


def test_undeclared_tokenizer_found_beside_the_metadata(tmp_path: Path) -> None:
    doc = base("greedy")
    del doc["package"]
    write_package(tmp_path, doc)
    assert load_package(tmp_path).tokenizer_file == tmp_path.resolve() / "tokenizer.json"


def test_no_tokenizer_loads(tmp_path: Path) -> None:
    doc = base("greedy")
    del doc["package"]
    write_package(tmp_path, doc, tokenizer=False)
    assert load_package(tmp_path).tokenizer_file is None


# -- external data inside binary models ------------------------------------------------------
def with_external_table(location: str) -> onnx.ModelProto:
    doc = base("greedy")
    model = build_graph(doc, "decoder",
                        initializers={"bias": np.zeros((4,), np.float32)})
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return model


@pytest.mark.parametrize(("location", "words"), [
    ("../../weights.bin", "'..' component"),
    ("/etc/weights.bin", "is absolute"),
    ("missing.bin", "does not exist"),
])
def test_external_data_location_confined(tmp_path: Path, location: str, words: str) -> None:
    write_package(tmp_path, base("greedy"), graphs={"decoder": with_external_table(location)})
    problem = only_problem_at(load_error(tmp_path), ARTIFACT)
    assert "external data of initializer 'bias'" in problem.message and words in problem.message
    assert problem.file.endswith("model.onnx")


def test_external_data_beside_the_model_is_accepted(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"), graphs={"decoder": with_external_table("w.bin")})
    (tmp_path / "decoder" / "w.bin").write_bytes(bytes(16))
    assert load_package(tmp_path).graphs["decoder"].graph.initializer[0].name == "bias"


def test_hard_linked_external_data_is_refused_at_load(tmp_path: Path) -> None:
    """ONNX refuses to read an external-data file with more than one link (a possible
    hard-link attack), first when the chain reads its table, mid-request: load says so."""
    write_package(tmp_path / "p", base("greedy"),
                  graphs={"decoder": with_external_table("w.bin")})
    data = tmp_path / "p" / "decoder" / "w.bin"
    data.write_bytes(bytes(16))
    os.link(data, tmp_path / "elsewhere.bin")
    problem = only_problem_at(load_error(tmp_path / "p"), ARTIFACT)
    assert "2 hard links" in problem.message and problem.value == "w.bin"
    assert "copy the file" in problem.remedy and problem.file.endswith("model.onnx")
    (tmp_path / "elsewhere.bin").unlink()  # one link again: it loads
    assert load_package(tmp_path / "p").graphs["decoder"].graph.initializer[0].name == "bias"


def test_external_data_in_a_textproto(tmp_path: Path) -> None:
    doc = setv(base("greedy"), ARTIFACT, "decoder/model.onnx.textproto")
    write_package(tmp_path, doc, graphs={"decoder": with_external_table("w.bin")})
    problem = only_problem_at(load_error(tmp_path, AdmissionError), ARTIFACT, rule="A1")
    assert "references external data" in problem.message


def test_paths_reported_with_document_problems(tmp_path: Path) -> None:
    doc = mutated("greedy", ("set", f"{WF}.serving.state_service.groups.attention.layout", ""))
    write_package(tmp_path, doc, graphs={"decoder": None})
    error = load_error(tmp_path)
    assert {ARTIFACT, f"{WF}.serving.state_service.groups.attention.layout"} <= set(error.paths)
