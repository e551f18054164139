"""The serving controls (docs/design/spec/metadata.md §4.7, `workflow.serving`): rule 20, and the
controls the plan names (active, done, accepted_len -> the workflow input that carries each).

speculant seeds the controls at admission and updates them after every pass, so each must be
a workflow input it can bind.
"""

from __future__ import annotations

from speculant.errors import MetadataError, ProblemCollector
from speculant.package.common import INTEGER_DTYPES, SV, WF, unsupported
from speculant.package.model import Document
from speculant.package.steps import Values

CONTROL_DTYPES = {"active": ("bool",), "done": ("bool",), "accepted_len": tuple(INTEGER_DTYPES)}


def check(doc: Document, values: Values, out: ProblemCollector) -> None:
    wf = doc.workflow
    serving = wf.serving
    if serving is None:
        return
    if not serving.state_service.groups:
        out.add(MetadataError, "serving declares no state groups",
                path=f"{SV}.state_service.groups", expected="a non-empty map", rule="20")
    elif serving.accepted_len is None:
        out.add(MetadataError, "serving with state groups needs accepted_len",
                path=f"{SV}.accepted_len", expected="the name of a workflow input", rule="20")
    for control, dtypes in CONTROL_DTYPES.items():
        value = getattr(serving, control)
        if value is None:
            continue
        path = f"{SV}.{control}"
        if value not in wf.inputs:
            unsupported(out, "20", f"serving control '{value}' that is not a workflow input",
                        f"{WF}.serving.{control}", value,
                        "a workflow input (speculant seeds and evolves the controls)")
        if value not in values:
            out.add(MetadataError, f"serving control '{value}' is not a defined value",
                    path=path, value=value, expected="a workflow input", rule="20")
            continue
        contract = values[value]
        if contract is None:
            continue
        layout = contract.batch_layout
        if contract.dtype not in dtypes:
            out.add(MetadataError, f"serving control '{value}' has dtype {contract.dtype}",
                    path=path, value=contract.dtype, rule="20",
                    expected=" or ".join(dtypes[:2]) +
                    (" (an integer dtype)" if len(dtypes) > 2 else ""))
        elif contract.rank > 1:
            out.add(MetadataError, f"serving control '{value}' has rank {contract.rank}",
                    path=path, value=contract.rank, expected="rank 0 or 1", rule="20")
        elif contract.rank == 1 and not (layout.kind == "request_aligned" and layout.axis == 0):
            out.add(MetadataError, f"rank-1 serving control '{value}' is not request_aligned "
                    "on axis 0", path=path, value=layout.kind, rule="20",
                    expected="batch_layout {kind: request_aligned, axis: 0}")


def controls(doc: Document) -> dict[str, str]:
    """Control -> the workflow input that carries it."""
    serving = doc.workflow.serving
    if serving is None:
        return {}
    found = {"active": serving.active, "done": serving.done}
    if serving.accepted_len:
        found["accepted_len"] = serving.accepted_len
    return found
