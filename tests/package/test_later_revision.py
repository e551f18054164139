"""Forms of a later revision of the standard (the published catalogue's documents use them):
each accepted where its meaning is clear, or listed as unsupported with its path; each test
is one edit of a §8 example. No model."""

from __future__ import annotations

import pytest
from package_builders import WF, at, base, delete, mutated, setv

from speculant.errors import MetadataError, Problem
from speculant.package import unsupported_problems, validate_document
from speculant.package.document import to_document

LOGITS = f"{WF}.outputs.logits"
PORT = f"{WF}.components.decoder.ports.outputs.logits"
PE = "speculative.proposal_execution"


def problems_of(doc: dict) -> tuple[list[Problem], list[Problem]]:
    """(MetadataError problems, UnsupportedError problems) of a document."""
    try:
        document = to_document(doc, "<test>")
    except MetadataError as error:
        return error.problems, []
    return validate_document(document), unsupported_problems(document)


def only_unsupported_at(doc: dict, path: str) -> Problem:
    errors, unsupported = problems_of(doc)
    assert errors == [], [p.render() for p in errors]
    (problem,) = [p for p in unsupported if p.path == path]
    return problem


def refused_at(doc: dict, path: str) -> Problem:
    errors, _ = problems_of(doc)
    assert errors, "expected a MetadataError"
    (problem,) = [p for p in errors if p.path == path]
    return problem


# -- rank is optional where shape is given ---------------------------------------------------
def test_a_contract_without_rank_takes_the_shape_length() -> None:
    doc = delete(base("greedy"), f"{PORT}.rank")
    assert problems_of(doc) == ([], [])
    document = to_document(doc, "<test>")
    contract = document.workflow.components["decoder"].ports.outputs["logits"]
    assert contract.rank == len(at(doc, f"{PORT}.shape")) == 3


def test_a_contract_with_neither_rank_nor_shape_is_refused() -> None:
    doc = delete(delete(base("greedy"), f"{PORT}.rank"), f"{PORT}.shape")
    assert "'rank' or a 'shape'" in refused_at(doc, f"{PORT}.rank").message


def test_rank_and_shape_must_agree_when_both_are_present() -> None:
    doc = mutated("greedy", ("set", f"{PORT}.rank", 2))
    assert "rank 2 != len(shape) 3" in refused_at(doc, f"{PORT}.rank").message


# -- output family ----------------------------------------------------------------------------
def test_a_materialized_output_family_means_what_no_family_means() -> None:
    doc = setv(base("greedy"), f"{LOGITS}.family", {"kind": "materialized"})
    assert problems_of(doc) == ([], [])


def test_another_output_family_is_unsupported() -> None:
    doc = setv(base("greedy"), f"{LOGITS}.family", {"kind": "streamed", "chunk_axis": 1})
    problem = only_unsupported_at(doc, f"{LOGITS}.family.kind")
    assert "output family 'streamed'" in problem.message


def test_keys_on_a_materialized_family_are_unsupported() -> None:
    doc = setv(base("greedy"), f"{LOGITS}.family", {"kind": "materialized", "chunk_axis": 1})
    only_unsupported_at(doc, f"{LOGITS}.family.chunk_axis")


# -- padding ----------------------------------------------------------------------------------
def test_a_padded_axis_is_unsupported_where_it_is_declared() -> None:
    padding = [{"dimension": "sequence", "valid_lengths": "lengths"}]
    doc = setv(base("greedy"), f"{PORT}.padding", padding)
    problem = only_unsupported_at(doc, f"{PORT}.padding")
    assert "padded axis 'sequence'" in problem.message


def test_a_padding_without_valid_lengths_is_refused() -> None:
    doc = setv(base("greedy"), f"{PORT}.padding", [{"dimension": "sequence"}])
    refused_at(doc, f"{PORT}.padding.0.valid_lengths")


# -- manifest ir_version and onnx_opsets --------------------------------------------------------
def test_manifest_ir_version_and_opsets_are_informational() -> None:
    doc = setv(base("greedy"), f"{WF}.manifest.ir_version", "1.0")
    doc = setv(doc, f"{WF}.manifest.onnx_opsets", {"ai.onnx": 24})
    assert problems_of(doc) == ([], [])


def test_an_opset_below_one_is_refused() -> None:
    doc = setv(base("greedy"), f"{WF}.manifest.onnx_opsets", {"ai.onnx": 0})
    refused_at(doc, f"{WF}.manifest.onnx_opsets.ai.onnx")


# -- rule 35: a used capability is declared by its use ------------------------------------------
def test_a_manifest_that_lists_no_capability_is_valid() -> None:
    doc = setv(base("greedy"), f"{WF}.manifest.capabilities", [])
    assert problems_of(doc) == ([], [])


# -- speculative forms --------------------------------------------------------------------------
def test_another_proposal_execution_kind_is_unsupported_with_its_keys() -> None:
    doc = setv(base("chained"), PE, {"kind": "candidate_tree",
                                      "candidate_tokens": "candidate_token_ids"})
    problem = only_unsupported_at(doc, f"{PE}.kind")
    assert "candidate_tree proposal execution" in problem.message


def test_a_chained_proposal_execution_stays_closed() -> None:
    doc = setv(base("chained"), f"{PE}.candidate_tokens", "candidate_token_ids")
    assert "unknown key" in refused_at(doc, f"{PE}.candidate_tokens").message


def test_the_implemented_speculative_contract_identity_is_accepted() -> None:
    doc = setv(base("chained"), "speculative.identity", "onnx-genai.speculative")
    doc = setv(doc, "speculative.version", "1")
    assert problems_of(doc) == ([], [])


@pytest.mark.parametrize(("key", "value"), [("identity", "vendor.tree"), ("version", "2")])
def test_another_speculative_contract_is_unsupported(key: str, value: str) -> None:
    doc = setv(base("chained"), f"speculative.{key}", value)
    only_unsupported_at(doc, f"speculative.{key}")


def test_a_declared_verification_contract_is_unsupported() -> None:
    verification = {"target_output": {"component": "target", "output": "logits"}}
    doc = setv(base("chained"), "speculative.verification", verification)
    only_unsupported_at(doc, "speculative.verification")
