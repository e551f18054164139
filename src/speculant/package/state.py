"""State cells, state groups and their aliases, and rollback (docs/design/spec/metadata.md §4.7):
rules 17–19 and 21–25, 33, 34, the cells and groups speculant cannot manage, and the cells the
target owns, derived for the plan with the bound on how far they roll back.
"""

from __future__ import annotations

from speculant.errors import MetadataError, ProblemCollector, shown
from speculant.package.common import (
    GROUPS,
    WF,
    component_roles,
    declares_ports,
    describe,
    incompatibility,
    invokes_of,
    is_integer_scalar,
    owners,
    ports_of,
    unsupported,
)
from speculant.package.model import Document, StateCell, StateGroup, StatePortAlias, Workflow
from speculant.package.plan import CellPlan
from speculant.package.static import length_cells
from speculant.package.steps import Values

ATTENTION_KINDS = ("full_attention", "sliding_attention", "multi_latent_attention")
Writers = dict[str, list[tuple[str, StatePortAlias]]]  # cell -> (component, alias) writing it
UPDATE_KEYS = {"append": set(), "replace": set(),
               "indexed_scatter": {"write_indices", "capacity", "write_indices_ports",
                                   "kv_length_ports", "batch"}}


def check(doc: Document, values: Values, out: ProblemCollector) -> None:
    wf = doc.workflow
    groups = dict(wf.serving.state_service.groups) if wf.serving else {}
    accepted_len = wf.serving.accepted_len if wf.serving else None
    writers = owners(wf)  # cell -> the (component, alias) pairs that write it, derived once
    lengths = length_cells(wf)  # a static group's length cells: no service_group, no owner
    for name, cell in wf.state.items():
        _check_cell(name, cell, groups, accepted_len, values, out, is_length=name in lengths)
    for name, group in groups.items():
        _check_group(wf, name, group, groups, writers, out)
    _check_owners(doc, writers, lengths, out)
    if doc.speculative is not None:
        _check_rollback(doc, groups, writers, out)


# -- cells (rules 17–19) --------------------------------------------------------------------
def _check_cell(name: str, cell: StateCell, groups: dict[str, StateGroup],
                accepted_len: str | None, values: Values, out: ProblemCollector, *,
                is_length: bool = False) -> None:
    path = f"{WF}.state.{name}"
    if cell.initializer not in values:
        out.add(MetadataError, f"initializer '{cell.initializer}' is not a defined value",
                path=f"{path}.initializer", value=cell.initializer, expected="a workflow input",
                rule="12")
    if cell.service_group is not None:
        if cell.service_group not in groups:
            out.add(MetadataError, f"cell names an unknown state group '{cell.service_group}'",
                    path=f"{path}.service_group", value=cell.service_group, rule="17",
                    expected="one of " + (", ".join(groups) or "no groups (none declared)"))
        if cell.management != "runtime":
            out.add(MetadataError, "a cell in a state group must be management: runtime",
                    path=f"{path}.management", value=cell.management, expected="runtime",
                    rule="17")
        if cell.contract.batch_layout.kind != "request_aligned":
            out.add(MetadataError, "a cell in a state group must be request_aligned",
                    path=f"{path}.contract.batch_layout", rule="18",
                    value=cell.contract.batch_layout.kind,
                    expected="{kind: request_aligned, axis}")
    if cell.management == "runtime" and cell.release_boundary is None:
        out.add(MetadataError, "a runtime-managed cell needs a release_boundary",
                path=f"{path}.release_boundary", expected="invocation", rule="17")
    _check_recurrence(name, cell, groups.get(cell.service_group or ""), accepted_len, values,
                      out)
    # what speculant manages: runtime cells of one invocation, in a group
    if cell.scope != "invocation":
        unsupported(out, "2", f"state scope '{cell.scope}'", f"{path}.scope", cell.scope,
                    "invocation")
    if cell.class_ != "semantic":
        unsupported(out, "2", f"state class '{cell.class_}'", f"{path}.class", cell.class_,
                    "semantic")
    if cell.management != "runtime" and cell.service_group is None and not is_length:
        # (in a group it is a MetadataError, rule 17; absent means `workflow`)
        unsupported(out, "2", f"a '{cell.management}'-managed state cell",
                    f"{path}.management", cell.management, "runtime")
    if cell.release_boundary not in (None, "invocation"):
        unsupported(out, "2", f"release_boundary '{cell.release_boundary}'",
                    f"{path}.release_boundary", cell.release_boundary, "invocation")
    if cell.service_group is None and not is_length:
        unsupported(out, "17", "a state cell without a service_group", f"{path}.service_group",
                    None, "the name of a state group")
    if cell.session is not None:
        unsupported(out, "2", "a state session lease", f"{path}.session", None, "absent")


