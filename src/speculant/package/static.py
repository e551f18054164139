"""Static caches (catalogue document 18, docs/design/static-cache.md): a state group whose
``update.kind`` is ``indexed_scatter`` holds fixed-capacity buffers written in place, with
its valid length in the cell ``logical_lengths`` names.

The rules this feature owns (each a `MetadataError`, rule 21): ``logical_lengths`` and
``update.write_indices`` name state cells; every ``write_indices_ports`` /
``kv_length_ports`` port is declared by its component and is ``[batch]`` or ``[1]`` int64;
``update.capacity`` names a workflow input; every cache cell of the group has, on the
group's ``sequence_axis``, one symbol (the capacity the runtime picks), the same for all.

What load derives: a :class:`~speculant.package.plan.StaticPlan` (the length cell, its
workflow input, the capacity and its symbol, the ports, and the target's batched graph
where ``update.batch`` declares one), or ``None`` for appended caches.
"""

from __future__ import annotations

from speculant.errors import MetadataError, ProblemCollector
from speculant.package.common import GROUPS, WF, describe, groups_of
from speculant.package.model import Document, StateGroup, Workflow
from speculant.package.plan import BatchPlan, StaticPlan

RULE = "21"


def update_fields(group: StateGroup) -> dict:
    """The indexed-scatter keys of ``group.update`` (empty for another update kind)."""
    if group.update is None or group.update.kind != "indexed_scatter":
        return {}
    return dict(group.update.model_extra or {})


def length_cells(wf: Workflow) -> frozenset[str]:
    """The cells that hold a static group's lengths or write indices: they belong to their
    group through ``logical_lengths`` / ``write_indices``, with no service_group or owner."""
    named = set()
    for group in groups_of(wf).values():
        if isinstance(group.logical_lengths, str):
            named.add(group.logical_lengths)
        write_indices = update_fields(group).get("write_indices")
        if isinstance(write_indices, str):
            named.add(write_indices)
    return frozenset(named)


def check(doc: Document, out: ProblemCollector) -> None:
    wf = doc.workflow
    for name, group in groups_of(wf).items():
        fields = update_fields(group)
        path = f"{GROUPS}.{name}"
        if group.update is None or group.update.kind != "indexed_scatter":
            continue  # (logical_lengths elsewhere: unsupported, package/state.py)
        if group.logical_lengths is not None:
            _check_cell_name(wf, group.logical_lengths, f"{path}.logical_lengths", out)
        for key in ("write_indices", "capacity"):
            if key not in fields:
                out.add(MetadataError, f"an indexed_scatter update needs '{key}'",
                        path=f"{path}.update.{key}", rule=RULE,
                        expected="a state cell" if key == "write_indices" else
                        "the workflow input holding the largest capacity")
        if "write_indices" in fields:
            _check_cell_name(wf, fields["write_indices"], f"{path}.update.write_indices", out)
        capacity = fields.get("capacity")
        if capacity is not None and capacity not in wf.inputs:
            out.add(MetadataError, f"update.capacity names '{capacity}', which is not a "
                    "workflow input", path=f"{path}.update.capacity", value=capacity,
                    rule=RULE, expected="one of " + ", ".join(wf.inputs))
        for key in ("write_indices_ports", "kv_length_ports"):
            ports = fields.get(key) or {}
            if not isinstance(ports, dict):
                out.add(MetadataError, f"update.{key} must map component to port",
                        path=f"{path}.update.{key}", value=ports, rule=RULE,
                        expected="{component: port}")
                continue
            for component, port in ports.items():
                _check_length_port(wf, component, port, f"{path}.update.{key}.{component}",
                                   out)
        if "batch" in fields:
            _check_batch(wf, fields["batch"], f"{path}.update.batch", out)
        _check_capacity_axis(wf, name, group, out)


