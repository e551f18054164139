"""The fixtures' ``inference_metadata.yaml`` documents, as plain dicts.

Shapes follow metadata.md §8: distinct shape symbols ``sequence`` (query length),
``past_sequence``, ``total_sequence`` and ``kv_sequence`` (the drafter's borrowed cache), or,
with ``axis_style="sequence"``, ``sequence`` for every sequence-like axis (the style of
packages in circulation, which fails rule 32 and must be republished).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from builders import definition as fx
from builders.graphs import BORROWED_KEY, BORROWED_VALUE, TABLE_NAME
from speculant_tools.export.metadata import chained_section
from speculant_tools.writing import CAPABILITIES, contract, opaque_input

VOCABULARY_MAP = "draft_to_target.i64"  # a mapped vocabulary's map: raw little-endian int64


@dataclass(frozen=True)
class Symbols:
    """The shape symbol used for each sequence-like extent."""

    query: str = "sequence"
    past: str = "past_sequence"
    total: str = "total_sequence"
    borrowed: str = "kv_sequence"

    @classmethod
    def for_style(cls, axis_style: str) -> Symbols:
        if axis_style == "distinct":
            return cls()
        if axis_style == "sequence":
            return cls("sequence", "sequence", "sequence", "sequence")
        raise ValueError(f"axis_style must be 'distinct' or 'sequence', not {axis_style!r}")


def _package_section() -> dict[str, Any]:
    return {"tokenizer": {
        "algorithm": "bpe", "vocab_size": fx.VOCAB_SIZE,
        "artifacts": [{"location": "tokenizer.json"}],
        "special_tokens": {"eos": {"id": fx.EOS_ID, "content": fx.TOKENS[fx.EOS_ID]}}}}


def _common_inputs(sym: Symbols, dtype: str, spec: fx.FixtureSpec) -> dict[str, Any]:
    """Token ids, mask, positions, both cache initializers, the serving controls (required,
    no default: admission seeds them) and the context bound literal."""
    cache = contract(dtype, ["batch", fx.NUM_HEADS, sym.past, fx.HEAD_DIM])
    return {
        "request.input_ids": {
            "contract": contract("int64", ["batch", sym.query]),
            "role": {"kind": "runtime", "version": "1.0", "role": "prompt_tokens"},
            "source": {"kind": "request"}, "required": True},
        "request.attention_mask": opaque_input("attention_mask",
                                               contract("int64", ["batch", sym.total])),
        "request.position_ids": opaque_input("position_ids",
                                             contract("int64", ["batch", sym.query])),
        "request.past.key": opaque_input("past.key", cache),
        "request.past.value": opaque_input("past.value", cache),
        "request.active": opaque_input("active", contract("bool", ["batch"])),
        "request.done": opaque_input("done", contract("bool", ["batch"])),
        "request.accepted_len": opaque_input("accepted_len", contract("int64", ["batch"])),
        "package.max_context": {
            "contract": contract("int64", [1], aligned=False), "role": {"kind": "opaque"},
            "source": {"kind": "literal"}, "required": False, "default": spec.max_context},
    }


def _target_ports(sym: Symbols, dtype: str, with_hidden: bool) -> dict[str, Any]:
    cache = contract(dtype, ["batch", fx.NUM_HEADS, sym.past, fx.HEAD_DIM])
    present = contract(dtype, ["batch", fx.NUM_HEADS, sym.total, fx.HEAD_DIM])
    outputs = {"logits": contract(dtype, ["batch", sym.query, fx.VOCAB_SIZE])}
    roles = {"input_ids": "token_ids", "attention_mask": "attention_mask",
             "position_ids": "position_ids", "logits": "logits"}
    if with_hidden:
        outputs["hidden_states"] = contract(dtype, ["batch", sym.query, fx.CARRY_WIDTH])
        roles["hidden_states"] = "hidden_states"
    outputs["present.0.key"] = present
    outputs["present.0.value"] = dict(present)
    return {
        "inputs": {
            "input_ids": contract("int64", ["batch", sym.query]),
            "attention_mask": contract("int64", ["batch", sym.total]),
            "position_ids": contract("int64", ["batch", sym.query]),
            "past_key_values.0.key": cache,
            "past_key_values.0.value": dict(cache)},
        "outputs": outputs,
        "roles": roles,
    }


def _cells(sym: Symbols, dtype: str) -> dict[str, Any]:
    def cell(initializer: str) -> dict[str, Any]:
        return {"contract": contract(dtype, ["batch", fx.NUM_HEADS, sym.past, fx.HEAD_DIM]),
                "scope": "invocation", "initializer": initializer,
                "recurrence": {"kind": "bounded", "axis": 2, "max": "package.max_context"},
                "management": "runtime", "release_boundary": "invocation",
                "service_group": "attention"}
    return {"kv.key": cell("request.past.key"), "kv.value": cell("request.past.value")}


def _target_invoke(component: str, with_hidden: bool) -> dict[str, Any]:
    outputs = {"logits": f"{component}.logits"}
    if with_hidden:
        outputs["hidden_states"] = f"{component}.hidden_states"
    outputs["present.0.key"] = f"{component}.present.key"
    outputs["present.0.value"] = f"{component}.present.value"
    return {"kind": "invoke", "component": component, "inputs": {
        "input_ids": "request.input_ids", "attention_mask": "request.attention_mask",
        "position_ids": "request.position_ids",
        "past_key_values.0.key": "request.past.key",
        "past_key_values.0.value": "request.past.value"}, "outputs": outputs}


def _group(rollback_positions: int, ports: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "full_attention", "layout": "bnsh", "sequence_axis": 2,
            "update": {"kind": "append"},
            "reuse": {"prefix_reusable": True, "evictable_prefix": False},
            "capabilities": {"rollback_positions": rollback_positions, "snapshot": False,
                             "fork": False},
            "ports": ports}


def _owner_aliases() -> dict[str, Any]:
    return {"kv.key": {"input": "past_key_values.0.key", "output": "present.0.key",
                       "role": "key", "layer": 0},
            "kv.value": {"input": "past_key_values.0.value", "output": "present.0.value",
                         "role": "value", "layer": 0}}


def _component_contract(name: str, equivalence: str | None) -> dict[str, Any]:
    if equivalence is None:
        return {}
    return {"contract": {"id": f"speculant.fixture.{name}", "version": "1",
                         "equivalence": equivalence}}


def decoder_metadata(spec: fx.FixtureSpec, dtype: str = "float32", *,
                     artifact: str = "decoder/model.onnx", rollback_positions: int = 4,
                     axis_style: str = "distinct",
                     equivalence: str | None = None) -> dict[str, Any]:
    """The greedy decoder package (metadata.md §8.1, cells ``kv.key``/``kv.value``)."""
    sym = Symbols.for_style(axis_style)
    return {
        "schema_version": "v1",
        "model": {"vocab_size": fx.VOCAB_SIZE, "max_sequence_length": spec.max_context},
        "package": _package_section(),
        "pipeline": {"workflow": {
            "manifest": {"capabilities": list(CAPABILITIES)},
            "inputs": _common_inputs(sym, dtype, spec),
            "outputs": {"logits": {
                "contract": contract(dtype, ["batch", sym.query, fx.VOCAB_SIZE]),
                "role": "tensor", "stage": "pre_adapter"}},
            "components": {"decoder": {
                "implementation": {"kind": "onnx", "artifact": artifact},
                "ports": _target_ports(sym, dtype, with_hidden=False),
                **_component_contract("decoder", equivalence)}},
            "state": _cells(sym, dtype),
            "steps": [_target_invoke("decoder", with_hidden=False),
                      {"kind": "emit", "value": "decoder.logits", "output": "logits",
                       "mode": "replace"}],
            "serving": _serving({"decoder": _owner_aliases()}, rollback_positions),
        }},
        "generation": {"defaults": {"do_sample": False}},
    }


def _serving(ports: dict[str, Any], rollback_positions: int) -> dict[str, Any]:
    return {"active": "request.active", "done": "request.done",
            "accepted_len": "request.accepted_len",
            "state_service": {"groups": {"attention": _group(rollback_positions, ports)}}}


def chained_metadata(spec: fx.FixtureSpec, dtype: str = "float32", *,
                     target_artifact: str = "target/model.onnx.textproto",
                     assistant_artifact: str = "assistant/model.onnx.textproto",
                     axis_style: str = "distinct", borrowed_binding: str = "present",
                     declare_scale: bool = True, max_proposal_width: int = 4,
                     rollback_positions: int = 4, distribution_preserving: bool = True,
                     equivalence: str | None = None) -> dict[str, Any]:
    """The chained pair (the shape of metadata.md §8.2 with one group ``attention``).

    ``borrowed_binding``: what the proposer invoke binds the borrowed-cache ports to —
    ``"present"`` (the target's outputs, as §8.2) or ``"past"`` (the incoming request caches,
    as some packages in circulation do; the runtime ignores either binding).
    """
    if borrowed_binding not in ("present", "past"):
        raise ValueError("borrowed_binding must be 'present' or 'past'")
    sym = Symbols.for_style(axis_style)
    fused = contract(dtype, ["batch", sym.query, fx.FUSED_WIDTH])
    inputs = _common_inputs(sym, dtype, spec)
    inputs["request.inputs_embeds"] = {
        "contract": fused, "role": {"kind": "opaque"},
        "source": {"kind": "application", "name": "inputs_embeds"},
        "required": False, "default": 0.0}
    borrowed = contract(dtype, ["batch", fx.NUM_HEADS, sym.borrowed, fx.HEAD_DIM])
    proposer_vocab = spec.proposer_vocab_size or "vocab"  # a subset: its static width
    if spec.proposer_vocab_map is not None:
        proposer_vocab = spec.proposer_width
    assistant_ports = {
        "inputs": {
            "inputs_embeds": dict(fused),
            "position_ids": contract("int64", ["batch", sym.query]),
            "attention_mask": contract("int64", ["batch", sym.borrowed]),
            BORROWED_KEY: borrowed, BORROWED_VALUE: dict(borrowed)},
        "outputs": {
            "logits": contract(dtype, ["batch", sym.query, proposer_vocab]),
            "projected_state": contract(dtype, ["batch", sym.query, fx.CARRY_WIDTH])},
        "roles": {"inputs_embeds": "inputs_embeds", "position_ids": "position_ids",
                  "attention_mask": "attention_mask", "logits": "logits"}}
    cache_source = "target.present" if borrowed_binding == "present" else "request.past"
    return {
        "schema_version": "v1",
        "model": {"vocab_size": fx.VOCAB_SIZE, "max_sequence_length": spec.max_context},
        "package": _package_section(),
        "pipeline": {"workflow": {
            "manifest": {"capabilities": list(CAPABILITIES)},
            "inputs": inputs,
            "outputs": {"logits": {
                "contract": contract(dtype, ["batch", sym.query, fx.VOCAB_SIZE]),
                "role": "tensor", "stage": "pre_adapter"}},
            "components": {
                "target": {"implementation": {"kind": "onnx", "artifact": target_artifact},
                           "ports": _target_ports(sym, dtype, with_hidden=True),
                           **_component_contract("target", equivalence)},
                "assistant": {"implementation": {"kind": "onnx",
                                                 "artifact": assistant_artifact},
                              "ports": assistant_ports,
                              **_component_contract("assistant", equivalence)}},
            "state": _cells(sym, dtype),
            "steps": [
                _target_invoke("target", with_hidden=True),
                {"kind": "invoke", "component": "assistant", "inputs": {
                    "inputs_embeds": "request.inputs_embeds",
                    "position_ids": "request.position_ids",
                    "attention_mask": "request.attention_mask",
                    BORROWED_KEY: f"{cache_source}.key",
                    BORROWED_VALUE: f"{cache_source}.value"},
                 "outputs": {"logits": "draft.logits",
                             "projected_state": "draft.projected_state"}},
                {"kind": "emit", "value": "target.logits", "output": "logits",
                 "mode": "replace"}],
            "serving": _serving({
                "target": _owner_aliases(),
                "assistant": {
                    "kv.key": {"input": BORROWED_KEY, "access": "read_only", "role": "key"},
                    "kv.value": {"input": BORROWED_VALUE, "access": "read_only",
                                 "role": "value"}}}, rollback_positions),
        }},
        "speculative": chained_section(
            proposer_vocab_size=spec.proposer_vocab_size,
            max_proposal_width=max_proposal_width, rollback_state=["kv.key", "kv.value"],
            scale=fx.EMBEDDING_SCALE if declare_scale else None, table=TABLE_NAME,
            distribution_preserving=distribution_preserving,
            vocabulary_map=VOCABULARY_MAP if spec.proposer_vocab_map is not None else None),
        "generation": {"defaults": {"do_sample": False}},
    }
