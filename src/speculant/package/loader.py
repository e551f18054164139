"""Folder on disk -> validated :class:`Package` (metadata.md §1–§7).

``load_package`` runs discovery -> parse -> the §6 rules (all collected) -> the support check
-> path confinement -> admission against the graphs (only once §6 passed, §1 rule 3) ->
``derive_plan``. ``load_metadata_only`` stops after the document checks and returns the
unsupported features instead of raising them, for ``speculant inspect --metadata-only``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx

from speculant.errors import MetadataError, Problem, ProblemCollector
from speculant.package.admission import admit, read_graph
from speculant.package.builtin import builtin_names, resolve_package
from speculant.package.document import find_metadata, read_document
from speculant.package.model import Document, TensorContract
from speculant.package.package import Package
from speculant.package.paths import confine
from speculant.package.plan import derive_plan
from speculant.package.rules import (
    WF,
    borrowed_symbols,
    canonical_tokenizer,
    groups_of,
    last_extent,
    position_symbol,
    validate_document,
)
from speculant.package.support import component_roles, unsupported_problems

TOKENIZER_NAME = "tokenizer.json"


def load_package(root: str | Path) -> Package:
    """Load, validate and admit the package in folder ``root``.

    Raises ``MetadataError``, ``UnsupportedError`` or ``AdmissionError`` carrying every
    problem found at that stage (``.problems``)."""
    root = Path(os.path.realpath(resolve_package(root)))  # a built-in name: its folder
    if not root.is_dir():
        raise MetadataError(f"no inference_metadata.{{yaml,yml,json}} in {root} (not a folder)",
                            file=str(root), expected="a package folder, or a built-in "
                            f"package name ({', '.join(builtin_names())})")
    metadata_file = find_metadata(root)
    file = str(metadata_file)
    doc = read_document(metadata_file)

    problems = ProblemCollector(file)
    problems.extend(validate_document(doc, file))
    problems.extend(unsupported_problems(doc, file))
    artifacts = _confine_artifacts(doc, root, problems)
    tokenizer_file = _resolve_tokenizer(doc, root, problems)
    problems.raise_if_any()

    admission = ProblemCollector(file)
    graphs: dict[str, onnx.ModelProto] = {}
    for component, artifact in artifacts.items():
        field = f"{WF}.components.{component}.implementation.artifact"
        model = read_graph(component, artifact, root, field, admission)
        if model is not None:
            graphs[component] = model
    embedding_width = None
    if len(graphs) == len(artifacts):
        embedding_width = admit(doc, graphs, {c: str(p) for c, p in artifacts.items()},
                                admission)
    admission.raise_if_any()

    return Package(root=root, metadata_file=metadata_file, document=doc,
                   plan=derive_plan(doc), artifacts=artifacts, graphs=graphs,
                   tokenizer_file=tokenizer_file, embedding_width=embedding_width)


def load_metadata_only(path: str | Path) -> tuple[Document, list[Problem]]:
    """Parse and validate one metadata file (or the one a package folder holds), without
    artifacts. Raises ``MetadataError`` for a document that breaks the standard; returns the
    document and its ``UnsupportedError`` findings (features speculant cannot execute)."""
    path = Path(path)
    if path.is_dir():
        path = find_metadata(path)
    doc = read_document(path)
    problems = ProblemCollector(str(path))
    problems.extend(validate_document(doc, str(path)))
    problems.raise_if_any()
    return doc, unsupported_problems(doc, str(path))


# -- paths --------------------------------------------------------------------------------
def _confine_artifacts(doc: Document, root: Path, problems: ProblemCollector) -> dict[str, Path]:
    """Component -> confined artifact file (P2, P3; P1 was reported by the rules)."""
    if doc.pipeline is None:
        return {}
    artifacts = {}
    for name, component in doc.workflow.components.items():
        impl = component.implementation
        if impl.kind != "onnx" or not impl.artifact:
            continue
        resolved = confine(root, impl.artifact, f"{WF}.components.{name}.implementation.artifact",
                           problems, report_lexical=False, what="artifact")
        if resolved is not None:
            artifacts[name] = resolved
    return artifacts


def _resolve_tokenizer(doc: Document, root: Path, problems: ProblemCollector) -> Path | None:
    """§2.4: declared artifacts are confined and the canonical one used; otherwise
    ``<root>/tokenizer.json`` if present; otherwise none (text APIs then refuse)."""
    tokenizer = doc.package.tokenizer if doc.package else None
    declared = tokenizer.artifacts if tokenizer and tokenizer.artifacts else []
    if not declared:
        if not (root / TOKENIZER_NAME).exists():
            return None
        return confine(root, TOKENIZER_NAME, "package.tokenizer", problems,
                       what="tokenizer")
    resolved = [confine(root, a.location, f"package.tokenizer.artifacts.{i}.location",
                        problems, report_lexical=False, what="tokenizer artifact")
                for i, a in enumerate(declared)]
    index = canonical_tokenizer(declared)  # None was reported by the rules (rule 5)
    return resolved[index] if index is not None else None


# -- summary for `speculant inspect` ------------------------------------------------------
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
    return summary


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
    components = doc.workflow.components
    proposer, target = components.get(spec.proposer), components.get(spec.target)
    fused = proposer.ports.inputs.get(pe.token_embedding_input or "") if proposer and \
        proposer.ports else None
    seed = pe.folded_carry_seed
    seed_contract = target.ports.outputs.get(seed.output) if seed and target and \
        target.ports else None
    result.update({
        "fused_input": pe.token_embedding_input,
        "logits_output": pe.logits_output,
        "folded_carry_output": pe.folded_carry_output,
        "folded_carry_seed": seed.model_dump() if seed else None,
        "token_embedding": pe.token_embedding.model_dump(exclude_none=True)
        if pe.token_embedding else None,
        "currency": fused.dtype if fused else None,
        "fused_width": last_extent(fused),
        "carry_width": last_extent(seed_contract),
        "position_symbol": position_symbol(doc),
        "borrowed_cache_symbols": borrowed_symbols(doc),
    })
    return result
