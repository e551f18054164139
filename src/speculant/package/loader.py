"""Folder on disk -> validated :class:`Package` (docs/design/spec/metadata.md §1–7).

The features run in order, each owning its rules, its unsupported cases, its admission and
its part of the plan: ``top`` (the top-level sections), ``io`` (inputs, outputs, components,
ports), ``steps`` (the SSA walk), ``state`` (cells, groups, rollback), ``static`` (fixed-capacity
caches), ``serving`` (the controls), ``chain`` (the chained contract).

``load_package`` runs discovery -> parse -> every feature's document checks (all collected)
-> path confinement -> admission against the graphs (only once the document passed) ->
``derive_plan``. ``load_metadata_only`` stops after the document checks and returns the
unsupported features instead of raising them, for ``speculant inspect --metadata-only``.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from speculant.errors import MetadataError, Problem, ProblemCollector, UnsupportedError
from speculant.package import chain, io, serving, state, static, steps, top
from speculant.package.builtin import builtin_names, resolve_package
from speculant.package.common import WF, rule_of
from speculant.package.document import find_metadata, read_document
from speculant.package.graphs import read_graph
from speculant.package.model import Document
from speculant.package.package import Package
from speculant.package.paths import confine
from speculant.package.plan import DRIVER_PORT_ROLES, LoadPlan


def document_problems(doc: Document, file: str = "",
                      facts: chain.ChainFacts | None = None) -> list[Problem]:
    """Every finding about the document alone (MetadataError and UnsupportedError), in
    feature order. Every check tolerates a document that breaks other rules. ``facts``: the
    chain's facts when the caller derived them already."""
    out = ProblemCollector(file)
    top.check(doc, out)
    if doc.pipeline is None:
        return out.problems
    io.check(doc, out)
    values = steps.check(doc, out)
    state.check(doc, values, out)
    static.check(doc, out)
    serving.check(doc, values, out)
    chain.check(doc, facts or chain.derive(doc), out)
    return out.problems


def validate_document(doc: Document, file: str = "") -> list[Problem]:
    """Every `MetadataError` this document earns (empty when it is valid)."""
    return [p for p in document_problems(doc, file) if p.kind is MetadataError]


def unsupported_problems(doc: Document, file: str = "") -> list[Problem]:
    """Every `UnsupportedError` this document earns (empty when speculant can run it)."""
    return [p for p in document_problems(doc, file) if p.kind is UnsupportedError]


def load_package(root: str | Path, device: str = "cpu") -> Package:
    """Load, validate and admit the package in folder ``root`` (or the built-in of that name,
    as made for ``device``).

    Raises ``MetadataError``, ``UnsupportedError`` or ``AdmissionError`` carrying every
    problem found at that stage (``.problems``)."""
    root = Path(os.path.realpath(resolve_package(root, device)))  # a built-in: its folder
    if not root.is_dir():
        raise MetadataError(f"no inference_metadata.{{yaml,yml,json}} in {root} (not a folder)",
                            file=str(root), expected="a package folder, or a built-in "
                            f"package name ({', '.join(builtin_names())})")
    metadata_file = find_metadata(root)
    file = str(metadata_file)
    doc = read_document(metadata_file)

    facts = chain.derive(doc)  # sigma, kappa and the chain's contracts, read once
    problems = ProblemCollector(file)
    problems.extend(document_problems(doc, file, facts))
    with rule_of(problems, "4"):  # P2, P3
        artifacts = _confine_artifacts(doc, root, problems)
        tokenizer_file = top.resolve_tokenizer(doc, root, problems)
    problems.raise_if_any()

    admission = ProblemCollector(file)
    graphs: dict[str, onnx.ModelProto] = {}
    for component, artifact in artifacts.items():
        field = f"{WF}.components.{component}.implementation.artifact"
        with rule_of(admission, "4"):  # external data: P2, P3 (A1 carries its own id)
            model = read_graph(component, artifact, root, field, admission)
        if model is not None:
            graphs[component] = model
    embedding_width = None
    if len(graphs) == len(artifacts):
        files = {c: str(p) for c, p in artifacts.items()}
        io.admit(doc, graphs, files, admission)
        steps.admit(doc, graphs, files, admission)
        embedding_width = chain.admit(doc, graphs, files, admission, root)
    admission.raise_if_any()

    plan = derive_plan(doc, facts)
    batch = plan.static.batch if plan.static is not None else None
    with rule_of(admission, "4"):  # the batched graph's file: P2, P3
        batched = confine(root, batch.artifact, batch.field, admission,
                          what="batched artifact") if batch else None
    admission.raise_if_any()
    return Package(root=root, metadata_file=metadata_file, document=doc, plan=plan,
                   artifacts=artifacts, graphs=graphs, tokenizer_file=tokenizer_file,
                   embedding_width=embedding_width, batched_artifact=batched)