def _check_recurrence(name: str, cell: StateCell, group: StateGroup | None,
                      accepted_len: str | None, values: Values, out: ProblemCollector) -> None:
    path = f"{WF}.state.{name}.recurrence"
    rec = cell.recurrence
    if rec.axis is not None and rec.axis >= cell.contract.rank:
        out.add(MetadataError, f"recurrence axis {rec.axis} is not below the cell's rank "
                f"{cell.contract.rank}", path=f"{path}.axis", value=rec.axis, rule="18",
                expected=f"an axis < {cell.contract.rank}")
    if rec.kind in ("growing", "bounded") and group is not None:
        if group.sequence_axis is None:
            out.add(MetadataError, f"the recurrence varies axis {rec.axis} but group "
                    f"'{cell.service_group}' declares no sequence_axis", path=f"{path}.axis",
                    value=rec.axis, expected="a group with sequence_axis", rule="18")
        elif rec.axis != group.sequence_axis:
            out.add(MetadataError, f"recurrence axis {rec.axis} differs from the sequence_axis "
                    f"{group.sequence_axis} of group '{cell.service_group}'", rule="18",
                    path=f"{path}.axis", value=rec.axis, expected=str(group.sequence_axis))
    if rec.kind == "growing" and rec.increment != accepted_len:
        out.add(MetadataError, "a growing recurrence's increment is the value "
                "serving.accepted_len names", path=f"{path}.increment", value=rec.increment,
                expected=str(accepted_len), rule="19")
    for key in ("max", "increment"):
        value = getattr(rec, key)
        if value is None or rec.kind == "invariant":
            continue
        contract = values.get(value)
        if value not in values:
            out.add(MetadataError, f"recurrence {key} '{value}' is not a defined value",
                    path=f"{path}.{key}", value=value, expected="a workflow input", rule="19")
        elif contract is not None and not is_integer_scalar(contract,
                                                              per_row=key == "increment"):
            out.add(MetadataError, f"recurrence {key} '{value}' is not an integer scalar "
                    f"({describe(contract)})", path=f"{path}.{key}", value=value, rule="19",
                    expected="an integer input of rank 0 or shape [1]")


