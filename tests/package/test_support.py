"""UnsupportedError: valid documents that speculant cannot execute. Metadata-level validation
accepts them; a runnable load raises, naming the feature and its path. No model weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from package_builders import WF, at, base, mutated, rename_symbol, write_package

from speculant.errors import MetadataError, UnsupportedError
from speculant.package import (
    load_metadata_only,
    load_package,
    unsupported_problems,
    validate_document,
)
from speculant.package.document import to_document

GROUPS = f"{WF}.serving.state_service.groups"
PE = "speculative.proposal_execution"
CELL = f"{WF}.state.kv.0.key"


def load_unsupported(tmp_path: Path, doc: dict) -> UnsupportedError:
    write_package(tmp_path, doc)
    with pytest.raises(UnsupportedError) as info:
        load_package(tmp_path)
    assert {p.kind for p in info.value.problems} == {UnsupportedError}
    return info.value


@pytest.mark.parametrize("name", ["greedy", "chained"])
def test_base_documents_are_supported(name: str) -> None:
    assert unsupported_problems(to_document(base(name), "<test>")) == []


# The brief's list, at runnable load.
def test_recurrent_replace_group(tmp_path: Path) -> None:
    doc = mutated("greedy", ("set", f"{GROUPS}.attention.kind", "recurrent"),
                  ("set", f"{GROUPS}.attention.update.kind", "replace"))
    error = load_unsupported(tmp_path, doc)
    assert {f"{GROUPS}.attention.kind", f"{GROUPS}.attention.update.kind"} <= set(error.paths)
    assert "state group kind 'recurrent' is not supported" in str(error)


def test_indexed_scatter_update_naming_no_state_cell(tmp_path: Path) -> None:
    """indexed_scatter is supported (tests/static_cache); its write_indices must be a cell."""
    doc = mutated("greedy", ("set", f"{GROUPS}.attention.update",
                             {"kind": "indexed_scatter", "write_indices": "request.accepted_len",
                              "capacity": "package.max_context"}))
    problems = validate_document(to_document(doc, "<test>"))
    assert problems and {p.kind for p in problems} == {MetadataError}
    assert f"{GROUPS}.attention.update.write_indices" in {p.path for p in problems}


def test_loop_step(tmp_path: Path) -> None:
    doc = base("greedy")
    doc["pipeline"]["workflow"]["steps"].append(
        {"kind": "loop", "steps": [], "continue_when": "request.active",
         "max_iterations": "package.max_context"})
    error = load_unsupported(tmp_path, doc)
    assert str(error).endswith(f"unsupported step kind 'loop' at {WF}.steps.2; speculant "
                               "executes invoke and emit steps only; expected invoke or emit")
    assert error.paths == [f"{WF}.steps.2.kind"]


@pytest.mark.parametrize("step", [{"kind": "sequence", "steps": []},
                                  {"kind": "branch", "predicate": "request.active",
                                   "cases": {}}], ids=["sequence", "branch"])
def test_other_control_steps(step: dict) -> None:
    kind = step["kind"]
    doc = base("greedy")
    doc["pipeline"]["workflow"]["steps"].append(step)
    document = to_document(doc, "<test>")
    assert validate_document(document) == []
    (problem,) = unsupported_problems(document)
    assert problem.message == (f"unsupported step kind '{kind}' at {WF}.steps.2; speculant "
                               "executes invoke and emit steps only")


def test_block_proposal_execution(tmp_path: Path) -> None:
    doc = mutated("chained", ("set", PE, {"kind": "block"}))
    error = load_unsupported(tmp_path, doc)
    assert f"{PE}.kind" in error.paths
    assert "block proposal execution is not supported" in str(error)


def test_sigma_equal_kappa(tmp_path: Path) -> None:
    doc = rename_symbol(base("chained"), "kv_sequence", "sequence")
    error = load_unsupported(tmp_path, doc)
    (problem,) = error.problems
    assert problem.path == f"{WF}.components.assistant.ports.inputs.inputs_embeds.shape"
    assert "inputs_embeds" in problem.message and "shared_kv.full_attention.key" in \
        problem.message and "'sequence'" in problem.message
    assert "speculant metadata name-axes PACKAGE" in problem.remedy


# Every other U condition, one edit each, through the metadata-only path.
CASES = [
    ("schema_version", "greedy", [("set", "schema_version", "v2")], "schema_version"),
    ("no pipeline", "greedy", [("del", "pipeline")], "pipeline"),
    ("model.runtime_configurable", "greedy", [("set", "model.runtime_configurable", {"a": 1})],
     "model.runtime_configurable"),
    ("constraint_languages", "greedy", [("set", "package.constraint_languages", ["json"])],
     "package.constraint_languages"),
    ("generation overrides", "greedy", [("set", "generation.overrides", {"a": 1})],
     "generation.overrides"),
    ("beam search", "greedy", [("set", "generation.defaults.num_beams", 4)],
     "generation.defaults.num_beams"),
    ("profiles", "greedy", [("set", "profiles", {"chat": {}})], "profiles"),
    ("required capability", "greedy", [("set", "required_capabilities", ["kv_cache"])],
     "required_capabilities.0"),
    ("manifest capability", "greedy",
     [("set", f"{WF}.manifest.capabilities.4", "loops")], f"{WF}.manifest.capabilities.4"),
    ("adapter_abis", "greedy", [("set", f"{WF}.manifest.adapter_abis", ["lora"])],
     f"{WF}.manifest.adapter_abis"),
    ("workflow effects", "greedy", [("set", f"{WF}.effects", ["log"])], f"{WF}.effects"),
    ("other runtime role", "greedy",
     [("set", f"{WF}.inputs.request.input_ids.role.role", "image_pixels")],
     f"{WF}.inputs.request.input_ids.role.role"),
    ("artifact source", "greedy",
     [("set", f"{WF}.inputs.package.max_context.source", {"kind": "artifact", "path": "x"})],
     f"{WF}.inputs.package.max_context.source"),
    ("present_as", "greedy", [("set", f"{WF}.inputs.request.active.present_as", "has_active")],
     f"{WF}.inputs.request.active.present_as"),
    # an optional input observed through present_as needs no default (the standard forbids
    # one): present_as alone is what stops it (21-shared-prefix-pixel-flow)
    ("optional input with present_as and no default", "greedy",
     [("set", f"{WF}.inputs.request.past.0.key.required", False),
      ("set", f"{WF}.inputs.request.past.0.key.present_as", "has_past")],
     f"{WF}.inputs.request.past.0.key.present_as"),
    # the standard lets a read_only alias name the output it discards; speculant refuses it
    ("read_only alias with output", "chained",
     [("set", f"{GROUPS}.sliding_attention.ports.assistant.kv.sliding.key.output", "logits")],
     f"{GROUPS}.sliding_attention.ports.assistant.kv.sliding.key.output"),
    ("text output", "greedy", [("set", f"{WF}.outputs.logits.role", "text")],
     f"{WF}.outputs.logits.role"),
    ("token_packed layout", "greedy",
     [("set", f"{WF}.inputs.package.max_context.contract.batch_layout", {"kind": "token_packed"})],
     f"{WF}.inputs.package.max_context.contract.batch_layout.kind"),
    ("float8 on a bound port", "greedy",
     [("set", f"{WF}.components.decoder.ports.outputs.logits.dtype", "float8_e4m3fn"),
      ("set", f"{WF}.outputs.logits.contract.dtype", "float8_e4m3fn")],
     f"{WF}.components.decoder.ports.outputs.logits.dtype"),
    ("adapter implementation", "greedy",
     [("set", f"{WF}.components.decoder.implementation",
       {"kind": "adapter", "abi": "x", "version": "1"})],
     f"{WF}.components.decoder.implementation.kind"),
    ("inferred ports", "greedy",
     [("set", f"{WF}.components.decoder.ports", {"inputs": {}, "outputs": {}})],
     f"{WF}.components.decoder.ports"),
    ("application_overridable", "greedy",
     [("set", f"{WF}.components.decoder.application_overridable", True)],
     f"{WF}.components.decoder.application_overridable"),
    ("component effects", "greedy", [("set", f"{WF}.components.decoder.effects", ["io"])],
     f"{WF}.components.decoder.effects"),
    ("session scope", "greedy", [("set", f"{CELL}.scope", "session")], f"{CELL}.scope"),
    ("advisory cell", "greedy", [("set", f"{CELL}.class", "advisory")], f"{CELL}.class"),
    ("release at session end", "greedy", [("set", f"{CELL}.release_boundary", "session")],
     f"{CELL}.release_boundary"),
    ("cell without service_group", "greedy", [("del", f"{CELL}.service_group")],
     f"{CELL}.service_group"),
    ("cross attention group", "greedy", [("set", f"{GROUPS}.attention.kind", "cross_attention")],
     f"{GROUPS}.attention.kind"),
    ("aliasing required", "greedy", [("set", f"{GROUPS}.attention.aliasing", "required")],
     f"{GROUPS}.attention.aliasing"),
    ("logical_lengths", "greedy", [("set", f"{GROUPS}.attention.logical_lengths", "lengths")],
     f"{GROUPS}.attention.logical_lengths"),
    ("control not a workflow input", "greedy", [("set", f"{WF}.serving.done", "decoder.logits")],
     f"{WF}.serving.done"),
    ("emit mode append", "greedy", [("set", f"{WF}.steps.1.mode", "append")],
     f"{WF}.steps.1.mode"),
    ("emit when", "greedy", [("set", f"{WF}.steps.1.when", "request.active")],
     f"{WF}.steps.1.when"),
    ("emit of a proposer output", "chained", [("set", f"{WF}.steps.2.value", "draft.logits")],
     f"{WF}.steps.2.value"),
    ("a second target invoke", "greedy",
     [("set", f"{WF}.steps.2", {"kind": "invoke", "component": "decoder",
                                "inputs": at(base("greedy"), f"{WF}.steps.0.inputs"),
                                "outputs": {port: f"again.{port}" for port in
                                            at(base("greedy"), f"{WF}.steps.0.outputs")}})],
     f"{WF}.steps"),
    ("no proposer invoke", "chained", [("del", f"{WF}.steps.1")], f"{WF}.steps"),
    ("a third component", "chained",
     [("set", f"{WF}.components.critic", {"implementation": {"kind": "onnx",
                                                              "artifact": "critic.onnx"},
                                          "ports": {"inputs": {}, "outputs": {}}})],
     f"{WF}.components.critic"),
    ("owner other than the target", "chained",
     [("set", f"{GROUPS}.full_attention.ports.assistant.kv.full.key",
       {"input": "shared_kv.full_attention.key", "output": "projected_state", "role": "key"})],
     f"{WF}.state.kv.full.key"),
    ("target binds another value to a cell's input", "chained",
     [("set", f"{WF}.steps.0.inputs.past_key_values.1.key", "request.past.full.value")],
     f"{WF}.steps.0.inputs.past_key_values.1.key"),
    ("recurrent proposer state", "chained",
     [("set", f"{PE}.recurrent", [{"state": "s", "input": "a", "output": "b"}])],
     f"{PE}.recurrent"),
    ("shared_weights", "chained", [("set", "speculative.shared_weights", ["embed"])],
     "speculative.shared_weights"),
    ("other port_bindings role", "chained",
     [("set", "speculative.port_bindings.draft_positions", "position_ids")],
     "speculative.port_bindings.draft_positions"),
    ("chained without folded carry", "chained",
     [("del", f"{PE}.folded_carry_output")], f"{PE}.folded_carry_output"),
    ("target does not bind the seed output", "chained",
     [("set", f"{WF}.components.target.ports.outputs.hidden_states.optional", True),
      ("del", f"{WF}.steps.0.outputs.hidden_states")], f"{WF}.steps.0.outputs.hidden_states"),
    ("target cell missing from rollback_state", "chained",
     [("set", "speculative.rollback_state", ["kv.sliding.key", "kv.sliding.value",
                                             "kv.full.key"])], "speculative.rollback_state"),
]


# No valid document can show these alone: without a pipeline nothing else is checked, and
# the only values that are not workflow inputs are invoke outputs of non-bool dtypes.
ALSO_INVALID = {"pipeline", f"{WF}.serving.done"}


@pytest.mark.parametrize(("base_name", "edits", "path"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_unsupported_feature(base_name: str, edits: list, path: str) -> None:
    doc = mutated(base_name, *edits)
    document = to_document(doc, "<test>")
    problems = unsupported_problems(document)
    if path not in ALSO_INVALID:  # a valid document: nothing but the unsupported feature
        assert validate_document(document) == [], validate_document(document)
    assert any(p.path == path for p in problems), [p.render() for p in problems]
    assert {p.kind for p in problems} == {UnsupportedError}
    assert all(p.rule for p in problems), [p.render() for p in problems if not p.rule]


def test_metadata_only_reports_without_failing(tmp_path: Path) -> None:
    doc = mutated("greedy", ("set", f"{GROUPS}.attention.kind", "recurrent"))
    write_package(tmp_path, doc)
    document, problems = load_metadata_only(tmp_path / "inference_metadata.yaml")
    assert document.workflow.serving is not None
    assert [p.path for p in problems] == [f"{GROUPS}.attention.kind"]


def test_metadata_errors_outrank_unsupported(tmp_path: Path) -> None:
    doc = mutated("greedy", ("set", f"{GROUPS}.attention.kind", "recurrent"),
                  ("set", f"{GROUPS}.attention.layout", ""))
    write_package(tmp_path, doc)
    with pytest.raises(MetadataError) as info:
        load_package(tmp_path)
    assert {p.kind for p in info.value.problems} == {MetadataError, UnsupportedError}
