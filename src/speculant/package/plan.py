"""What load derives for the runtime (docs/design/spec/metadata.md §5) from a checked document.

The plan names everything the interpreter needs by role, so that nothing downstream re-reads
the document to find out which port is the token ids or which cells roll back. Each feature
module derives its part (``steps``: the invokes, ``state``: the cells, ``chain``: the chain,
``serving``: the controls, ``top``: the caps and EOS); ``loader.derive_plan`` assembles them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculant.package.model import TensorContract

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
    """The chained proposal, resolved at load: the proposer ports the chain binds and reads."""

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
class BatchPlan:
    """The target's batched graph (``update.batch``, docs/design/batching.md): a right-padded
    block ``[B, W]`` over per-row caches ``[B, ..., capacity, ...]``, ``B <= max_rows``."""

    max_rows: int
    artifact: str  # its location in the package (load confines it: Package.batched_artifact)
    block_lengths_port: str  # [B] int64: each row's valid tokens in the block (0: padding)
    field: str  # the metadata field naming the artifact, for messages


@dataclass(frozen=True)
class StaticPlan:
    """Fixed-capacity caches written in place (docs/design/static-cache.md)."""

    lengths_cell: str  # the cell holding L (the group's logical_lengths)
    lengths_input: str  # its initializer: the workflow value the driver binds to L
    write_indices_input: str  # the write-index cell's initializer (also L: one sequence)
    capacity_input: str  # update.capacity: the workflow input of the largest capacity
    capacity: int | None  # its literal default (None: no default)
    capacity_symbol: str  # the cells' symbol on the sequence axis
    write_indices_ports: dict[str, str]  # component -> port taking the write index (= L)
    kv_length_ports: dict[str, str]  # component -> port taking the valid length
    batch: BatchPlan | None = None  # the target's batched graph; None: batch 1 only


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
    # workflow inputs only the chain binds (the fused port, borrowed caches): never asked of
    # the caller
    chain_bound_inputs: tuple[str, ...] = ()
    static: StaticPlan | None = None  # fixed-capacity caches; None: appended caches
