"""Admission against the ONNX graphs (metadata.md §7, A1–A8), on tiny graphs built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from package_builders import WF, at, base, build_graph, default_initializers, setv, write_package

from speculant.errors import AdmissionError
from speculant.package import load_package

PE = "speculative.proposal_execution"
TARGET_ARTIFACT = f"{WF}.components.target.implementation.artifact"


def admission_error(root: Path) -> AdmissionError:
    with pytest.raises(AdmissionError) as info:
        load_package(root)
    assert {p.kind for p in info.value.problems} == {AdmissionError}
    return info.value


def problem_at(error: AdmissionError, path: str):
    hits = [p for p in error.problems if p.path == path]
    assert hits, error
    return hits[0]


def target_graph(doc: dict, **kwargs):
    return build_graph(doc, "target", initializers=kwargs.pop(
        "initializers", default_initializers(doc, "target")), **kwargs)


# -- valid packages --------------------------------------------------------------------------
def test_greedy_package_loads(tmp_path: Path) -> None:
    package = load_package(write_package(tmp_path, base("greedy")))
    assert package.plan.target == "decoder" and package.embedding_width is None
    assert package.root == tmp_path.resolve()
    assert package.metadata_file.name == "inference_metadata.yaml"
    assert set(package.graphs) == {"decoder"}
    assert package.model_source("decoder") == str(tmp_path.resolve() / "decoder/model.onnx")


def test_chained_package_loads_with_a_textproto_proposer(tmp_path: Path) -> None:
    doc = setv(base("chained"), f"{WF}.components.assistant.implementation.artifact",
               "assistant/model.onnx.textproto")
    package = load_package(write_package(tmp_path, doc))
    assert package.embedding_width == 16
    assert package.plan.chain is not None and package.plan.chain.kv_symbol == "kv_sequence"
    assert isinstance(package.model_source("assistant"), bytes)


def test_unbound_graph_input_with_an_initializer_default(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", extra_inputs={
        "temperature": {"dtype": "float32", "rank": 1, "shape": [1]}},
        initializers={"temperature": np.ones((1,), np.float32)})
    load_package(write_package(tmp_path, doc, graphs={"decoder": graph}))


# -- A1 --------------------------------------------------------------------------------------
def test_textproto_that_is_not_a_model(tmp_path: Path) -> None:
    doc = setv(base("greedy"), f"{WF}.components.decoder.implementation.artifact",
               "decoder/model.onnx.textproto")
    write_package(tmp_path, doc, graphs={"decoder": None})
    (tmp_path / "decoder").mkdir()
    (tmp_path / "decoder" / "model.onnx.textproto").write_text("layers: 12\n")
    problem = problem_at(admission_error(tmp_path),
                         f"{WF}.components.decoder.implementation.artifact")
    assert "does not parse as an ONNX ModelProto" in problem.message


def test_binary_that_is_not_a_model(tmp_path: Path) -> None:
    write_package(tmp_path, base("greedy"), graphs={"decoder": None})
    (tmp_path / "decoder").mkdir()
    (tmp_path / "decoder" / "model.onnx").write_bytes(b"\xff\xfe not a protobuf")
    problem = problem_at(admission_error(tmp_path),
                         f"{WF}.components.decoder.implementation.artifact")
    assert "component 'decoder'" in problem.message


# -- A2–A5 -----------------------------------------------------------------------------------
def test_declared_port_missing_from_the_graph(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", drop_inputs=("position_ids",),
                        drop_outputs=("present.0.value",))
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    inputs = problem_at(error, f"{WF}.components.decoder.ports.inputs.position_ids")
    assert inputs.message == ("port 'position_ids' of component 'decoder' is not an input of "
                              "its ONNX graph")
    outputs = problem_at(error, f"{WF}.components.decoder.ports.outputs.present.0.value")
    assert "is not an output of its ONNX graph" in outputs.message
    assert problem_at(error, f"{WF}.steps.0.inputs.position_ids")  # A5: binds a non-port


def test_dtype_mismatch(tmp_path: Path) -> None:
    doc = base("greedy")
    retyped = dict(at(doc, f"{WF}.components.decoder.ports.inputs.position_ids"), dtype="int32")
    graph = build_graph(doc, "decoder", retype={"position_ids": retyped})
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    problem = problem_at(error, f"{WF}.components.decoder.ports.inputs.position_ids.dtype")
    assert problem.message == ("port 'position_ids' of component 'decoder' is int64 in the "
                               "metadata but int32 in the ONNX graph")


def test_rank_mismatch(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", retype={"logits": {
        "dtype": "float32", "rank": 2, "shape": ["batch", 32]}})
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    problem = problem_at(error, f"{WF}.components.decoder.ports.outputs.logits.rank")
    assert "rank 3 in the metadata but 2 in the ONNX graph" in problem.message


def test_fixed_dim_mismatch(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", retype={"logits": {
        "dtype": "float32", "rank": 3, "shape": ["batch", "sequence", 48]}})
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    problem = problem_at(error, f"{WF}.components.decoder.ports.outputs.logits.shape.2")
    assert "axis 2 is 32 in the metadata but 48 in the ONNX graph" in problem.message


def test_symbolic_and_unknown_graph_dims_are_accepted(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", retype={"logits": {
        "dtype": "float32", "rank": 3, "shape": ["b", None, "vocab"]}})
    load_package(write_package(tmp_path, doc, graphs={"decoder": graph}))


def test_unbound_required_graph_input(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", extra_inputs={
        "token_type_ids": {"dtype": "int64", "rank": 2, "shape": ["batch", "sequence"]}})
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    problem = problem_at(error, f"{WF}.steps.0.inputs.token_type_ids")
    assert "leaves graph input 'token_type_ids' unbound" in problem.message


def test_graph_port_with_an_empty_name(tmp_path: Path) -> None:
    doc = base("greedy")
    graph = build_graph(doc, "decoder", extra_inputs={
        "": {"dtype": "int64", "rank": 1, "shape": [1]}})
    error = admission_error(write_package(tmp_path, doc, graphs={"decoder": graph}))
    assert any("has an empty name" in p.message for p in error.problems)


# -- A6–A8: the embedding table and widths ----------------------------------------------------
def chained_with_table(tmp_path: Path, table: dict[str, np.ndarray], **kwargs) -> AdmissionError:
    doc = base("chained")
    graphs = {"target": target_graph(doc, initializers=table, **kwargs)}
    return admission_error(write_package(tmp_path, doc, graphs=graphs))


def test_table_not_an_initializer(tmp_path: Path) -> None:
    names = {f"layer.{i}.weight": np.zeros((1,), np.float16) for i in range(10)}
    error = chained_with_table(tmp_path, names)
    problem = problem_at(error, f"{PE}.token_embedding.table")
    assert "'model.embed_tokens.weight' is not an initializer of component 'target'" in \
        problem.message
    assert "has 10 initializers: layer.0.weight" in problem.message
    assert "layer.7.weight, ..." in problem.message and "layer.8.weight" not in problem.message


def test_table_not_two_dimensional(tmp_path: Path) -> None:
    error = chained_with_table(tmp_path, {"model.embed_tokens.weight":
                                          np.zeros((32, 4, 4), np.float16)})
    problem = problem_at(error, f"{PE}.token_embedding.table")
    assert "has shape [32, 4, 4]" in problem.message and "rank 2" in problem.expected


def test_table_dtype_differs_from_the_currency(tmp_path: Path) -> None:
    error = chained_with_table(tmp_path, {"model.embed_tokens.weight":
                                          np.zeros((32, 16), np.float32)})
    problem = problem_at(error, f"{PE}.token_embedding.table")
    assert "is float32 but the chain's currency" in problem.message
    assert "is float16" in problem.message


def test_table_of_the_wrong_width(tmp_path: Path) -> None:
    error = chained_with_table(tmp_path, {"model.embed_tokens.weight":
                                          np.zeros((32, 8), np.float16)})
    problem = problem_at(error, f"{PE}.token_embedding_input")
    assert "W_E 8 + carry W_C 16 != fused W_F 32" in problem.message


def test_table_with_fewer_rows_than_the_proposer_vocabulary(tmp_path: Path) -> None:
    doc = base("chained")
    logits = {"dtype": "float16", "rank": 3, "shape": ["batch", "sequence", 32]}
    graphs = {"target": target_graph(doc, initializers={
        "model.embed_tokens.weight": np.zeros((16, 16), np.float16)}),
        "assistant": build_graph(doc, "assistant", retype={"logits": logits})}
    error = admission_error(write_package(tmp_path, doc, graphs=graphs))
    problem = problem_at(error, f"{PE}.token_embedding.table")
    assert "has 16 rows, fewer than the proposer vocabulary 32" in problem.message


def test_identical_vocabulary_of_different_widths(tmp_path: Path) -> None:
    doc = base("chained")
    logits = {"dtype": "float16", "rank": 3, "shape": ["batch", "sequence", 40]}
    graphs = {"assistant": build_graph(doc, "assistant", retype={"logits": logits})}
    error = admission_error(write_package(tmp_path, doc, graphs=graphs))
    problem = problem_at(error, "speculative.vocabulary.kind")
    assert "are 40 wide and target 'target' logits 'logits' are 32 wide" in problem.message


def test_subset_vocabulary_width(tmp_path: Path) -> None:
    doc = setv(base("chained"), "speculative.vocabulary",
               {"kind": "subset", "proposer_vocab_size": 24})
    logits = {"dtype": "float16", "rank": 3, "shape": ["batch", "sequence", 28]}
    graphs = {"assistant": build_graph(doc, "assistant", retype={"logits": logits})}
    error = admission_error(write_package(tmp_path, doc, graphs=graphs))
    problem = problem_at(error, "speculative.vocabulary.proposer_vocab_size")
    assert "are 28 wide but proposer_vocab_size is 24" in problem.message


def test_subset_vocabulary_wider_than_the_target(tmp_path: Path) -> None:
    doc = setv(base("chained"), "speculative.vocabulary",
               {"kind": "subset", "proposer_vocab_size": 40})
    logits = {"dtype": "float16", "rank": 3, "shape": ["batch", "sequence", 40]}
    graphs = {"assistant": build_graph(doc, "assistant", retype={"logits": logits}),
              "target": target_graph(doc, initializers={
                  "model.embed_tokens.weight": np.zeros((48, 16), np.float16)})}
    error = admission_error(write_package(tmp_path, doc, graphs=graphs))
    problem = problem_at(error, "speculative.vocabulary.proposer_vocab_size")
    assert "proposer vocabulary 40 exceeds the target's 32" in problem.message