def load_metadata_only(path: str | Path) -> tuple[Document, list[Problem]]:
    """Parse and validate one metadata file (or the one a package folder holds), without
    artifacts. Raises ``MetadataError`` for a document that breaks the standard; returns the
    document and its ``UnsupportedError`` findings (features speculant cannot execute)."""
    path = Path(path)
    if path.is_dir():
        path = find_metadata(path)
    doc = read_document(path)
    found = document_problems(doc, str(path))
    problems = ProblemCollector(str(path))
    problems.extend(p for p in found if p.kind is MetadataError)
    problems.raise_if_any()
    return doc, [p for p in found if p.kind is UnsupportedError]


def derive_plan(doc: Document, facts: chain.ChainFacts | None = None) -> LoadPlan:
    """What load derives for the runtime, each part from the feature that owns it. ``doc`` must
    have passed the document checks; ``facts``: the chain's facts when already derived."""
    target, proposer = runnable_roles(doc)
    target_inputs, target_outputs = steps.invoke_bindings(doc, target)
    proposer_inputs = steps.invoke_bindings(doc, proposer)[0] if proposer else {}
    port_by_role = {role: port for port, role in io.port_roles(doc, target).items()}
    cells = state.target_cells(doc, target)
    driver_bound = {target_inputs[port_by_role[role]]: role for role in DRIVER_PORT_ROLES
                    if port_by_role.get(role) in target_inputs}
    driver_bound.update({cell.initializer: f"cell:{cell.name}" for cell in cells.values()})
    static_plan = static.plan(doc, target)
    if static_plan is not None:  # L, bound by the driver on every pass
        driver_bound[static_plan.lengths_input] = "cache_lengths"
        driver_bound[static_plan.write_indices_input] = "cache_lengths"  # the block's slot
    undeclared_bound = state.group_rollback_bound(doc, cells)
    spec = doc.speculative
    facts = facts or chain.derive(doc)
    chain_plan = chain.plan(doc, facts) if facts is not None else None
    return LoadPlan(
        target=target, proposer=proposer, target_inputs=target_inputs,
        target_outputs=target_outputs, proposer_inputs=proposer_inputs,
        port_by_role=port_by_role, driver_bound=driver_bound, cells=cells,
        rollback_state=tuple(spec.rollback_state) if spec else tuple(cells),
        context_cap_inputs=tuple(sorted({c.max_value for c in cells.values() if c.max_value})),
        context_cap=top.context_cap(doc),
        rollback_bound=spec.max_proposal_width if spec else undeclared_bound,
        undeclared_rollback_bound=undeclared_bound, serving=serving.controls(doc),
        eos_ids=top.eos_ids(doc), chain=chain_plan,
        chain_bound_inputs=chain.chain_bound_inputs(doc, chain_plan), static=static_plan)


def runnable_roles(doc: Document) -> tuple[str, str | None]:
    """(target, proposer) of a valid runnable document."""
    if doc.speculative is not None:
        return doc.speculative.target, doc.speculative.proposer
    return next(iter(doc.workflow.components)), None


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