# -- groups and aliases (rules 21–24) -------------------------------------------------------
def _check_group(wf: Workflow, name: str, group: StateGroup, groups: dict[str, StateGroup],
                 writers: Writers, out: ProblemCollector) -> None:
    path = f"{GROUPS}.{name}"
    if not group.layout.strip():
        out.add(MetadataError, "a state group needs a non-empty layout", path=f"{path}.layout",
                value=group.layout, expected="a label such as bnsh", rule="21")
    update = group.update.kind if group.update else "append"
    if group.update is not None:
        extra = group.update.model_extra or {}
        for key in sorted(set(extra) - UPDATE_KEYS[update]):
            out.add(MetadataError, f"unknown key '{key}'", path=f"{path}.update.{key}",
                    value=extra[key], expected=f"the keys of an {update} update", rule="2")
    if update == "append" and group.sequence_axis is None:
        out.add(MetadataError, "an append group needs a sequence_axis",
                path=f"{path}.sequence_axis", expected="the axis caches grow on", rule="21")
    if group.capabilities.rollback_positions == 0:
        out.add(MetadataError, "rollback_positions 0 is not allowed (omit it when the group "
                "cannot roll back)", path=f"{path}.capabilities.rollback_positions", value=0,
                expected="an integer >= 1, or no key", rule="21")
    for index, other in enumerate(group.capabilities.cascade):
        if other not in groups:
            out.add(MetadataError, f"cascade names an unknown group '{other}'",
                    path=f"{path}.capabilities.cascade.{index}", value=other, rule="21",
                    expected="one of " + ", ".join(groups))
    if group.sequence_axis is not None:
        for cell_name, cell in wf.state.items():
            if cell.service_group == name and group.sequence_axis >= cell.contract.rank:
                out.add(MetadataError, f"sequence_axis {group.sequence_axis} is not below the "
                        f"rank {cell.contract.rank} of cell '{cell_name}'", rule="18",
                        path=f"{path}.sequence_axis", value=group.sequence_axis,
                        expected=f"an axis < {cell.contract.rank}")
    for component, aliases in group.ports.items():
        _check_aliases(wf, name, component, aliases, out)
    _check_borrowed(wf, name, group, writers, out)
    # what speculant manages: attention caches that append or scatter into a fixed capacity
    if group.kind not in ATTENTION_KINDS:
        unsupported(out, "2", f"state group kind '{group.kind}'", f"{path}.kind", group.kind,
                    "full_attention, sliding_attention or multi_latent_attention")
    if update not in ("append", "indexed_scatter"):
        unsupported(out, "2", f"state update '{update}'", f"{path}.update.kind", update,
                    "append or indexed_scatter")
    if group.sequence_axis is None and update != "append":
        unsupported(out, "2", "a state group without sequence_axis", f"{path}.sequence_axis",
                    None, "the axis along which caches grow and roll back")
    if group.aliasing == "required":
        unsupported(out, "2", "aliasing: required", f"{path}.aliasing", group.aliasing,
                    "forbidden or permitted")
    if group.logical_lengths is not None and update != "indexed_scatter":
        unsupported(out, "2", f"group logical_lengths with a '{update}' update",
                    f"{path}.logical_lengths", group.logical_lengths,
                    "absent (or update.kind: indexed_scatter)")
    for key in ("total_length", "checkpoint"):
        if getattr(group, key) is not None:
            unsupported(out, "2", f"group {key}", f"{path}.{key}", getattr(group, key),
                        "absent")


def _check_aliases(wf: Workflow, group_name: str, component: str, aliases: dict,
                   out: ProblemCollector) -> None:
    path = f"{GROUPS}.{group_name}.ports.{component}"
    if component not in wf.components:
        out.add(MetadataError, f"aliases for an undeclared component '{component}'", path=path,
                value=component, expected="one of " + ", ".join(wf.components), rule="22")
        return
    inputs, outputs = ports_of(wf.components[component])
    check_ports = declares_ports(wf.components[component])
    for cell_name, alias in aliases.items():
        where = f"{path}.{cell_name}"
        cell = wf.state.get(cell_name)
        if cell is None:
            out.add(MetadataError, f"alias names an unknown state cell '{cell_name}'",
                    path=where, value=cell_name, expected="one of " + ", ".join(wf.state),
                    rule="22")
        elif cell.service_group is not None and cell.service_group != group_name:
            out.add(MetadataError, f"alias names cell '{cell_name}' of group "
                    f"'{cell.service_group}' inside group '{group_name}'", path=where,
                    value=cell_name, expected=f"a cell whose service_group is '{group_name}'",
                    rule="22")
        if check_ports and alias.input not in inputs:
            out.add(MetadataError, f"alias input '{alias.input}' is not a declared input port "
                    f"of '{component}'", path=f"{where}.input", value=alias.input, rule="22",
                    expected="one of " + ", ".join(inputs))
        if check_ports and alias.output is not None and alias.output not in outputs:
            out.add(MetadataError, f"alias output '{alias.output}' is not a declared output "
                    f"port of '{component}'", path=f"{where}.output", value=alias.output,
                    expected="one of " + ", ".join(outputs), rule="22")
        if alias.access == "read_write" and alias.output is None:
            out.add(MetadataError, "a read_write alias needs an output", path=f"{where}.output",
                    expected="the port that hands out the cell's next value", rule="22")
        if alias.access == "read_only" and alias.output is not None:  # discarded by the standard
            unsupported(out, "22", "an output on a read_only alias", f"{where}.output",
                        alias.output, "no output (or access: read_write)")
    _check_layers(wf, group_name, component, aliases, out)


