"""What load derives for the runtime (metadata.md §5), from a document that passed §6.

The plan names everything the interpreter needs by role, so that nothing downstream re-reads
the document to find out which port is the token ids or which cells roll back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.package.model import Document, TensorContract

DRIVER_PORT_ROLES = ("token_ids", "position_ids", "attention_mask")


@dataclass(frozen=True)
class CellPlan:
    """One runtime-managed state cell, as the target owns it."""

    name: str
    group: str
    contract: TensorContract
    initializer: str  # workflow input that carries the cell into a pass
    owner_input: str  # target port the cell enters through
    owner_output: str  # target port that hands out its next value (the present)
    sequence_axis: int  # the axis caches grow on and rollback truncates
    max_value: str | None  # workflow input naming the recurrence bound, if any


@dataclass(frozen=True)
class ChainPlan:
    """The chained proposal, resolved (runtime.md §9.1)."""

    fused_port: str  # proposer input rebuilt every step: concat(embed, carry)
    logits_output: str
    carry_output: str  # proposer's folded_carry_output
    seed_output: str  # target output that seeds carry_0
    table: str  # target initializer with the token embeddings
    scale: float | None
    currency: str  # dtype of the fused port
    fused_width: int | None  # W_F when static
    carry_width: int | None  # W_C when static
    position_symbol: str | None  # sigma
    kv_symbol: str | None  # kappa
    borrowed: dict[str, str]  # proposer port -> cell it reads (read_only aliases)


@dataclass(frozen=True)
class LoadPlan:
    target: str
    proposer: str | None
    target_inputs: dict[str, str]  # target port -> workflow value (the target invoke)
    target_outputs: dict[str, str]  # target port -> produced value name
    proposer_inputs: dict[str, str]  # proposer port -> value (its declared invoke)
    port_by_role: dict[str, str]  # target port role -> port (token_ids, logits, ...)
    driver_bound: dict[str, str]  # workflow value -> what the driver binds (role or cell)
    cells: dict[str, CellPlan]
    rollback_state: tuple[str, ...]
    context_cap_inputs: tuple[str, ...]  # workflow inputs whose value caps the context
    context_cap: int | None  # from model.max_sequence_length / generation.max_length
    rollback_bound: int | None  # k bound for the declared proposer / undeclared proposers
    undeclared_rollback_bound: int | None
    serving: dict[str, str] = field(default_factory=dict)  # control -> workflow input name
    eos_ids: tuple[int, ...] = ()
    chain: ChainPlan | None = None


def _invoke_of(doc: Document, component: str) -> tuple[dict[str, str], dict[str, str]]:
    for step in doc.workflow.steps:
        if step.kind == "invoke" and step.component == component:
            return dict(step.inputs or {}), dict(step.outputs or {})
    return {}, {}


def target_name(doc: Document) -> str:
    if doc.speculative is not None:
        return doc.speculative.target
    return next(iter(doc.workflow.components))


def derive_plan(doc: Document) -> LoadPlan:
    """The load products of metadata.md §5. ``doc`` must have passed validation."""
    wf = doc.workflow
    target = target_name(doc)
    proposer = doc.speculative.proposer if doc.speculative else None
    target_inputs, target_outputs = _invoke_of(doc, target)
    proposer_inputs = _invoke_of(doc, proposer)[0] if proposer else {}
    ports = wf.components[target].ports
    port_by_role = {role: port for port, role in (ports.roles if ports else {}).items()}

    cells: dict[str, CellPlan] = {}
    borrowed: dict[str, str] = {}
    groups = wf.serving.state_service.groups if wf.serving else {}
    for group_name, group in groups.items():
        for component, aliases in group.ports.items():
            for cell_name, alias in aliases.items():
                if component == proposer and alias.access == "read_only":
                    borrowed[alias.input] = cell_name
                if component != target or alias.access != "read_write" or not alias.output:
                    continue
                cell = wf.state[cell_name]
                recurrence = cell.recurrence
                recurrence_max = recurrence.max if recurrence.kind != "invariant" else None
                cells[cell_name] = CellPlan(
                    name=cell_name, group=group_name, contract=cell.contract,
                    initializer=cell.initializer, owner_input=alias.input,
                    owner_output=alias.output, sequence_axis=int(group.sequence_axis or 0),
                    max_value=recurrence_max)

    driver_bound: dict[str, str] = {}
    for role in DRIVER_PORT_ROLES:
        port = port_by_role.get(role)
        if port and port in target_inputs:
            driver_bound[target_inputs[port]] = role
    for cell in cells.values():
        driver_bound[cell.initializer] = f"cell:{cell.name}"

    caps = []
    if doc.model and doc.model.max_sequence_length:
        caps.append(doc.model.max_sequence_length)
    if doc.generation and doc.generation.defaults.max_length:
        caps.append(doc.generation.defaults.max_length)

    group_bounds = [groups[g].capabilities.rollback_positions
                    for g in {c.group for c in cells.values()}]
    undeclared_bound = (min(group_bounds) if group_bounds and None not in group_bounds
                        else None)  # type: ignore[type-var]

    eos_ids: tuple[int, ...] = ()
    if doc.package and doc.package.tokenizer and "eos" in doc.package.tokenizer.special_tokens:
        eos_ids = (doc.package.tokenizer.special_tokens["eos"].id,)

    serving = {}
    if wf.serving:
        serving = {"active": wf.serving.active, "done": wf.serving.done}
        if wf.serving.accepted_len:
            serving["accepted_len"] = wf.serving.accepted_len

    spec = doc.speculative
    return LoadPlan(
        target=target, proposer=proposer, target_inputs=target_inputs,
        target_outputs=target_outputs, proposer_inputs=proposer_inputs,
        port_by_role=port_by_role, driver_bound=driver_bound, cells=cells,
        rollback_state=tuple(spec.rollback_state) if spec else tuple(cells),
        context_cap_inputs=tuple(sorted({c.max_value for c in cells.values() if c.max_value})),
        context_cap=min(caps) if caps else None,
        rollback_bound=spec.max_proposal_width if spec else undeclared_bound,
        undeclared_rollback_bound=undeclared_bound, serving=serving, eos_ids=eos_ids,
        chain=_derive_chain(doc, borrowed) if spec else None)


def _last_dim(contract: TensorContract) -> int | None:
    dims = contract.dims
    return dims[-1] if dims and isinstance(dims[-1], int) else None


def _derive_chain(doc: Document, borrowed: dict[str, str]) -> ChainPlan | None:
    spec = doc.speculative
    assert spec is not None
    execution = spec.proposal_execution
    if execution.kind != "chained":
        return None
    wf = doc.workflow
    proposer_ports = wf.components[spec.proposer].ports
    target_ports = wf.components[spec.target].ports
    assert proposer_ports is not None and target_ports is not None
    assert execution.token_embedding_input and execution.logits_output
    assert execution.folded_carry_output and execution.folded_carry_seed
    assert execution.token_embedding
    fused = proposer_ports.inputs[execution.token_embedding_input]
    seed = target_ports.outputs[execution.folded_carry_seed.output]
    dims = fused.dims
    sigma = dims[-2] if len(dims) >= 3 and isinstance(dims[-2], str) else None
    kappa = None
    groups = wf.serving.state_service.groups if wf.serving else {}
    for port, cell in borrowed.items():
        group = groups[wf.state[cell].service_group or ""]
        axis_dim = proposer_ports.inputs[port].dims[int(group.sequence_axis or 0)]
        if isinstance(axis_dim, str):
            kappa = axis_dim
    return ChainPlan(
        fused_port=execution.token_embedding_input, logits_output=execution.logits_output,
        carry_output=execution.folded_carry_output, seed_output=execution.folded_carry_seed.output,
        table=execution.token_embedding.table, scale=execution.token_embedding.scale,
        currency=fused.dtype, fused_width=_last_dim(fused), carry_width=_last_dim(seed),
        position_symbol=sigma, kv_symbol=kappa, borrowed=borrowed)
