"""``inference_metadata.yaml`` of the exported packages, as plain dicts.

The pair follows docs/design/spec/metadata.md §8.2: one state group ``attention`` holds each
layer's key and value cells (``kv.{i}.key|value``, owned by ``target``); the drafter ``assistant``
borrows the last layer's two cells through ``read_only`` aliases. The draft-model package
follows the greedy-decoder example (component ``decoder``). Shape symbols: ``sequence``
(tokens of a pass), ``past_sequence`` (cache it reads), ``total_sequence`` (cache it returns,
and the mask), ``kv_sequence`` (cache the drafter borrows).

:func:`static_cache_form` turns either document into the static-cache form of catalogue
document 18 (fixed-capacity cells written by ``indexed_scatter``, ``logical_lengths``); the
mapping of its fields onto the graphs is in docs/design/static-cache.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculant_tools.export.config import EMBEDDING, LlamaConfig
from speculant_tools.export.graphs import (
    BORROWED_KEY,
    BORROWED_VALUE,
    CAPACITY,
    FUSED_SEED,
    LENGTHS,
)
from speculant_tools.writing import CAPABILITIES, contract, opaque_input

GROUP = "attention"


@dataclass(frozen=True)
class TokenizerFacts:
    """What ``package.tokenizer`` declares (the file is copied as ``tokenizer.json``)."""

    algorithm: str  # e.g. "bpe"
    vocab_size: int  # entries including added tokens
    byte_level: bool
    eos_id: int
    eos_content: str

    def section(self) -> dict[str, Any]:
        return {"tokenizer": {
            "algorithm": self.algorithm, "vocab_size": self.vocab_size,
            "byte_level": self.byte_level, "artifacts": [{"location": "tokenizer.json"}],
            "special_tokens": {"eos": {"id": self.eos_id, "content": self.eos_content}}}}


def _cache(c: LlamaConfig, dtype: str, symbol: str) -> dict[str, Any]:
    return contract(dtype, ["batch", c.num_key_value_heads, symbol, c.head_dim])


def _inputs(c: LlamaConfig, dtype: str) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "request.input_ids": {
            "contract": contract("int64", ["batch", "sequence"]),
            "role": {"kind": "runtime", "version": "1.0", "role": "prompt_tokens"},
            "source": {"kind": "request"}, "required": True},
        "request.attention_mask": opaque_input("attention_mask",
                                               contract("int64", ["batch", "total_sequence"])),
        "request.position_ids": opaque_input("position_ids",
                                             contract("int64", ["batch", "sequence"]))}
    for i in range(c.num_hidden_layers):
        for part in ("key", "value"):
            inputs[f"request.past.{i}.{part}"] = opaque_input(
                f"past.{i}.{part}", _cache(c, dtype, "past_sequence"))
    inputs.update({
        "request.active": opaque_input("active", contract("bool", ["batch"])),
        "request.done": opaque_input("done", contract("bool", ["batch"])),
        "request.accepted_len": opaque_input("accepted_len", contract("int64", ["batch"])),
        "package.max_context": {
            "contract": contract("int64", [1], aligned=False), "role": {"kind": "opaque"},
            "source": {"kind": "literal"}, "required": False,
            "default": c.max_position_embeddings}})
    return inputs


def _cells(c: LlamaConfig, dtype: str) -> dict[str, Any]:
    return {f"kv.{i}.{part}": {
        "contract": _cache(c, dtype, "past_sequence"), "scope": "invocation",
        "initializer": f"request.past.{i}.{part}",
        "recurrence": {"kind": "bounded", "axis": 2, "max": "package.max_context"},
        "management": "runtime", "release_boundary": "invocation", "service_group": GROUP}
        for i in range(c.num_hidden_layers) for part in ("key", "value")}


def _decoder_ports(c: LlamaConfig, dtype: str, with_hidden: bool) -> dict[str, Any]:
    inputs = {"input_ids": contract("int64", ["batch", "sequence"]),
              "attention_mask": contract("int64", ["batch", "total_sequence"]),
              "position_ids": contract("int64", ["batch", "sequence"])}
    outputs = {"logits": contract(dtype, ["batch", "sequence", c.vocab_size])}
    roles = {"input_ids": "token_ids", "attention_mask": "attention_mask",
             "position_ids": "position_ids", "logits": "logits"}
    if with_hidden:
        outputs["hidden_states"] = contract(dtype, ["batch", "sequence", c.hidden_size])
        roles["hidden_states"] = "hidden_states"
    for i in range(c.num_hidden_layers):
        for part in ("key", "value"):
            inputs[f"past_key_values.{i}.{part}"] = _cache(c, dtype, "past_sequence")
            outputs[f"present.{i}.{part}"] = _cache(c, dtype, "total_sequence")
    return {"inputs": inputs, "outputs": outputs, "roles": roles}


def _decoder_invoke(c: LlamaConfig, component: str, with_hidden: bool) -> dict[str, Any]:
    inputs = {"input_ids": "request.input_ids", "attention_mask": "request.attention_mask",
              "position_ids": "request.position_ids"}
    outputs = {"logits": f"{component}.logits"}
    if with_hidden:
        outputs["hidden_states"] = f"{component}.hidden_states"
    for i in range(c.num_hidden_layers):
        for part in ("key", "value"):
            inputs[f"past_key_values.{i}.{part}"] = f"request.past.{i}.{part}"
            outputs[f"present.{i}.{part}"] = f"{component}.present.{i}.{part}"
    return {"kind": "invoke", "component": component, "inputs": inputs, "outputs": outputs}


def _owner_aliases(c: LlamaConfig) -> dict[str, Any]:
    return {f"kv.{i}.{part}": {"input": f"past_key_values.{i}.{part}",
                               "output": f"present.{i}.{part}", "role": part, "layer": i}
            for i in range(c.num_hidden_layers) for part in ("key", "value")}


def _serving(ports: dict[str, Any], rollback_positions: int) -> dict[str, Any]:
    group = {"kind": "full_attention", "layout": "bnsh", "sequence_axis": 2,
             "update": {"kind": "append"},
             "reuse": {"prefix_reusable": True, "evictable_prefix": False},
             "capabilities": {"rollback_positions": rollback_positions, "snapshot": False,
                              "fork": False},
             "ports": ports}
    return {"active": "request.active", "done": "request.done",
            "accepted_len": "request.accepted_len",
            "state_service": {"groups": {GROUP: group}}}


def _document(c: LlamaConfig, dtype: str, tokenizer: TokenizerFacts,
              workflow: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema_version": "v1",
        "model": {"vocab_size": c.vocab_size, "max_sequence_length": c.max_position_embeddings},
        "package": tokenizer.section(),
        "pipeline": {"workflow": {
            "manifest": {"capabilities": list(CAPABILITIES)},
            "inputs": _inputs(c, dtype),
            "outputs": {"logits": {
                "contract": contract(dtype, ["batch", "sequence", c.vocab_size]),
                "role": "tensor", "stage": "pre_adapter"}},
            **workflow}},
        "generation": {"defaults": {"do_sample": False}},
    }


def decoder_metadata(config: LlamaConfig, dtype: str, tokenizer: TokenizerFacts, *,
                     rollback_positions: int = 8, component: str = "decoder") -> dict[str, Any]:
    """A plain greedy decoder package, its one component named ``component``."""
    c = config
    document = _document(c, dtype, tokenizer, {
        "components": {component: {
            "implementation": {"kind": "onnx", "artifact": f"{component}/model.onnx"},
            "ports": _decoder_ports(c, dtype, with_hidden=False)}},
        "state": _cells(c, dtype),
        "steps": [_decoder_invoke(c, component, with_hidden=False),
                  {"kind": "emit", "value": f"{component}.logits", "output": "logits",
                   "mode": "replace"}],
        "serving": _serving({component: _owner_aliases(c)}, rollback_positions)})
    return document


def pair_metadata(config: LlamaConfig, dtype: str, tokenizer: TokenizerFacts, *,
                  scale: float, max_proposal_width: int = 8,
                  rollback_positions: int = 8) -> dict[str, Any]:
    """The chained pair (one state group): ``target`` and ``assistant``."""
    c = config
    last = c.num_hidden_layers - 1
    fused = contract(dtype, ["batch", "sequence", 2 * c.hidden_size])
    borrowed = _cache(c, dtype, "kv_sequence")
    assistant_ports = {
        "inputs": {"inputs_embeds": fused,
                   "position_ids": contract("int64", ["batch", "sequence"]),
                   "attention_mask": contract("int64", ["batch", "kv_sequence"]),
                   BORROWED_KEY: borrowed, BORROWED_VALUE: dict(borrowed)},
        "outputs": {"logits": contract(dtype, ["batch", "sequence", c.draft_vocab_size]),
                    "projected_state": contract(dtype, ["batch", "sequence", c.hidden_size])},
        "roles": {"inputs_embeds": "inputs_embeds", "position_ids": "position_ids",
                  "attention_mask": "attention_mask", "logits": "logits"}}
    document = _document(c, dtype, tokenizer, {
        "components": {
            "target": {"implementation": {"kind": "onnx", "artifact": "target/model.onnx"},
                       "ports": _decoder_ports(c, dtype, with_hidden=True)},
            "assistant": {"implementation": {"kind": "onnx",
                                             "artifact": "assistant/model.onnx"},
                          "ports": assistant_ports}},
        "state": _cells(c, dtype),
        "steps": [
            _decoder_invoke(c, "target", with_hidden=True),
            # Declares the chain's bindings; a pass never executes it (the chain binds it).
            {"kind": "invoke", "component": "assistant", "inputs": {
                "inputs_embeds": "request.inputs_embeds",
                "position_ids": "request.position_ids",
                "attention_mask": "request.attention_mask",
                BORROWED_KEY: f"target.present.{last}.key",
                BORROWED_VALUE: f"target.present.{last}.value"},
             "outputs": {"logits": "draft.logits", "projected_state": "draft.projected_state"}},
            {"kind": "emit", "value": "target.logits", "output": "logits", "mode": "replace"}],
        "serving": _serving({
            "target": _owner_aliases(c),
            "assistant": {
                f"kv.{last}.key": {"input": BORROWED_KEY, "access": "read_only",
                                   "role": "key", "layer": last},
                f"kv.{last}.value": {"input": BORROWED_VALUE, "access": "read_only",
                                     "role": "value", "layer": last}}}, rollback_positions)})
    # The fused input: a zero default keeps the workflow complete; the chain builds it.
    document["pipeline"]["workflow"]["inputs"]["request.inputs_embeds"] = {
        "contract": dict(fused), "role": {"kind": "opaque"},
        "source": {"kind": "application", "name": "inputs_embeds"},
        "required": False, "default": 0.0}
    document["speculative"] = chained_section(
        proposer_vocab_size=c.draft_vocab_size if c.has_subset_vocabulary else None,
        max_proposal_width=max_proposal_width, rollback_state=list(_cells(c, dtype)),
        scale=float(scale))
    if c.seed_feature_layers is not None:
        _fused_seed(document, c, dtype)
    return document


def _fused_seed(document: dict[str, Any], c: LlamaConfig, dtype: str) -> None:
    """The target declares and returns ``fused_hidden_states`` [b, s, hidden] (its graph's
    :meth:`~speculant_tools.export.graphs._Graph.seed_output`), and the chain seeds its
    carry from it instead of ``hidden_states``: one tensor of the hidden width, as before."""
    workflow = document["pipeline"]["workflow"]
    ports = workflow["components"]["target"]["ports"]
    ports["outputs"][FUSED_SEED] = contract(dtype, ["batch", "sequence", c.hidden_size])
    workflow["steps"][0]["outputs"][FUSED_SEED] = f"target.{FUSED_SEED}"
    execution = document["speculative"]["proposal_execution"]
    execution["folded_carry_seed"]["output"] = FUSED_SEED


def chained_section(*, proposer_vocab_size: int | None, max_proposal_width: int,
                    rollback_state: list[str], scale: float | None, table: str = EMBEDDING,
                    distribution_preserving: bool = True,
                    vocabulary_map: str | None = None) -> dict[str, Any]:
    """The ``speculative`` section of a chained pair: ``assistant`` proposes for ``target``,
    embedding each token through the target's ``table`` (times ``scale``; None declares none)
    and seeding its carry from the target's ``hidden_states``; the group ``attention`` is
    shared and ``rollback_state`` names its cells. ``proposer_vocab_size`` None: identical
    vocabularies; an int: the drafter's subset; ``vocabulary_map``: the artifact of a mapped
    vocabulary's draft-to-target map."""
    token_embedding: dict[str, Any] = {"component": "target", "table": table}
    if scale is not None:
        token_embedding["scale"] = scale
    return {
        "proposer": "assistant", "target": "target",
        "vocabulary": {"kind": "mapped", "artifact": vocabulary_map} if vocabulary_map else
        {"kind": "identical"} if proposer_vocab_size is None else
        {"kind": "subset", "proposer_vocab_size": proposer_vocab_size},
        "max_proposal_width": max_proposal_width,
        "distribution_preserving": distribution_preserving,
        "proposal_execution": {
            "kind": "chained", "token_embedding_input": "inputs_embeds",
            "logits_output": "logits", "folded_carry_output": "projected_state",
            "folded_carry_seed": {"component": "target", "output": "hidden_states"},
            "token_embedding": token_embedding},
        "port_bindings": {"target_hidden_context": "inputs_embeds"},
        "shared_state": [GROUP],
        "rollback_state": rollback_state,
    }