def _check_layers(wf: Workflow, group_name: str, component: str, aliases: dict,
                  out: ProblemCollector) -> None:
    """Rule 23."""
    path = f"{GROUPS}.{group_name}.ports.{component}"
    by_role: dict[str, list] = {}
    for cell_name, alias in aliases.items():
        if alias.role is not None:
            by_role.setdefault(alias.role, []).append((cell_name, alias))
    for role, items in by_role.items():
        claimed: dict[int, str] = {}
        for cell_name, alias in items:
            if len(items) > 1 and alias.layer is None:
                out.add(MetadataError, f"'{component}' has {len(items)} {role} aliases in group "
                        f"'{group_name}', so each needs a layer", path=f"{path}.{cell_name}.layer",
                        expected="a layer index", rule="23")
            if alias.layer is not None and alias.layer in claimed:
                out.add(MetadataError, f"layer {alias.layer} of role {role} is claimed by both "
                        f"'{claimed[alias.layer]}' and '{cell_name}'", rule="23",
                        path=f"{path}.{cell_name}.layer", value=alias.layer,
                        expected="a layer not used by another alias of this role")
            elif alias.layer is not None:
                claimed[alias.layer] = cell_name
    kind = wf.serving.state_service.groups[group_name].kind if wf.serving else None
    if kind in ATTENTION_KINDS and ("key" in by_role or "value" in by_role):
        keys = sorted({a.layer or 0 for _, a in by_role.get("key", [])})
        values = sorted({a.layer or 0 for _, a in by_role.get("value", [])})
        if keys != values:
            out.add(MetadataError, f"key layers {keys} differ from value layers {values} for "
                    f"'{component}' in attention group '{group_name}'", path=path,
                    value={"key": keys, "value": values}, expected="the same layers", rule="23")


def _check_borrowed(wf: Workflow, group_name: str, group: StateGroup, writers: Writers,
                    out: ProblemCollector) -> None:
    """Rule 24 (M part): a borrowed cache port must fit the owner's output port."""
    for component, aliases in group.ports.items():
        inputs, _ = ports_of(wf.components.get(component))
        for cell_name, alias in aliases.items():
            if alias.access != "read_only" or len(writers.get(cell_name, [])) != 1:
                continue
            owner, owner_alias = writers[cell_name][0]
            _, owner_outputs = ports_of(wf.components.get(owner))
            have = owner_outputs.get(owner_alias.output)
            want = inputs.get(alias.input)
            if have is None or want is None:
                continue
            reason = incompatibility(have, want)
            if reason:
                out.add(MetadataError, f"borrowed cache port '{alias.input}' of '{component}' "
                        f"({describe(want)}) does not fit the owner's output "
                        f"'{owner}.{owner_alias.output}' ({describe(have)}): {reason}",
                        path=f"{GROUPS}.{group_name}.ports.{component}.{cell_name}.input",
                        value=alias.input, expected=describe(have), rule="24")


# -- owners (rules 24, 25: U) ---------------------------------------------------------------
def _check_owners(doc: Document, writers: Writers, lengths: frozenset[str],
                  out: ProblemCollector) -> None:
    wf = doc.workflow
    target, _ = component_roles(doc)
    for name in wf.state:
        found = writers.get(name, [])
        if name in lengths and not found:  # the driver writes it (docs/design/static-cache.md)
            continue
        if len(found) != 1:
            unsupported(out, "24", f"state cell '{name}' with {len(found)} owners "
                        f"({', '.join(c for c, _ in found) or 'none'})", f"{WF}.state.{name}",
                        [c for c, _ in found], "exactly one read_write alias with an output, "
                        "on the target")
        elif target is not None and found[0][0] != target:
            unsupported(out, "24", f"state cell '{name}' owned by '{found[0][0]}', not the "
                        "target", f"{WF}.state.{name}", found[0][0], f"owned by '{target}'")
    invokes = invokes_of(wf, target)
    if target is None or len(invokes) != 1:
        return
    index, step = invokes[0]
    path = f"{WF}.steps.{index}"
    for cell_name, found in writers.items():
        cell = wf.state.get(cell_name)
        if cell is None or len(found) != 1 or found[0][0] != target:
            continue
        alias = found[0][1]
        bound = (step.inputs or {}).get(alias.input)
        if bound != cell.initializer:
            unsupported(out, "25", f"a target invoke that binds alias input '{alias.input}' of "
                        f"cell '{cell_name}' to {shown(bound)} instead of its initializer",
                        f"{path}.inputs.{alias.input}", bound, f"'{cell.initializer}'")
        if alias.output not in step.invoke_outputs():
            unsupported(out, "25", f"a target invoke that leaves alias output '{alias.output}' "
                        f"of cell '{cell_name}' unbound", f"{path}.outputs.{alias.output}",
                        None, "a binding for the alias output")


