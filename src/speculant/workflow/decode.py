"""Prefill and the caches a decode starts from (runtime.md §2.3, §5)."""

from __future__ import annotations

import numpy as np

from speculant.errors import AdmissionError
from speculant.package.package import Package
from speculant.tensors import NUMPY_DTYPES, Value
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import TargetPass


def empty_cells(package: Package) -> dict[str, Value]:
    """Each cell as an empty host tensor: extent 1 on the request axis, 0 on the group's
    sequence axis, the contract's fixed extents, and the owner graph's static extents for
    symbolic axes."""
    plan = package.plan
    graph_inputs = {i.name: i for i in package.graphs[plan.target].graph.input}
    cells = {}
    for cell in plan.cells.values():
        contract = cell.contract
        graph_dims = graph_inputs[cell.owner_input].type.tensor_type.shape.dim
        shape = []
        for axis, dim in enumerate(contract.dims):
            if axis == cell.sequence_axis:
                shape.append(0)
            elif contract.batch_layout.kind == "request_aligned" and \
                    axis == contract.batch_layout.axis:
                shape.append(1)
            elif isinstance(dim, int):
                shape.append(dim)
            elif axis < len(graph_dims) and graph_dims[axis].HasField("dim_value"):
                shape.append(graph_dims[axis].dim_value)
            else:
                raise AdmissionError(
                    f"cell '{cell.name}' axis {axis} ({dim!r}) has no static extent in the "
                    f"contract or in input '{cell.owner_input}' of the target graph, so its "
                    "empty starting value cannot be built",
                    path=f"pipeline.workflow.state.{cell.name}.contract.shape.{axis}",
                    remedy="fix the extent in the contract or the graph")
        cells[cell.name] = Value.host(np.zeros(shape, NUMPY_DTYPES[contract.dtype]),
                                      contract.dtype)
    return cells


def prefill(state: DecodeState, target: TargetPass) -> list[int]:
    """Pass over the prompt from empty caches; commit the first token (it becomes pending):
    the argmax of the last row, or under sampling a draw from its ``T(row)``."""
    seam = state.seam
    prompt = state.tokens[: state.prompt_len]
    vp = target.run(prompt, 0, state.cells, state.admitted)
    last_row = seam.last_along_axis(vp.logits, vp.logits.rank - 2)  # [1, 1, V]
    first, _ = choose(seam, state.sampler, last_row, state.stats)
    state.stats.target_passes += 1
    state.advance(vp, len(prompt))
    return state.commit([first])