# -- the static-cache form (catalogue document 18) ----------------------------------------------
CACHE_SYMBOLS = ("past_sequence", "total_sequence", "kv_sequence")  # -> CAPACITY
LENGTHS_INPUT = f"request.{LENGTHS}"


def _to_capacity(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "shape": [CAPACITY if axis in CACHE_SYMBOLS else axis
                              for axis in body["shape"]]}


def static_cache_form(document: dict[str, Any], config: LlamaConfig) -> dict[str, Any]:
    """The document of the same components built with ``cache="static"``: every KV cell and
    cache port has the extent ``capacity`` on axis 2 (recurrence ``invariant``: the buffer
    never grows); the cell ``cache_lengths`` [batch] int64 is the valid length, the group's
    ``logical_lengths``, and its ``indexed_scatter`` write index (a pass writes its block at
    ``[cache_lengths, cache_lengths + s)``: one contiguous sequence); each component's
    ``attention_mask`` port becomes the ``cache_lengths`` port; ``package.capacity`` (default:
    the context) bounds the cells. Modified in place and returned."""
    workflow = document["pipeline"]["workflow"]
    inputs = workflow["inputs"]
    del inputs["request.attention_mask"], inputs["package.max_context"]
    for name in [n for n in inputs if n.startswith("request.past.")]:
        inputs[name]["contract"] = _to_capacity(inputs[name]["contract"])
    inputs[LENGTHS_INPUT] = opaque_input(LENGTHS, contract("int64", ["batch"]))
    inputs["package.capacity"] = {
        "contract": contract("int64", [1], aligned=False), "role": {"kind": "opaque"},
        "source": {"kind": "literal"}, "required": False,
        "default": config.max_position_embeddings}
    for cell in workflow["state"].values():
        cell["contract"] = _to_capacity(cell["contract"])
        cell["recurrence"] = {"kind": "invariant"}
    workflow["state"][LENGTHS] = {
        "contract": contract("int64", ["batch"]), "scope": "invocation",
        "initializer": LENGTHS_INPUT, "recurrence": {"kind": "invariant"},
        "management": "runtime", "release_boundary": "invocation"}
    for component in workflow["components"].values():
        ports = component["ports"]
        ports["inputs"] = {(LENGTHS if port == "attention_mask" else port):
                           (contract("int64", ["batch"]) if port == "attention_mask"
                            else _to_capacity(body)) for port, body in ports["inputs"].items()}
        ports["outputs"] = {port: _to_capacity(body) for port, body in ports["outputs"].items()}
        ports["roles"].pop("attention_mask", None)
    for step in workflow["steps"]:
        if step["kind"] == "invoke" and "attention_mask" in step["inputs"]:
            step["inputs"] = {(LENGTHS if port == "attention_mask" else port):
                              (LENGTHS_INPUT if port == "attention_mask" else value)
                              for port, value in step["inputs"].items()}
    group = workflow["serving"]["state_service"]["groups"][GROUP]
    readers = {name: LENGTHS for name in workflow["components"]}
    group["logical_lengths"] = LENGTHS
    group["update"] = {"kind": "indexed_scatter", "write_indices": LENGTHS,
                       "capacity": "package.capacity", "write_indices_ports": {
                           name: LENGTHS for name, aliases in group["ports"].items()
                           if any("output" in alias for alias in aliases.values())},
                       "kv_length_ports": readers}
    return document


