"""Forms the published documents use (issue 15), as rules: what a control step publishes, the
shape of a branch's outputs, a target without driver roles, informational sharding, and the
workflow inputs only the chain binds. No model weights."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from package_builders import WF, at, base, mutated, write_package

from speculant.errors import MetadataError, UnsupportedError
from speculant.package import (
    load_metadata_only,
    load_package,
    unsupported_problems,
    validate_document,
)
from speculant.package.document import to_document

CELL = "kv.0.key"


def problems_of(doc: dict) -> tuple[list, list]:
    """(MetadataError problems, UnsupportedError problems) of a document."""
    try:
        document = to_document(doc, "<test>")
    except MetadataError as error:
        return error.problems, []
    return validate_document(document), unsupported_problems(document)


def decoder_invoke(doc: dict, prefix: str) -> dict:
    """The greedy decoder's invoke with its outputs renamed ``<prefix>.<port>``."""
    step = copy.deepcopy(at(doc, f"{WF}.steps.0"))
    step["outputs"] = {port: f"{prefix}.{port}" for port in step["outputs"]}
    return step


def with_loop(**overrides) -> dict:
    """§8.1 plus a loop after the emit (setup: one decoder invoke; body: another, carrying
    the cell kv.0.key), and an output ``cache`` with the cell's contract."""
    doc = base("greedy")
    wf = at(doc, WF)
    wf["outputs"]["cache"] = {"contract": copy.deepcopy(wf["state"][CELL]["contract"]),
                              "role": "tensor", "stage": "pre_adapter"}
    wf["outputs"]["setup_logits"] = copy.deepcopy(wf["outputs"]["logits"])
    loop = {"kind": "loop", "setup": [decoder_invoke(doc, "setup")],
            "steps": [decoder_invoke(doc, "body")],
            "carried": [{"cell": CELL, "next": "body.present.0.key"}],
            "continue_when": "request.active", "max_iterations": "package.max_context",
            **overrides}
    wf["steps"].append(loop)
    return doc


def emit(value: str, output: str) -> dict:
    return {"kind": "emit", "value": value, "output": output, "mode": "replace"}


# -- a loop republishes its carried cells and its setup outputs ----------------------------
def test_steps_after_a_loop_read_its_cells_and_setup_outputs() -> None:
    doc = with_loop()
    at(doc, WF)["steps"] += [emit(CELL, "cache"), emit("setup.logits", "setup_logits")]
    metadata, unsupported = problems_of(doc)
    assert metadata == [], [p.render() for p in metadata]
    assert [p.path for p in unsupported] == [f"{WF}.steps.2.kind"]  # the loop itself


def test_a_loop_body_keeps_its_own_values() -> None:
    doc = with_loop()
    at(doc, WF)["steps"].append(emit("body.logits", "setup_logits"))
    metadata, _ = problems_of(doc)
    assert [(p.path, p.rule) for p in metadata] == [(f"{WF}.steps.3.value", "12")]
    assert "emit of value 'body.logits', which is not defined" in metadata[0].message


def test_a_loop_body_sees_the_cells_it_carries() -> None:
    doc = with_loop()
    body_inputs = at(doc, f"{WF}.steps.2.steps.0.inputs")
    body_inputs["past_key_values.0.key"] = CELL  # the cell, not the request value
    metadata, _ = problems_of(doc)
    assert metadata == [], [p.render() for p in metadata]


def test_a_carry_of_an_unknown_cell() -> None:
    doc = with_loop(carried=[{"cell": "kv.9.key", "next": "body.present.0.key"}])
    metadata, _ = problems_of(doc)
    assert [p.path for p in metadata] == [f"{WF}.steps.2.carried.0.cell"]


def test_a_carry_of_a_value_the_body_does_not_define() -> None:
    doc = with_loop(carried=[{"cell": CELL, "next": "body.nothing"}])
    metadata, _ = problems_of(doc)
    assert [p.path for p in metadata] == [f"{WF}.steps.2.carried.0.next"]


