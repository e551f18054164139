"""The MetadataError rules of metadata.md §6: each a one-edit mutation of a §8 example that
yields exactly MetadataError at the rule's document path (evidence.md E9). No model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from package_builders import WF, base, mutated, rename_symbol, write_package

from speculant.errors import MetadataError, Problem
from speculant.package import load_package, validate_document
from speculant.package.document import to_document

SV = f"{WF}.serving"
GROUPS = f"{SV}.state_service.groups"
PE = "speculative.proposal_execution"
CELL = f"{WF}.state.kv.0.key"
ALIAS = f"{GROUPS}.attention.ports.decoder.kv.0.key"


def metadata_problems(doc: dict) -> list[Problem]:
    try:
        document = to_document(doc, "<test>")
    except MetadataError as error:
        return error.problems
    return validate_document(document)


@pytest.mark.parametrize("name", ["greedy", "chained"])
def test_base_documents_are_valid(name: str) -> None:
    assert metadata_problems(base(name)) == []


# (id, the spec's rule, base, edits, expected path, words of the message)
CASES = [
    # rule 3
    ("model.io with pipeline", "3", "greedy", [("set", "model.io", {"inputs": {}})], "model.io",
     "model.io"),
    # rule 4 (lexical part) and artifact extension
    ("artifact extension", "4", "greedy",
     [("set", f"{WF}.components.decoder.implementation.artifact", "decoder/model.bin")],
     f"{WF}.components.decoder.implementation.artifact", "neither .onnx nor .onnx.textproto"),
    ("artifact absolute", "4", "greedy",
     [("set", f"{WF}.components.decoder.implementation.artifact", "/tmp/model.onnx")],
     f"{WF}.components.decoder.implementation.artifact", "is absolute"),
    ("artifact with ..", "4", "greedy",
     [("set", f"{WF}.components.decoder.implementation.artifact", "decoder/../../m.onnx")],
     f"{WF}.components.decoder.implementation.artifact", "'..' component"),
    ("artifact empty", "9", "greedy",
     [("set", f"{WF}.components.decoder.implementation.artifact", "")],
     f"{WF}.components.decoder.implementation.artifact", "non-empty artifact"),
    ("implementation unknown key", "2", "greedy",
     [("set", f"{WF}.components.decoder.implementation.abi", "x")],
     f"{WF}.components.decoder.implementation.abi", "unknown key 'abi'"),
    ("tokenizer path with ..", "4", "greedy",
     [("set", "package.tokenizer.artifacts.0.location", "../tokenizer.json")],
     "package.tokenizer.artifacts.0.location", "'..' component"),
    # rule 5
    ("no canonical tokenizer", "5", "greedy",
     [("set", "package.tokenizer.artifacts", [{"location": "a.json"}, {"location": "b.json"}])],
     "package.tokenizer.artifacts", "no canonical tokenizer artifact"),
    # rule 7
    ("request source without runtime role", "7", "greedy",
     [("set", f"{WF}.inputs.request.input_ids.role", {"kind": "opaque"})],
     f"{WF}.inputs.request.input_ids.role", "needs a runtime role"),
    ("runtime role without role", "7", "greedy",
     [("del", f"{WF}.inputs.request.input_ids.role.role")],
     f"{WF}.inputs.request.input_ids.role.role", "needs 'role'"),
    ("required false without default", "7", "greedy",
     [("set", f"{WF}.inputs.request.past.0.key.required", False)],
     f"{WF}.inputs.request.past.0.key.default", "required: false needs a default"),
    # rule 8
    ("default of the wrong kind", "8", "greedy",
     [("set", f"{WF}.inputs.package.max_context.default", 64.5)],
     f"{WF}.inputs.package.max_context.default", "is not a int64 element"),
    ("default out of range", "8", "greedy",
     [("set", f"{WF}.inputs.package.max_context.default", 2**63)],
     f"{WF}.inputs.package.max_context.default", "out of range for int64"),
    ("default list of the wrong length", "8", "greedy",
     [("set", f"{WF}.inputs.package.max_context.default", [64, 64])],
     f"{WF}.inputs.package.max_context.default", "a list of 2 elements"),
    ("bool default for an integer", "8", "greedy",
     [("set", f"{WF}.inputs.package.max_context.default", True)],
     f"{WF}.inputs.package.max_context.default", "is not a int64 element"),
    # rule 9: test_component_name_with_a_dot; rule 10
    ("role names an undeclared port", "10", "greedy",
     [("set", f"{WF}.components.decoder.ports.roles.hidden", "hidden_states")],
     f"{WF}.components.decoder.ports.roles.hidden", "not a declared port"),
    ("contract binding names an undeclared port", "10", "greedy",
     [("set", f"{WF}.components.decoder.contract",
       {"id": "lm", "version": "1", "bindings": {"ids": "tokens"}})],
     f"{WF}.components.decoder.contract.bindings.ids", "not a declared port"),
    # rule 12
    ("value used before definition", "12", "greedy",
     [("set", f"{WF}.steps.0.inputs.input_ids", "decoder.logits")],
     f"{WF}.steps.0.inputs.input_ids", "used before it is defined"),
    ("value defined twice", "12", "greedy",
     [("set", f"{WF}.steps.0.outputs.logits", "request.input_ids")],
     f"{WF}.steps.0.outputs.logits", "defined twice"),
    ("emit of an undefined value", "12", "greedy",
     [("set", f"{WF}.steps.1.value", "decoder.nothing")],
     f"{WF}.steps.1.value", "not defined before it"),
    ("initializer undefined", "12", "greedy", [("set", f"{CELL}.initializer", "request.nothing")],
     f"{CELL}.initializer", "not a defined value"),
    # rule 13
    ("invoke of an unknown component", "13", "greedy",
     [("set", f"{WF}.steps.0.component", "coder")],
     f"{WF}.steps.0.component", "unknown component 'coder'"),
    ("invoke of an unknown port", "13", "greedy",
     [("set", f"{WF}.steps.0.inputs.token_type_ids", "request.input_ids")],
     f"{WF}.steps.0.inputs.token_type_ids", "not a declared input port"),
    ("invoke leaves an input unbound", "13", "greedy",
     [("del", f"{WF}.steps.0.inputs.position_ids")],
     f"{WF}.steps.0.inputs.position_ids", "non-optional input port 'position_ids' unbound"),
    ("invoke leaves an output unbound", "13", "greedy",
     [("del", f"{WF}.steps.0.outputs.present.0.value")],
     f"{WF}.steps.0.outputs.present.0.value", "non-optional output port"),
    # rule 14
    ("invoke binds a value of another dtype", "14", "greedy",
     [("set", f"{WF}.inputs.request.position_ids.contract.dtype", "int32")],
     f"{WF}.steps.0.inputs.position_ids", "dtype int32 != int64"),
    ("invoke binds a value with another fixed dim", "14", "greedy",
     [("set", f"{WF}.inputs.request.past.0.key.contract.shape.3", 16)],
     f"{WF}.steps.0.inputs.past_key_values.0.key", "axis 3 is fixed to 16 != 8"),
    # rule 15
    ("emit to an undeclared output", "15", "greedy", [("set", f"{WF}.steps.1.output", "scores")],
     f"{WF}.steps.1.output", "undeclared output 'scores'"),
    ("emit of an incompatible value", "15", "greedy",
     [("set", f"{WF}.outputs.logits.contract.dtype", "float16")],
     f"{WF}.steps.1.value", "dtype float32 != float16"),
    ("emit with another batch layout", "15", "greedy",
     [("del", f"{WF}.outputs.logits.contract.batch_layout")],
     f"{WF}.steps.1.value", "different batch layouts"),
    # (found while typing the document, by the models: no rule id)
    ("emit without mode", "", "greedy", [("del", f"{WF}.steps.1.mode")],
     f"{WF}.steps.1.mode", "emit step needs mode"),
    # rule 16
    ("unknown step kind", "16", "greedy", [("set", f"{WF}.steps.1.kind", "print")],
     f"{WF}.steps.1.kind", f"unknown step kind 'print' at {WF}.steps.1"),
    # rule 17
    ("cell names an unknown group", "17", "greedy", [("set", f"{CELL}.service_group", "attn")],
     f"{CELL}.service_group", "unknown state group 'attn'"),
    ("grouped cell not runtime-managed", "17", "greedy",
     [("set", f"{CELL}.management", "workflow")],
     f"{CELL}.management", "must be management: runtime"),
    ("grouped cell with management absent", "17", "greedy", [("del", f"{CELL}.management")],
     f"{CELL}.management", "must be management: runtime"),
    ("runtime cell without release_boundary", "17", "greedy", [("del", f"{CELL}.release_boundary")],
     f"{CELL}.release_boundary", "needs a release_boundary"),
    # rule 18
    ("recurrence axis not below rank", "18", "greedy", [("set", f"{CELL}.recurrence.axis", 4)],
     f"{CELL}.recurrence.axis", "not below the cell's rank 4"),
    ("recurrence axis differs from sequence_axis", "18", "greedy",
     [("set", f"{CELL}.recurrence.axis", 1)],
     f"{CELL}.recurrence.axis", "differs from the sequence_axis 2"),
    ("recurrence varies an axis of a group without sequence_axis", "18", "greedy",
     [("del", f"{GROUPS}.attention.sequence_axis")],
     f"{CELL}.recurrence.axis", "declares no sequence_axis"),
    ("grouped cell not request_aligned", "18", "greedy",
     [("del", f"{CELL}.contract.batch_layout")],
     f"{CELL}.contract.batch_layout", "must be request_aligned"),
    ("sequence_axis not below a cell's rank", "18", "greedy",
     [("set", f"{GROUPS}.attention.sequence_axis", 4)],
     f"{GROUPS}.attention.sequence_axis", "not below the rank 4"),
    # rule 19
    ("growing increment is not accepted_len", "19", "greedy",
     [("set", f"{CELL}.recurrence", {"kind": "growing", "axis": 2,
                                      "increment": "package.max_context",
                                      "max": "package.max_context"})],
     f"{CELL}.recurrence.increment", "increment is the value serving.accepted_len names"),
    ("max not an integer scalar", "19", "greedy",
     [("set", f"{CELL}.recurrence.max", "request.active")],
     f"{CELL}.recurrence.max", "not an integer scalar"),
    ("max undefined", "19", "greedy", [("set", f"{CELL}.recurrence.max", "package.nothing")],
     f"{CELL}.recurrence.max", "not a defined value"),
    # rule 20
    ("serving without groups", "20", "greedy", [("set", f"{SV}.state_service.groups", {})],
     f"{SV}.state_service.groups", "no state groups"),
    ("groups without accepted_len", "20", "greedy", [("del", f"{SV}.accepted_len")],
     f"{SV}.accepted_len", "needs accepted_len"),
    ("control undefined", "20", "greedy", [("set", f"{SV}.done", "request.finished")],
     f"{SV}.done", "not a defined value"),
    ("control of the wrong dtype", "20", "greedy",
     [("set", f"{SV}.active", "request.accepted_len")],
     f"{SV}.active", "has dtype int64"),
    ("control of the wrong rank", "20", "greedy",
     [("set", f"{SV}.accepted_len", "request.input_ids")], f"{SV}.accepted_len", "has rank 2"),
    ("rank-1 control not request_aligned", "20", "greedy",
     [("del", f"{WF}.inputs.request.done.contract.batch_layout")],
     f"{SV}.done", "not request_aligned on axis 0"),
    # rule 21
    ("empty layout", "21", "greedy", [("set", f"{GROUPS}.attention.layout", "")],
     f"{GROUPS}.attention.layout", "non-empty layout"),
    ("append without sequence_axis", "21", "greedy", [("del", f"{GROUPS}.attention.sequence_axis")],
     f"{GROUPS}.attention.sequence_axis", "append group needs a sequence_axis"),
    ("rollback_positions 0", "21", "greedy",
     [("set", f"{GROUPS}.attention.capabilities.rollback_positions", 0)],
     f"{GROUPS}.attention.capabilities.rollback_positions", "rollback_positions 0"),
    ("cascade names no group", "21", "greedy",
     [("set", f"{GROUPS}.attention.capabilities.cascade", ["sliding"])],
     f"{GROUPS}.attention.capabilities.cascade.0", "unknown group 'sliding'"),
    ("update with an unknown key", "2", "greedy",
     [("set", f"{GROUPS}.attention.update.stride", 2)],
     f"{GROUPS}.attention.update.stride", "unknown key 'stride'"),
    # rule 22
    ("alias names an unknown cell", "22", "greedy",
     [("set", f"{GROUPS}.attention.ports.decoder.kv.9.key",
       {"input": "past_key_values.0.key", "output": "present.0.key", "role": "key",
        "layer": 1})],
     f"{GROUPS}.attention.ports.decoder.kv.9.key", "unknown state cell 'kv.9.key'"),
    ("alias of a cell of another group", "22", "chained",
     [("set", f"{GROUPS}.full_attention.ports.target.kv.sliding.key",
       {"input": "past_key_values.1.key", "output": "present.1.key", "role": "key",
        "layer": 2})],
     f"{GROUPS}.full_attention.ports.target.kv.sliding.key", "of group 'sliding_attention'"),
    ("alias for an undeclared component", "22", "greedy",
     [("set", f"{GROUPS}.attention.ports.encoder", {})],
     f"{GROUPS}.attention.ports.encoder", "undeclared component 'encoder'"),
    ("alias input not a declared port", "22", "greedy", [("set", f"{ALIAS}.input", "past.0.key")],
     f"{ALIAS}.input", "not a declared input port"),
    ("alias output not a declared port", "22", "greedy", [("set", f"{ALIAS}.output", "next.0.key")],
     f"{ALIAS}.output", "not a declared output port"),
    ("read_write alias without output", "22", "greedy", [("del", f"{ALIAS}.output")],
     f"{ALIAS}.output", "read_write alias needs an output"),
    # rule 23 (more in test_layer_required_and_unique)
    ("key layers differ from value layers", "23", "greedy", [("set", f"{ALIAS}.layer", 1)],
     f"{GROUPS}.attention.ports.decoder", "key layers [1] differ from value layers [0]"),
    # rule 24
    ("borrowed cache does not fit the owner's output", "24", "chained",
     [("set", f"{WF}.components.assistant.ports.inputs.shared_kv.full_attention.key.shape.3", 8)],
     f"{GROUPS}.full_attention.ports.assistant.kv.full.key.input",
     "does not fit the owner's output 'target.present.1.key'"),
    # rule 26
    ("proposer undeclared", "26", "chained", [("set", "speculative.proposer", "drafter")],
     "speculative.proposer", "'drafter' is not a declared component"),
    ("proposer equals target", "26", "chained", [("set", "speculative.proposer", "target")],
     "speculative.proposer", "the same component"),
    ("speculative without pipeline", "26", "chained", [("del", "pipeline")],
     "speculative", "needs pipeline.workflow"),
    # rule 28
    ("token_embedding_input not a proposer input", "28", "chained",
     [("set", f"{PE}.token_embedding_input", "input_ids")],
     f"{PE}.token_embedding_input", "not a declared input port of proposer"),
    ("logits_output not a proposer output", "28", "chained",
     [("set", f"{PE}.logits_output", "scores")],
     f"{PE}.logits_output", "not a declared output port of proposer"),
    ("folded_carry_output not a proposer output", "28", "chained",
     [("set", f"{PE}.folded_carry_output", "carry")],
     f"{PE}.folded_carry_output", "not a declared output port of proposer"),
    # rule 29
    ("folded carry without seed", "29", "chained", [("del", f"{PE}.folded_carry_seed")],
     f"{PE}.folded_carry_seed", "needs folded_carry_seed"),
    ("folded carry without token_embedding", "29", "chained", [("del", f"{PE}.token_embedding")],
     f"{PE}.token_embedding", "needs token_embedding"),
    ("folded carry without target_hidden_context", "29", "chained",
     [("del", "speculative.port_bindings")],
     "speculative.port_bindings.target_hidden_context", "needs port_bindings"),
    ("seed component not the target", "29", "chained",
     [("set", f"{PE}.folded_carry_seed.component", "assistant")],
     f"{PE}.folded_carry_seed.component", "must be the target"),
    ("seed output not a target output", "29", "chained",
     [("set", f"{PE}.folded_carry_seed.output", "hidden")],
     f"{PE}.folded_carry_seed.output", "not a declared output of target"),
    ("embedding component not the target", "29", "chained",
     [("set", f"{PE}.token_embedding.component", "assistant")],
     f"{PE}.token_embedding.component", "must be the target"),
    ("target not ONNX", "29", "chained",
     [("set", f"{WF}.components.target.implementation", {"kind": "binding"})],
     f"{WF}.components.target.implementation.kind", "needs an ONNX target"),
    ("empty table", "29", "chained", [("set", f"{PE}.token_embedding.table", "")],
     f"{PE}.token_embedding.table", "table is empty"),
    ("scale not positive", "29", "chained", [("set", f"{PE}.token_embedding.scale", 0.0)],
     f"{PE}.token_embedding.scale", "not a finite number > 0"),
    ("scale not finite", "29", "chained", [("set", f"{PE}.token_embedding.scale", math.inf)],
     f"{PE}.token_embedding.scale", "not a finite number > 0"),
    ("target_hidden_context differs from token_embedding_input", "29", "chained",
     [("set", "speculative.port_bindings.target_hidden_context", "position_ids")],
     "speculative.port_bindings.target_hidden_context", "must equal token_embedding_input"),
    # rule 30
    ("seed dtype differs from the currency", "30", "chained",
     [("set", f"{WF}.components.target.ports.outputs.hidden_states.dtype", "float32")],
     f"{PE}.folded_carry_seed.output", "has dtype float32 but the fused port"),
    ("carry dtype differs from the currency", "30", "chained",
     [("set", f"{WF}.components.assistant.ports.outputs.projected_state.dtype", "bfloat16")],
     f"{PE}.folded_carry_output", "has dtype bfloat16 but the fused port"),
    # rule 31
    ("carry widths disagree", "31", "chained",
     [("set", f"{WF}.components.assistant.ports.outputs.projected_state.shape.2", 8)],
     f"{PE}.folded_carry_output", "carry widths disagree: folded_carry_seed output is 16"),
    ("carry as wide as the fused input", "31", "chained",
     [("set", f"{WF}.components.assistant.ports.inputs.inputs_embeds.shape.2", 16)],
     f"{PE}.token_embedding_input", "carry width W_C 16 leaves no room"),
    # §5: κ agreement
    ("borrowed caches disagree on κ", "§5", "chained",
     [("set", f"{WF}.components.assistant.ports.inputs.shared_kv.full_attention.key.shape.2",
       "full_sequence")],
     GROUPS, "disagree on the symbol of their sequence axis"),
    # rule 33
    ("rollback_state names an unknown cell", "33", "chained",
     [("set", "speculative.rollback_state.0", "kv.window.key")],
     "speculative.rollback_state.0", "unknown cell 'kv.window.key'"),
    ("rolled-back group without rollback_positions", "33", "chained",
     [("del", f"{GROUPS}.full_attention.capabilities.rollback_positions")],
     f"{GROUPS}.full_attention.capabilities.rollback_positions", "declares no rollback_positions"),
    ("rolled-back group with too few rollback_positions", "33", "chained",
     [("set", f"{GROUPS}.sliding_attention.capabilities.rollback_positions", 2)],
     f"{GROUPS}.sliding_attention.capabilities.rollback_positions",
     "fewer than max_proposal_width 4"),
    ("cascade reaches a group without rollback_positions", "33", "chained",
     [("set", "speculative.rollback_state", ["kv.sliding.key", "kv.sliding.value"]),
      ("set", f"{GROUPS}.sliding_attention.capabilities.cascade", ["full_attention"]),
      ("del", f"{GROUPS}.full_attention.capabilities.rollback_positions")],
     f"{GROUPS}.full_attention.capabilities.rollback_positions", "declares no rollback_positions"),
    # rule 34
    ("shared_state names no group", "34", "chained",
     [("set", "speculative.shared_state.0", "global")],
     "speculative.shared_state.0", "unknown group 'global'"),
    # rule 35
    ("capability listed twice", "35", "greedy",
     [("set", f"{WF}.manifest.capabilities",
       ["workflow_ssa", "typed_emit", "serving_service_contract", "bounded_state_recurrence",
        "typed_emit"])],
     f"{WF}.manifest.capabilities", "more than once"),
]


@pytest.mark.parametrize(("rule", "base_name", "edits", "path", "words"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_metadata_rule(rule: str, base_name: str, edits: list, path: str, words: str) -> None:
    problems = metadata_problems(mutated(base_name, *edits))
    assert problems, "the mutation was accepted"
    assert {p.kind for p in problems} == {MetadataError}
    hits = [p for p in problems if p.path == path and words in p.render()]
    assert hits, f"no problem at {path}: {[p.render() for p in problems]}"
    assert {p.rule for p in hits} == {rule}, [(p.rule, p.render()) for p in hits]


def test_component_name_with_a_dot() -> None:
    doc = base("greedy")
    components = doc["pipeline"]["workflow"]["components"]
    components["dec.oder"] = components.pop("decoder")
    problems = metadata_problems(doc)
    assert any(p.path == f"{WF}.components.dec.oder" and "contains no '.'" in p.message
               for p in problems)
    assert {p.kind for p in problems} == {MetadataError}


def test_layer_required_and_unique() -> None:
    doc = base("greedy")
    aliases = doc["pipeline"]["workflow"]["serving"]["state_service"]["groups"]["attention"][
        "ports"]["decoder"]
    aliases["kv.0.value"]["role"] = "key"  # two key aliases, both layer 0
    problems = metadata_problems(doc)
    assert any(p.path == f"{GROUPS}.attention.ports.decoder.kv.0.value.layer"
               and "layer 0 of role key is claimed by both" in p.message for p in problems)
    del aliases["kv.0.value"]["layer"]
    problems = metadata_problems(doc)
    assert any(p.path == f"{GROUPS}.attention.ports.decoder.kv.0.value.layer"
               and "so each needs a layer" in p.message for p in problems)


def test_several_rules_reported_together(tmp_path: Path) -> None:
    doc = mutated("chained",
                  ("set", f"{PE}.token_embedding.scale", -1.0),
                  ("set", "speculative.shared_state.0", "global"),
                  ("del", f"{CELL.replace('kv.0', 'kv.full')}.release_boundary"))
    write_package(tmp_path, doc)
    with pytest.raises(MetadataError) as info:
        load_package(tmp_path)
    assert {f"{PE}.token_embedding.scale", "speculative.shared_state.0",
            f"{WF}.state.kv.full.key.release_boundary"} <= set(info.value.paths)


def test_metadata_error_at_runnable_load(tmp_path: Path) -> None:
    doc = mutated("greedy", ("set", f"{CELL}.recurrence.axis", 1))
    write_package(tmp_path, doc)
    with pytest.raises(MetadataError) as info:
        load_package(tmp_path)
    assert f"{CELL}.recurrence.axis" in info.value.paths


def test_sigma_equal_kappa_is_not_a_metadata_error() -> None:
    # metadata.md rule 32 says MetadataError; published document 24 has σ = κ and must
    # validate at metadata level, so it is an UnsupportedError of a runnable load instead.
    doc = rename_symbol(base("chained"), "kv_sequence", "sequence")
    assert metadata_problems(doc) == []