def _check_batch(wf: Workflow, batch: object, path: str, out: ProblemCollector) -> None:
    """speculant's extension (docs/design/batching.md): ``{max_rows: N ≥ 1, artifacts:
    {component: path of its batched graph}, block_lengths_ports: {component: port}}``. The
    runtime decodes single requests with the components' own artifacts; the scheduler
    (speculative/scheduler.py) drives the target's batched artifact."""
    rows = batch.get("max_rows") if isinstance(batch, dict) else None
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        out.add(MetadataError, "update.batch needs max_rows, a number of rows >= 1",
                path=f"{path}.max_rows", value=rows, rule=RULE, expected="an integer >= 1")
    for key in ("artifacts", "block_lengths_ports"):
        entries = batch.get(key) if isinstance(batch, dict) else None
        if not isinstance(entries, dict) or not all(
                component in wf.components and isinstance(value, str)
                for component, value in entries.items()):
            out.add(MetadataError, f"update.batch.{key} must map declared components to "
                    "names", path=f"{path}.{key}", value=entries, rule=RULE,
                    expected="{component: " + ("artifact path}" if key == "artifacts"
                                               else "port}"))


def _check_cell_name(wf: Workflow, name: object, path: str, out: ProblemCollector) -> None:
    if not isinstance(name, str) or name not in wf.state:
        out.add(MetadataError, f"'{name}' names no state cell", path=path, value=name,
                rule=RULE, expected="one of " + ", ".join(wf.state),
                remedy="declare the length cell under pipeline.workflow.state")


def _check_length_port(wf: Workflow, component: str, port: object, path: str,
                       out: ProblemCollector) -> None:
    declared = wf.components.get(component)
    inputs = declared.ports.inputs if declared is not None and declared.ports else {}
    contract = inputs.get(port) if isinstance(port, str) else None
    if contract is None:
        out.add(MetadataError, f"port '{port}' is not a declared input of component "
                f"'{component}'", path=path, value=port, rule=RULE,
                expected="one of " + (", ".join(inputs) or "its declared input ports"))
        return
    if contract.dtype != "int64" or contract.rank != 1:
        out.add(MetadataError, f"length port '{component}.{port}' is {describe(contract)}",
                path=path, value=describe(contract), rule=RULE,
                expected="int64[batch] (one length per request row)")


def _check_capacity_axis(wf: Workflow, name: str, group: StateGroup,
                         out: ProblemCollector) -> None:
    axis = group.sequence_axis
    if axis is None:
        return
    symbols: dict[str, str] = {}  # symbol -> the first cell that uses it
    for cell_name, cell in wf.state.items():
        if cell.service_group != name or axis >= cell.contract.rank:
            continue
        dim = cell.contract.dims[axis]
        path = f"{WF}.state.{cell_name}.contract.shape.{axis}"
        if not isinstance(dim, str):
            out.add(MetadataError, f"cache cell '{cell_name}' of static group '{name}' has "
                    f"extent {dim!r} on its sequence axis {axis}", path=path, value=dim,
                    rule=RULE, expected="a symbol (the capacity the runtime picks, sized by "
                    "update.capacity)")
        elif symbols and dim not in symbols:
            first = next(iter(symbols))
            out.add(MetadataError, f"cache cell '{cell_name}' has capacity symbol '{dim}' "
                    f"but '{symbols[first]}' has '{first}'", path=path, value=dim,
                    rule=RULE, expected=f"'{first}' (one capacity per group)")
        else:
            symbols.setdefault(dim, cell_name)


def plan(doc: Document, target: str) -> StaticPlan | None:
    """The static group holding the target's caches, resolved; None for appended caches."""
    wf = doc.workflow
    for name, group in groups_of(wf).items():
        fields = update_fields(group)
        if not fields or target not in group.ports:
            continue
        lengths = group.logical_lengths or fields["write_indices"]
        capacity_input = fields["capacity"]
        default = wf.inputs[capacity_input].default
        cell = next(wf.state[c] for c in group.ports[target])
        batch = fields.get("batch") or {}
        return StaticPlan(
            lengths_cell=lengths, lengths_input=wf.state[lengths].initializer,
            write_indices_input=wf.state[fields["write_indices"]].initializer,
            capacity_input=capacity_input,
            capacity=int(default if not isinstance(default, list) else default[0])
            if default is not None else None,
            capacity_symbol=str(cell.contract.dims[int(group.sequence_axis or 0)]),
            write_indices_ports=dict(fields.get("write_indices_ports") or {}),
            kv_length_ports=dict(fields.get("kv_length_ports") or {}),
            batch=BatchPlan(int(batch["max_rows"]), batch["artifacts"][target],
                            batch["block_lengths_ports"][target],
                            f"{GROUPS}.{name}.update.batch.artifacts.{target}")
            if target in batch.get("artifacts", {}) and
            target in batch.get("block_lengths_ports", {}) else None)
    return None