BATCH = "batch"  # speculant's extension of the indexed_scatter update (docs/design/batching.md)


def batched_form(document: dict[str, Any], component: str, max_rows: int,
                 borrowers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The static-cache ``document`` declaring that ``component`` can run a batched pass of
    up to ``max_rows`` rows: ``update.batch`` of the group names the batched graph's artifact
    (``{component}/batched.onnx``; the static ports plus ``block_lengths`` [batch] int64) and
    its row-width port. Each of ``borrowers`` (the chained drafter) runs its own artifact at
    ``B`` rows as it stands: it reads rows of ``component``'s buffers (``cache_lengths``
    [batch], one per row), writes none and needs no row width, so its entry is its artifact
    and it has no ``block_lengths`` port. The components' own artifacts stay the batch-1
    graphs. Modified in place and returned."""
    workflow = document["pipeline"]["workflow"]
    group = workflow["serving"]["state_service"]["groups"][GROUP]
    artifacts = {component: f"{component}/batched.onnx"}
    artifacts.update({name: workflow["components"][name]["implementation"]["artifact"]
                      for name in borrowers})
    group["update"][BATCH] = {"max_rows": max_rows, "artifacts": artifacts,
                              "block_lengths_ports": {component: "block_lengths"}}
    return document


def batch_rows(document: dict[str, Any]) -> int | None:
    """``max_rows`` of a document in :func:`batched_form`, else None."""
    groups = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"]
    rows = [(group.get("update") or {}).get(BATCH, {}).get("max_rows")
            for group in groups.values()]
    return next((n for n in rows if n is not None), None)


def cache_form(document: dict[str, Any]) -> str:
    """``static`` for a document in :func:`static_cache_form`, else ``appended``."""
    groups = document["pipeline"]["workflow"]["serving"]["state_service"]["groups"]
    kinds = {(group.get("update") or {}).get("kind", "append") for group in groups.values()}
    return "static" if kinds == {"indexed_scatter"} else "appended"
