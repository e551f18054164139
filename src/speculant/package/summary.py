"""A JSON-ready summary of a document, for `speculant inspect`: components with their ports
and roles, state groups with their cells and rollback bound, and the speculative contract
(the chain's facts as ``chain.derive`` reads them)."""

from __future__ import annotations

from typing import Any

from speculant.package import chain
from speculant.package.common import component_roles, groups_of, last_extent
from speculant.package.model import Document, TensorContract


def _contract(contract: TensorContract) -> dict[str, Any]:
    summary: dict[str, Any] = {"dtype": contract.dtype, "shape": contract.dims}
    if contract.optional:
        summary["optional"] = True
    return summary


def summarize(doc: Document) -> dict[str, Any]:
    """A JSON-ready summary of a document: components with their ports, state groups with
    their cells and rollback bound, and the speculative contract."""
    summary: dict[str, Any] = {"schema_version": doc.schema_version}
    if doc.model is not None:
        summary["model"] = {k: v for k, v in (("vocab_size", doc.model.vocab_size),
                                              ("max_sequence_length",
                                               doc.model.max_sequence_length)) if v is not None}
    if doc.pipeline is None:
        summary.update(components={}, state_groups={}, speculative=None)
        return summary
    wf = doc.workflow
    target, proposer = component_roles(doc)
    summary["capabilities"] = list(wf.manifest.capabilities)
    summary["inputs"] = {name: {**_contract(spec.contract), "source": spec.source.kind}
                         for name, spec in wf.inputs.items()}
    summary["outputs"] = {name: _contract(output.contract) for name, output in wf.outputs.items()}
    components = {}
    for name, component in wf.components.items():
        ports = component.ports
        components[name] = {
            "role": "target" if name == target else "proposer" if name == proposer else None,
            "implementation": component.implementation.kind,
            "artifact": component.implementation.artifact,
            "inputs": {p: _contract(c) for p, c in (ports.inputs if ports else {}).items()},
            "outputs": {p: _contract(c) for p, c in (ports.outputs if ports else {}).items()},
            "port_roles": dict(ports.roles) if ports else {},
        }
    summary["components"] = components
    groups = {}
    for name, group in groups_of(wf).items():
        cells = [c for c, cell in wf.state.items() if cell.service_group == name]
        groups[name] = {
            "kind": group.kind,
            "update": group.update.kind if group.update else "append",
            "cells": cells,
            "sequence_axis": group.sequence_axis,
            "rollback_positions": group.capabilities.rollback_positions,
            "aliases": {component: {cell: alias.access for cell, alias in aliases.items()}
                        for component, aliases in group.ports.items()},
        }
    ungrouped = [c for c, cell in wf.state.items() if cell.service_group not in groups]
    summary["state_groups"] = groups
    if ungrouped:
        summary["ungrouped_cells"] = ungrouped
    summary["steps"] = [step.kind if step.kind != "invoke" else f"invoke {step.component}"
                        for step in wf.steps]
    summary["speculative"] = _summarize_speculative(doc)
    summary["batch"] = batch_line(doc)
    return summary


def batch_line(doc: Document) -> str:
    """How many requests one target pass can take: ``up to N rows (artifact)`` where a state
    group's ``update.batch`` (speculant's extension of ``indexed_scatter``,
    docs/design/batching.md) declares a batched graph, else ``1 only``."""
    for group in groups_of(doc.workflow).values():
        batch = (group.update.model_extra or {}).get("batch") if group.update else None
        rows = batch.get("max_rows") if isinstance(batch, dict) else None
        if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1:
            artifacts = batch.get("artifacts")
            where = ", ".join(map(str, artifacts.values())) if isinstance(artifacts, dict) \
                else "no artifact named"
            return f"up to {rows} rows ({where})"
    return "1 only"


def _summarize_speculative(doc: Document) -> dict[str, Any] | None:
    spec = doc.speculative
    if spec is None:
        return None
    pe = spec.proposal_execution
    result: dict[str, Any] = {
        "target": spec.target,
        "proposer": spec.proposer,
        "vocabulary": spec.vocabulary.model_dump(exclude_none=True),
        "max_proposal_width": spec.max_proposal_width,
        "proposal_execution": pe.kind,
        "distribution_preserving": spec.distribution_preserving,
        "rollback_state": list(spec.rollback_state),
        "shared_state": list(spec.shared_state),
    }
    if pe.kind != "chained":
        return result
    facts = chain.derive(doc)
    assert facts is not None
    seed = pe.folded_carry_seed
    result.update({
        "fused_input": pe.token_embedding_input,
        "logits_output": pe.logits_output,
        "folded_carry_output": pe.folded_carry_output,
        "folded_carry_seed": seed.model_dump() if seed else None,
        "token_embedding": pe.token_embedding.model_dump(exclude_none=True)
        if pe.token_embedding else None,
        "currency": facts.fused.dtype if facts.fused else None,
        "fused_width": last_extent(facts.fused),
        "carry_width": last_extent(facts.seed),
        "position_symbol": facts.position_symbol,
        "borrowed_cache_symbols": dict(facts.borrowed_symbols),
    })
    return result
