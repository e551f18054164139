"""The words every feature module of ``package`` shares: document paths, contract arithmetic,
and the few lookups (ports, groups, owners, the target) that several features read.

A feature module (``top``, ``io``, ``steps``, ``state``, ``serving``, ``chain``) owns all stages
of its feature: the metadata rules (``MetadataError``), what speculant cannot execute
(``UnsupportedError``), admission against the graphs (``AdmissionError``) and its part of the
load plan. Each problem carries the spec's rule id (``Problem.rule``: "12", "A6", "U16").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from speculant.errors import ProblemCollector, UnsupportedError
from speculant.package.model import (
    Component,
    Document,
    StatePortAlias,
    Step,
    TensorContract,
    Workflow,
)
from speculant.package.paths import check_lexical

WF = "pipeline.workflow"
SV = f"{WF}.serving"
GROUPS = f"{SV}.state_service.groups"
PE = "speculative.proposal_execution"
INTEGER_DTYPES = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1),
                  "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
                  "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
                  "uint64": (0, 2**64 - 1)}


def unsupported(out: ProblemCollector, rule: str, feature: str, path: str,
                value: object = None, expected: str = "", remedy: str = "") -> None:
    """Record "<feature> is not supported by speculant" at ``path``."""
    out.add(UnsupportedError, f"{feature} is not supported by speculant", path=path,
            value=value, expected=expected, remedy=remedy, rule=rule)


@contextmanager
def rule_of(out: ProblemCollector, rule: str) -> Iterator[None]:
    """Give the problems recorded inside the block (by a helper that knows no rule ids, such
    as ``paths.confine``) the rule id ``rule``."""
    first = len(out.problems)
    yield
    out.problems[first:] = [p if p.rule else replace(p, rule=rule) for p in out.problems[first:]]


def check_path(location: str, path: str, out: ProblemCollector) -> bool:
    """Rule 4 (P1, lexical): record why ``location`` is refused before touching the disk;
    True when it passes."""
    with rule_of(out, "4"):
        return check_lexical(location, path, out)


def is_empty(value: object) -> bool:
    return value is None or value is False or value == {} or value == []


# -- contracts ------------------------------------------------------------------------------
def incompatibility(have: TensorContract, want: TensorContract) -> str | None:
    """Why a value of contract ``have`` cannot fill ``want`` (rule 14's test), or ``None``:
    dtype, rank, or an axis fixed on both sides."""
    if have.dtype != want.dtype:
        return f"dtype {have.dtype} != {want.dtype}"
    if have.rank != want.rank:
        return f"rank {have.rank} != {want.rank}"
    for axis, (a, b) in enumerate(zip(have.dims, want.dims, strict=True)):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return f"axis {axis} is fixed to {a} != {b}"
    return None


def describe(contract: TensorContract) -> str:
    """``float16[batch, sequence, 32]`` (``?`` for an unknown extent)."""
    dims = ", ".join("?" if d is None else str(d) for d in contract.dims)
    return f"{contract.dtype}[{dims}]"


def last_extent(contract: TensorContract | None) -> int | None:
    if contract is None or not contract.dims:
        return None
    dim = contract.dims[-1]
    return dim if isinstance(dim, int) else None


def is_integer_scalar(contract: TensorContract, *, per_row: bool = False) -> bool:
    """Rank 0, or rank 1 of shape ``[1]`` (``per_row``: or one request row, ``[batch]``)."""
    if contract.dtype not in INTEGER_DTYPES:
        return False
    if contract.rank == 0:
        return True
    if contract.rank != 1:
        return False
    if contract.dims[0] == 1:
        return True
    layout = contract.batch_layout
    return per_row and layout.kind == "request_aligned" and layout.axis == 0


# -- lookups --------------------------------------------------------------------------------
def groups_of(wf: Workflow) -> dict:
    return dict(wf.serving.state_service.groups) if wf.serving else {}


def declares_ports(component: Component | None) -> bool:
    """False for "inferred" ports (none declared): unsupported, and nothing to check here."""
    ports = component.ports if component is not None else None
    return ports is not None and bool(ports.inputs or ports.outputs)


def ports_of(component: Component | None) -> tuple[dict, dict]:
    if component is None or component.ports is None:
        return {}, {}
    return component.ports.inputs, component.ports.outputs


def component_roles(doc: Document) -> tuple[str | None, str | None]:
    """(target, proposer): those of the ``speculative`` section, else the only component and
    no proposer; target ``None`` if it cannot be told."""
    spec = doc.speculative
    if spec is not None:
        return spec.target, spec.proposer
    components = list(doc.workflow.components)
    return (components[0] if len(components) == 1 else None), None


def invokes_of(wf: Workflow, component: str | None) -> list[tuple[int, Step]]:
    """(index, step) of every top-level invoke of ``component``."""
    return [(i, s) for i, s in enumerate(wf.steps)
            if s.kind == "invoke" and s.component == component]


def owners(wf: Workflow) -> dict[str, list[tuple[str, StatePortAlias]]]:
    """Cell -> every (component, alias) that writes it (read_write with an output)."""
    result: dict[str, list[tuple[str, StatePortAlias]]] = {}
    for group in groups_of(wf).values():
        for component, aliases in group.ports.items():
            for cell_name, alias in aliases.items():
                if alias.access == "read_write" and alias.output is not None:
                    result.setdefault(cell_name, []).append((component, alias))
    return result
