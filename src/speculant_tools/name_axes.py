"""Rename the sequence-like shape symbols of a published metadata document by their role.

Packages in circulation call every sequence-like axis ``sequence``. Shape symbols unify within
one component execution, so a borrowed cache that says ``sequence`` is narrowed to the one
position the drafter's query has, and the chain sees no context (rule 32). :func:`name_axes`
gives each such axis the name of what it counts (docs/design/spec/metadata.md §5):

=================  ===========================================================================
``sequence``       the query: the tokens a pass processes (token ids, position ids, the fused
                   ``inputs_embeds``, logits, hidden states, any other per-token output)
``past_sequence``  the cache a pass starts from: a ``read_write`` alias input on its group's
                   ``sequence_axis``, a cell's ``initializer``, the cell's own contract
``total_sequence`` the cache a pass ends with: an alias output (a present), and the target's
                   ``attention_mask`` (past + current)
``kv_sequence``    the cache a drafter borrows: a ``read_only`` alias input, and the
                   proposer's ``attention_mask``
=================  ===========================================================================

The roles come from the document's structure only: state groups (alias ports and
``sequence_axis``), ``ports.roles``, the ``speculative`` section (proposer, target, chained
ports) and the invoke bindings that tie workflow inputs and outputs to ports. An axis named
``sequence`` that none of these classifies, or that would need two names, is ambiguous and the
whole document is refused with a :class:`MetadataError` per axis; nothing is written.

The rewrite keeps the file byte for byte apart from the renamed symbols: ruamel.yaml's
round-trip loader reports where each symbol sits, and the text is edited at exactly those
places (its dumper would reflow long flow mappings). The result is parsed again and checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speculant.errors import MetadataError, ProblemCollector
from speculant_tools.name_axes_text import (
    _check_rewrite,
    _dotted,
    _parse,
    _replace_file,
    _rewrite_text,
    _Site,
)

SEQUENCE = "sequence"  # the query length; also the one name packages in circulation use
PAST_SEQUENCE = "past_sequence"
TOTAL_SEQUENCE = "total_sequence"
KV_SEQUENCE = "kv_sequence"
AXIS_NAMES = (SEQUENCE, PAST_SEQUENCE, TOTAL_SEQUENCE, KV_SEQUENCE)

# Port roles (``ports.roles``) whose sequence axis is the query.
PER_TOKEN_ROLES = frozenset({"token_ids", "inputs_embeds", "position_ids", "logits",
                             "hidden_states"})

REMEDY = ("name the axis by hand (sequence, past_sequence, total_sequence or kv_sequence: "
          "docs/design/spec/metadata.md §5), or declare the port (ports.roles, a state alias)")

INPUTS, OUTPUTS = "inputs", "outputs"
PortKey = tuple[str, str, str]  # (component, INPUTS | OUTPUTS, port)


@dataclass(frozen=True)
class AxisRename:
    """One shape symbol renamed: where, and from what to what."""

    path: str  # e.g. "pipeline.workflow.components.target.ports.inputs.attention_mask.shape.1"
    old: str
    new: str
    line: int  # 1-based line in the file


@dataclass(frozen=True)
class NamingReport:
    """What :func:`name_axes` renamed (or would rename, with ``write=False``)."""

    file: Path
    renames: tuple[AxisRename, ...]
    is_written: bool

    @property
    def has_renames(self) -> bool:
        return bool(self.renames)

    def render(self) -> str:
        if not self.renames:
            return f"{self.file}: every sequence-like axis already has a distinct name"
        verb = "renamed" if self.is_written else "would rename"
        lines = [f"{self.file}: {verb} {len(self.renames)} shape symbols"]
        lines += [f"  {r.path}: {r.old} -> {r.new}" for r in self.renames]
        return "\n".join(lines)

    __str__ = render


def name_axes(metadata_path: Path, *, write: bool = True) -> NamingReport:
    """Rename every ``sequence`` shape symbol of ``metadata_path`` by its role, in place.

    Returns the report; with ``write=False`` (a dry run) the file is left untouched. A
    document that needs no renaming is not rewritten. Raises :class:`MetadataError` (all
    problems together, each with file and field path) when the file cannot be read or
    parsed, or when any ``sequence`` axis is ambiguous.
    """
    path = Path(metadata_path)
    file = str(path)
    text = _read_text(path)
    document = _parse(text, file)
    problems = ProblemCollector(file)
    decisions = _AxisClassifier(document, problems).classify()
    problems.raise_if_any()

    renames = [(site, role) for site, role in decisions if site.shape[site.index] != role]
    if not renames:
        return NamingReport(path, (), is_written=False)
    new_text = _rewrite_text(text, renames, file)
    _check_rewrite(new_text, document, renames, file)
    if write:
        _replace_file(path, new_text)
    report = tuple(
        AxisRename(site.path, site.shape[site.index], role, site.position[0] + 1)
        for site, role in renames
    )
    return NamingReport(path, report, is_written=write)


# -- reading --------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if path.is_dir():
        raise MetadataError("expected the metadata file, got a directory", file=str(path),
                            remedy=f"pass {path / 'inference_metadata.yaml'} (or .yml, .json)")
    try:
        with open(path, encoding="utf-8", newline="") as handle:  # keep CRLF as it is
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise MetadataError(f"cannot read the metadata file: {exc}", file=str(path)) from exc



def _sequence_indices(shape: Any) -> list[int]:
    if not isinstance(shape, list):
        return []
    return [i for i, symbol in enumerate(shape) if symbol == SEQUENCE]


def _shape_of(contract: Any) -> Any:
    return contract.get("shape") if isinstance(contract, dict) else None


@dataclass(frozen=True)
class _Evidence:
    """A role one fact of the document implies, and the fact, for messages."""

    role: str
    because: str


@dataclass
class _Alias:
    group: str
    cell: str
    access: str
    sequence_axis: int | None


@dataclass
class _Structure:
    """The facts about a document that decide roles, read once."""

    target: str | None = None
    proposer: str | None = None
    port_shapes: dict[PortKey, Any] = field(default_factory=dict)
    port_roles: dict[tuple[str, str], str] = field(default_factory=dict)
    aliases: dict[PortKey, list[_Alias]] = field(default_factory=dict)
    chained_ports: dict[PortKey, str] = field(default_factory=dict)  # port -> speculative key
    value_ports: dict[str, list[PortKey]] = field(default_factory=dict)  # value -> bound ports
    initializer_of: dict[str, list[str]] = field(default_factory=dict)  # value -> cells
    cell_group: dict[str, str] = field(default_factory=dict)
    group_axis: dict[str, int | None] = field(default_factory=dict)
    emitted: dict[str, list[str]] = field(default_factory=dict)  # output -> values
    # The contract-bearing sections, by name (components' ports are in port_shapes).
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


WORKFLOW = ("pipeline", "workflow")
GROUPS = (*WORKFLOW, "serving", "state_service", "groups")


class _AxisClassifier:
    """Decides the role of every ``sequence`` axis of one document."""

    def __init__(self, document: Any, problems: ProblemCollector) -> None:
        self.document = document
        self.problems = problems
        self.facts = _Structure()
        pipeline = self._mapping(document, ("pipeline",), required=True)
        workflow = self._mapping(pipeline, WORKFLOW, required=True)
        self._read_components(workflow)
        self._read_speculative(self._mapping(document, ("speculative",)))
        self._read_groups(workflow)
        self._read_cells_inputs_outputs(workflow)
        self._read_steps(workflow)

    # .. reading the structure ..............................................................
    def _mapping(self, parent: Any, keys: tuple[Any, ...], *, required: bool = False) -> dict:
        """``parent[keys[-1]]`` as a mapping ({} when absent); a wrong type is a problem."""
        node = parent.get(keys[-1]) if isinstance(parent, dict) else None
        if isinstance(node, dict):
            return node
        if node is not None:
            self.problems.add(MetadataError, "expected a mapping", path=_dotted(keys),
                              value=type(node).__name__)
        elif required:
            self.problems.add(MetadataError, "missing", path=_dotted(keys),
                              expected="a mapping")
        return {}

    def _read_components(self, workflow: dict) -> None:
        components = self._mapping(workflow, (*WORKFLOW, "components"))
        for name, component in components.items():
            keys = (*WORKFLOW, "components", name, "ports")
            ports = self._mapping(component, keys)
            for direction in (INPUTS, OUTPUTS):
                for port, contract in self._mapping(ports, (*keys, direction)).items():
                    self.facts.port_shapes[(name, direction, port)] = _shape_of(contract)
            for port, role in self._mapping(ports, (*keys, "roles")).items():
                self.facts.port_roles[(name, port)] = role
        if len(components) == 1:  # without a speculative section the only one is the target
            self.facts.target = next(iter(components))

    def _read_speculative(self, speculative: dict) -> None:
        """Proposer, target, and the ports the chain declares per-token (the query)."""
        facts = self.facts
        facts.proposer = speculative.get("proposer")
        facts.target = speculative.get("target", facts.target)
        execution = self._mapping(speculative, ("speculative", "proposal_execution"))
        bindings = self._mapping(speculative, ("speculative", "port_bindings"))
        seed = self._mapping(execution, ("speculative", "proposal_execution",
                                         "folded_carry_seed"))
        declared = [(facts.proposer, INPUTS, execution.get("token_embedding_input"),
                     "speculative.proposal_execution.token_embedding_input"),
                    (facts.proposer, OUTPUTS, execution.get("logits_output"),
                     "speculative.proposal_execution.logits_output"),
                    (facts.proposer, OUTPUTS, execution.get("folded_carry_output"),
                     "speculative.proposal_execution.folded_carry_output"),
                    (facts.proposer, INPUTS, bindings.get("target_hidden_context"),
                     "speculative.port_bindings.target_hidden_context"),
                    (seed.get("component"), OUTPUTS, seed.get("output"),
                     "speculative.proposal_execution.folded_carry_seed")]
        for component, direction, port, where in declared:
            if component is not None and port is not None:
                facts.chained_ports[(component, direction, port)] = where

    def _read_groups(self, workflow: dict) -> None:
        serving = self._mapping(workflow, (*WORKFLOW, "serving"))
        service = self._mapping(serving, (*WORKFLOW, "serving", "state_service"))
        for group_name in self._mapping(service, GROUPS):
            group = self._mapping(service["groups"], (*GROUPS, group_name))
            axis = group.get("sequence_axis")
            self.facts.group_axis[group_name] = axis if isinstance(axis, int) else None
            keys = (*GROUPS, group_name, "ports")
            for component in self._mapping(group, keys):
                cells = self._mapping(group["ports"], (*keys, component))
                for cell in cells:
                    self._read_alias(group_name, component, cell,
                                     self._mapping(cells, (*keys, component, cell)))

    def _read_alias(self, group: str, component: str, cell: str, alias: dict) -> None:
        access = alias.get("access", "read_write")
        for direction, key in ((INPUTS, "input"), (OUTPUTS, "output")):
            if alias.get(key) is not None:
                self.facts.aliases.setdefault((component, direction, alias[key]), []).append(
                    _Alias(group, cell, access, self.facts.group_axis[group]))

    def _read_cells_inputs_outputs(self, workflow: dict) -> None:
        facts = self.facts
        facts.inputs = self._mapping(workflow, (*WORKFLOW, "inputs"))
        facts.outputs = self._mapping(workflow, (*WORKFLOW, "outputs"))
        facts.state = self._mapping(workflow, (*WORKFLOW, "state"))
        for name in facts.state:
            cell = self._mapping(facts.state, (*WORKFLOW, "state", name))
            facts.cell_group[name] = cell.get("service_group")
            if cell.get("initializer") is not None:
                facts.initializer_of.setdefault(cell["initializer"], []).append(name)

    def _read_steps(self, workflow: dict) -> None:
        steps = workflow.get("steps")
        for number, step in enumerate(steps if isinstance(steps, list) else []):
            if not isinstance(step, dict):
                continue  # the loader reports malformed steps
            if step.get("kind") == "invoke":
                for direction in (INPUTS, OUTPUTS):
                    keys = (*WORKFLOW, "steps", number, direction)
                    for port, value in self._mapping(step, keys).items():
                        self.facts.value_ports.setdefault(value, []).append(
                            (step.get("component"), direction, port))
            elif step.get("kind") == "emit":
                self.facts.emitted.setdefault(step.get("output"), []).append(step.get("value"))

    # .. the decisions ......................................................................
    def classify(self) -> list[tuple[_Site, str]]:
        """Every ``sequence`` site with its role; problems go to the collector."""
        decisions = []
        for site, evidence in self._evidence_per_site():
            role = self._decide(site, evidence)
            if role is not None:
                decisions.append((site, role))
        self._check_shared_shapes(decisions)
        return sorted(decisions, key=lambda decision: decision[0].position)

    def _evidence_per_site(self) -> Iterator[tuple[_Site, list[_Evidence] | str]]:
        facts = self.facts
        for (component, direction, port), shape in facts.port_shapes.items():
            keys = (*WORKFLOW, "components", component, "ports", direction, port, "shape")
            for index in _sequence_indices(shape):
                yield (_Site(keys, shape, index),
                       self._port_axis_evidence((component, direction, port), index))
        sections = (("inputs", facts.inputs, self._input_axis_evidence),
                    ("state", facts.state, self._cell_axis_evidence),
                    ("outputs", facts.outputs, self._output_axis_evidence))
        for section, entries, evidence_for in sections:
            for name, entry in entries.items():
                contract = entry.get("contract") if isinstance(entry, dict) else None
                shape = _shape_of(contract)
                keys = (*WORKFLOW, section, name, "contract", "shape")
                for index in _sequence_indices(shape):
                    yield _Site(keys, shape, index), evidence_for(name, index)

    def _decide(self, site: _Site, evidence: list[_Evidence] | str) -> str | None:
        if isinstance(evidence, str):  # a reason no role applies
            self.problems.add(MetadataError, f"cannot tell what this `sequence` axis counts: "
                              f"{evidence}", path=site.path, value=SEQUENCE, remedy=REMEDY)
            return None
        roles = sorted({e.role for e in evidence})
        if len(roles) == 1:
            return roles[0]
        reasons = "; ".join(f"{e.role} because {e.because}" for e in evidence)
        self.problems.add(MetadataError, f"this `sequence` axis would need two names: {reasons}",
                          path=site.path, value=SEQUENCE, expected="one role per axis",
                          remedy="bind distinct workflow values to ports of different roles, "
                          "or name the axis by hand")
        return None

    def _check_shared_shapes(self, decisions: list[tuple[_Site, str]]) -> None:
        """A YAML anchor shares one shape list between contracts: refuse two names for it."""
        first_at: dict[tuple[int, int], tuple[_Site, str]] = {}
        for site, role in decisions:
            first, first_role = first_at.setdefault(site.position, (site, role))
            if first_role != role:
                self.problems.add(MetadataError, f"this shape list is shared through a YAML "
                                  f"anchor with {first.path}, which needs {first_role!r}, but "
                                  f"this contract needs {role!r}", path=site.path,
                                  value=SEQUENCE, remedy="write the two shapes out separately")

    # .. evidence for each kind of site .....................................................
    def _port_axis_evidence(self, key: PortKey, index: int) -> list[_Evidence] | str:
        """Why a port's axis ``index``, named ``sequence``, is what it is."""
        facts = self.facts
        component, direction, port = key
        if key in facts.aliases:
            return self._alias_evidence(key, index)
        shape = facts.port_shapes[key]
        named = _sequence_indices(shape)
        if len(named) > 1:
            return (f"port '{port}' of '{component}' names axes {named} all `sequence` and is "
                    f"no state alias, so nothing says which is which")
        role = facts.port_roles.get((component, port))
        if role == "attention_mask":
            if component == facts.target:
                return [_Evidence(TOTAL_SEQUENCE, f"'{port}' is the target's attention_mask "
                                  "(past + current)")]
            if component == facts.proposer:
                return [_Evidence(KV_SEQUENCE, f"'{port}' is the proposer's attention_mask "
                                  "(the borrowed extent)")]
            return (f"'{port}' is the attention_mask of '{component}', which is neither the "
                    "speculative target nor the proposer")
        if role in PER_TOKEN_ROLES:
            return [_Evidence(SEQUENCE, f"'{port}' of '{component}' has role {role}")]
        if role is not None:
            return f"port role {role!r} of '{port}' does not tell"
        if key in facts.chained_ports:
            return [_Evidence(SEQUENCE, f"'{port}' of '{component}' is "
                              f"{facts.chained_ports[key]}")]
        if direction == OUTPUTS:
            return [_Evidence(SEQUENCE, f"'{port}' of '{component}' is a per-token output "
                              "(no state alias)")]
        return (f"input '{port}' of '{component}' has no role, no state alias and no place in "
                "the speculative section")

    def _alias_evidence(self, key: PortKey, index: int) -> list[_Evidence] | str:
        component, direction, port = key
        evidence = []
        for alias in self.facts.aliases[key]:
            where = f"'{port}' is the {direction[:-1]} of state alias {component}.{alias.cell}"
            if alias.sequence_axis is None:
                return f"{where}, but group '{alias.group}' declares no sequence_axis"
            if index != alias.sequence_axis:
                return (f"{where}, but axis {index} is not group '{alias.group}''s "
                        f"sequence_axis {alias.sequence_axis}")
            if direction == OUTPUTS:
                evidence.append(_Evidence(TOTAL_SEQUENCE, f"{where} (the cache a pass ends with)"))
            elif alias.access == "read_only":
                evidence.append(_Evidence(KV_SEQUENCE, f"{where}, read_only (a borrowed cache)"))
            else:
                evidence.append(_Evidence(PAST_SEQUENCE,
                                          f"{where} (the cache a pass starts from)"))
        return evidence

    def _bound_port_evidence(self, key: PortKey, index: int) -> list[_Evidence]:
        """What a port tells about a value bound to it, on the value's axis ``index``."""
        shape = self.facts.port_shapes.get(key)
        if not isinstance(shape, list) or index >= len(shape):
            return []
        symbol = shape[index]
        if symbol == SEQUENCE:
            evidence = self._port_axis_evidence(key, index)
            return [] if isinstance(evidence, str) else evidence  # the port reports itself
        if symbol in AXIS_NAMES:
            component, direction, port = key
            return [_Evidence(symbol, f"it is bound to '{port}' of '{component}', whose axis "
                              f"{index} is {symbol}")]
        return []

    def _input_axis_evidence(self, name: str, index: int) -> list[_Evidence] | str:
        facts = self.facts
        evidence: list[_Evidence] = []
        for cell in facts.initializer_of.get(name, []):
            if facts.group_axis.get(facts.cell_group.get(cell)) == index:
                evidence.append(_Evidence(PAST_SEQUENCE, f"it is the initializer of cell "
                                          f"'{cell}'"))
        from_proposer: list[_Evidence] = []
        for key in facts.value_ports.get(name, []):
            found = [_Evidence(e.role, f"it is bound to {key[0]}.{key[2]}: {e.because}")
                     for e in self._bound_port_evidence(key, index)]
            is_proposer_binding = key[0] == facts.proposer and key[0] != facts.target
            (from_proposer if is_proposer_binding else evidence).extend(found)
        # The chain binds the proposer's borrowed caches and cuts its mask itself: a workflow
        # input the target also reads takes the target's role.
        if evidence:
            evidence += [e for e in from_proposer if e.role != KV_SEQUENCE]
        else:
            evidence = from_proposer
        if not evidence:
            return (f"workflow input '{name}' initializes no cell and is bound to no port "
                    "that tells")
        return evidence

    def _cell_axis_evidence(self, name: str, index: int) -> list[_Evidence] | str:
        group = self.facts.cell_group.get(name)
        if group not in self.facts.group_axis:
            return f"cell '{name}' names no known service_group"
        axis = self.facts.group_axis[group]
        if axis != index:
            return f"axis {index} is not group '{group}''s sequence_axis {axis}"
        return [_Evidence(PAST_SEQUENCE, f"cell '{name}' holds the cache a pass starts from")]

    def _output_axis_evidence(self, name: str, index: int) -> list[_Evidence] | str:
        evidence: list[_Evidence] = []
        for value in self.facts.emitted.get(name, []):
            for key in self.facts.value_ports.get(value, []):
                if key[1] == OUTPUTS:  # the port that produced the emitted value
                    evidence += self._bound_port_evidence(key, index)
        if not evidence:
            return f"workflow output '{name}' is emitted from no value whose port tells"
        return [_Evidence(e.role, f"it emits {e.because}") for e in evidence]


# -- rewriting ------------------------------------------------------------------------------