# -- rollback (rules 33, 34) ----------------------------------------------------------------
def _check_rollback(doc: Document, groups: dict[str, StateGroup], writers: Writers,
                    out: ProblemCollector) -> None:
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    for index, group in enumerate(spec.shared_state):
        if group not in groups:
            out.add(MetadataError, f"shared_state names an unknown group '{group}'",
                    path=f"speculative.shared_state.{index}", value=group, rule="34",
                    expected="one of " + ", ".join(groups))
    reached: dict[str, str] = {}  # group -> path that reached it
    pending: list[tuple[str, str]] = []
    for index, cell_name in enumerate(spec.rollback_state):
        cell = wf.state.get(cell_name)
        if cell is None:
            out.add(MetadataError, f"rollback_state names an unknown cell '{cell_name}'",
                    path=f"speculative.rollback_state.{index}", value=cell_name, rule="33",
                    expected="one of " + ", ".join(wf.state))
        elif cell.service_group is not None:
            pending.append((cell.service_group, f"{WF}.state.{cell_name}.service_group"))
    while pending:
        group_name, via = pending.pop()
        if group_name in reached:
            continue
        reached[group_name] = via
        group = groups.get(group_name)
        if group is None:
            out.add(MetadataError, f"group '{group_name}', reached from rollback_state, is not "
                    "declared", path=via, value=group_name, expected="a declared state group",
                    rule="33")
            continue
        path = f"{GROUPS}.{group_name}.capabilities"
        bound = group.capabilities.rollback_positions
        if bound is None:
            out.add(MetadataError, f"group '{group_name}' (reached from rollback_state) declares "
                    "no rollback_positions", path=f"{path}.rollback_positions", rule="33",
                    expected=f">= max_proposal_width ({spec.max_proposal_width})")
        elif bound < spec.max_proposal_width:
            out.add(MetadataError, f"group '{group_name}' rolls back {bound} positions, fewer "
                    f"than max_proposal_width {spec.max_proposal_width}", rule="33",
                    path=f"{path}.rollback_positions", value=bound,
                    expected=f">= {spec.max_proposal_width}")
        for index, other in enumerate(group.capabilities.cascade):
            pending.append((other, f"{path}.cascade.{index}"))
    for cell_name, found in writers.items():  # U: every cache the target owns rolls back
        if len(found) == 1 and found[0][0] == spec.target \
                and cell_name not in spec.rollback_state:
            unsupported(out, "33", f"a target-owned cell '{cell_name}' missing from "
                        "rollback_state", "speculative.rollback_state", spec.rollback_state,
                        f"a list including '{cell_name}' (speculant reuses every cache, so "
                        "every one must roll back)")


# -- what load derives ----------------------------------------------------------------------
def target_cells(doc: Document, target: str) -> dict[str, CellPlan]:
    """Every cell the target owns (a read_write alias with an output), in group order."""
    wf = doc.workflow
    groups = dict(wf.serving.state_service.groups) if wf.serving else {}
    cells: dict[str, CellPlan] = {}
    for group_name, group in groups.items():
        for cell_name, alias in group.ports.get(target, {}).items():
            if alias.access != "read_write" or not alias.output:
                continue
            cell = wf.state[cell_name]
            recurrence = cell.recurrence
            cells[cell_name] = CellPlan(
                name=cell_name, group=group_name, contract=cell.contract,
                initializer=cell.initializer, owner_input=alias.input,
                owner_output=alias.output, sequence_axis=int(group.sequence_axis or 0),
                max_value=recurrence.max if recurrence.kind != "invariant" else None)
    return cells


def group_rollback_bound(doc: Document, cells: dict[str, CellPlan]) -> int | None:
    """How far every group holding a target cell rolls back (None: one of them cannot)."""
    groups = doc.workflow.serving.state_service.groups if doc.workflow.serving else {}
    bounds = [groups[g].capabilities.rollback_positions for g in {c.group for c in
                                                                 cells.values()}]
    if not bounds or None in bounds:
        return None
    return min(b for b in bounds if b is not None)