# -- a branch's outputs are {cases, default} maps -------------------------------------------
def with_branch(outputs: dict) -> dict:
    doc = base("greedy")
    at(doc, WF)["steps"].insert(1, {
        "kind": "branch", "predicate": "request.active",
        "cases": {"greedy": {"kind": "sequence", "steps": []}}, "outputs": outputs})
    return doc


def test_branch_outputs_are_published_for_the_steps_after_it() -> None:
    doc = with_branch({"chosen.logits": {"cases": {"greedy": "decoder.logits"},
                                         "default": None}})
    at(doc, f"{WF}.steps.2")["value"] = "chosen.logits"
    metadata, unsupported = problems_of(doc)
    assert metadata == [], [p.render() for p in metadata]
    assert [p.path for p in unsupported] == [f"{WF}.steps.1.kind"]


def test_a_branch_output_that_is_a_value_name() -> None:
    metadata, _ = problems_of(with_branch({"chosen.logits": "decoder.logits"}))
    assert [p.path for p in metadata] == [f"{WF}.steps.1.outputs.chosen.logits"]
    assert "a branch output is a map" in metadata[0].message


def test_an_invoke_output_that_is_a_map() -> None:
    doc = mutated("greedy", ("set", f"{WF}.steps.0.outputs.logits",
                             {"cases": {"a": "decoder.logits"}}))
    metadata, _ = problems_of(doc)
    assert f"{WF}.steps.0.outputs.logits" in [p.path for p in metadata]


# -- the target's driver roles --------------------------------------------------------------
@pytest.mark.parametrize(("port", "role", "side"), [("input_ids", "token_ids", "input"),
                                                   ("logits", "logits", "output")])
def test_a_target_without_a_driver_role_is_refused_at_load(tmp_path: Path, port: str,
                                                           role: str, side: str) -> None:
    doc = mutated("greedy", ("del", f"{WF}.components.decoder.ports.roles.{port}"))
    write_package(tmp_path, doc)
    with pytest.raises(UnsupportedError) as info:
        load_package(tmp_path)
    (problem,) = info.value.problems
    assert problem.path == f"{WF}.components.decoder.ports.roles"
    assert f"a target without an {side} port of role '{role}'" in problem.message


def test_a_target_invoke_that_leaves_the_token_ids_unbound(tmp_path: Path) -> None:
    doc = mutated("greedy",
                  ("set", f"{WF}.components.decoder.ports.inputs.input_ids.optional", True),
                  ("del", f"{WF}.steps.0.inputs.input_ids"))
    write_package(tmp_path, doc)
    with pytest.raises(UnsupportedError) as info:
        load_package(tmp_path)
    assert f"{WF}.steps.0.inputs.input_ids" in info.value.paths
    assert "'token_ids' port 'input_ids' unbound" in str(info.value)


# -- model.sharding declares what is legal ---------------------------------------------------
def test_sharding_is_informational(tmp_path: Path) -> None:
    sharding = {"tensor_parallel": {"attention": {"axis": 1}},
                "expert_parallel": {"expert_count": 8}}
    doc = mutated("greedy", ("set", "model.sharding", sharding))
    assert problems_of(doc) == ([], [])
    package = load_package(write_package(tmp_path, doc))
    assert package.plan.target == "decoder"


# -- the workflow inputs the chain binds itself --------------------------------------------
def test_the_plan_names_the_inputs_only_the_chain_binds(tmp_path: Path) -> None:
    package = load_package(write_package(tmp_path, base("chained")))
    # request.inputs_embeds feeds only the fused port; request.position_ids and
    # request.attention_mask also feed the target, and the borrowed caches are target outputs
    assert package.plan.chain_bound_inputs == ("request.inputs_embeds",)


def test_a_greedy_plan_has_no_chain_bound_inputs(tmp_path: Path) -> None:
    package = load_package(write_package(tmp_path, base("greedy")))
    assert package.plan.chain_bound_inputs == ()


def test_metadata_only_accepts_the_loop_form(tmp_path: Path) -> None:
    doc = with_loop()
    at(doc, WF)["steps"].append(emit(CELL, "cache"))
    write_package(tmp_path, doc)
    _, unsupported = load_metadata_only(tmp_path)
    assert {p.kind for p in unsupported} == {UnsupportedError}
