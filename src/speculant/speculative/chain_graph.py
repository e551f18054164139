"""The drafter's step graph: one chained step is one ONNX Runtime run.

At load the proposer's graph is rewritten once so that the step gathers and scales its
token's row, fuses it with the carry and reduces its scores to an id inside itself
(docs/design/chained.md, "The step graph"); a draft decides only what is verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from speculant.errors import AdmissionError, ChainError
from speculant.package.chain import read_vocabulary_map
from speculant.package.model import Ports, TensorContract
from speculant.package.package import Package
from speculant.package.plan import ChainPlan
from speculant.tensors import NUMPY_DTYPES

TABLE = "speculant.chain.table"  # [V_E, W_E] currency: the target's table as stored
SCALE = "speculant.chain.scale"  # [] currency: token_embedding.scale (an initializer)
TOKEN = "speculant.chain.token"  # [1] int32: the token whose successor the step predicts
CARRY = "speculant.chain.carry"  # [1, ..., 1, W_C] currency: the carry the step is fed
NEXT = "speculant.chain.next_token"  # [1] int32: argmax of the step's last score row
NEXT64 = "speculant.chain.next64"  # [1] int64: the same, as ArgMax gives it
TOKENS = "speculant.chain.tokens"  # [2] int32: s and p, the unrolled chain's first tokens
DRAFTS = "speculant.chain.drafts"  # [D - 1] int32: the unrolled chain's drafts

_PREFIX = "speculant.chain."


@dataclass(frozen=True)
class StepComponent:
    """What the proposer's session is made from: the step graph and its ports."""

    source: bytes  # the serialized step graph
    ports: Ports  # the proposer's ports, the fused input replaced by TABLE, TOKEN, CARRY


def step_component(package: Package, *, rows: bool = False) -> StepComponent:
    """The proposer's step graph (see the module). ``rows``: the step of ``B`` rows at once
    (the scheduler's, speculative/chain_rows.py): ``TOKEN`` [B], ``CARRY`` [B, 1, W_C] and
    ``NEXT`` [B], the request axis the fused port's own symbol (a ChainError where the
    fused port's request axis is not its first, or the step broadcasts its row)."""
    name, chain = package.plan.proposer, package.plan.chain
    assert name is not None and chain is not None
    model = onnx.ModelProto()
    model.CopyFrom(package.graphs[name])
    if any(external_data_helper.uses_external_data(t) for t in model.graph.initializer):
        external_data_helper.load_external_data_for_model(
            model, str(package.artifacts[name].parent))  # confined at load (A1)
    table = table_initializer(package, chain)
    ports = package.document.workflow.components[name].ports
    assert ports is not None
    step_shape = (*step_prefix(ports.inputs[chain.fused_port], chain, rows=rows),
                  chain.fused_width)
    _check_names(model.graph, str(package.artifacts[name]))
    vocabulary, vocab = package.document.speculative.vocabulary, package.logits_width or 0
    ids = read_vocabulary_map(package.root / vocabulary.artifact) \
        if vocabulary.kind == "mapped" else None  # [V_q] target ids (admitted: A8)
    _rewrite(model.graph, chain, step_shape, table, ports, ids, vocab)
    inputs = {port: c for port, c in ports.inputs.items() if port != chain.fused_port}
    inputs[TABLE] = TensorContract(dtype=chain.currency, rank=2, shape=list(table.dims))
    batch = step_shape[0] if rows else 1  # the step's rows: B (a symbol) or 1
    inputs[TOKEN] = TensorContract(dtype="int32", rank=1, shape=[batch])
    inputs[CARRY] = TensorContract(dtype=chain.currency, rank=len(step_shape),
                                   shape=[*step_shape[:-1], chain.carry_width])
    outputs = {**ports.outputs, NEXT: TensorContract(dtype="int32", rank=1, shape=[batch])}
    if ids is not None:  # the logits output scores the target's V ids
        logits = outputs[chain.logits_output]
        outputs[chain.logits_output] = logits.model_copy(update={"shape": [*logits.dims[:-1],
                                                                           vocab]})
    return StepComponent(model.SerializeToString(),
                         Ports(inputs=inputs, outputs=outputs, roles=dict(ports.roles)))


def step_prefix(fused: TensorContract, chain: ChainPlan, *, rows: bool = False
                ) -> tuple[int | str, ...]:
    """The fused input's extents but the last, for one step: the request axis and σ are 1,
    a static extent is itself; an axis speculant cannot derive is a ChainError. ``rows``:
    the request axis keeps its symbol (``B`` rows), and must be the first of 1s."""
    prefix: list[int | str] = []
    if rows:
        dims = fused.dims[:-1]
        if fused.batch_layout.axis != 0 or not isinstance(dims[0], str) or any(
                dim != 1 and dim != chain.position_symbol for dim in dims[1:]):
            raise ChainError(f"the fused port '{chain.fused_port}' {list(fused.dims)} is not "
                             "[batch, 1 or σ …, width]: its rows cannot step in one run",
                             value=list(fused.dims),
                             path="speculative.proposal_execution.token_embedding_input",
                             remedy="decode chained requests alone (engine.generate), or use "
                                    "proposer='prompt_lookup' or 'draft' with the scheduler")
        return (dims[0], *([1] * (len(dims) - 1)))
    for axis, dim in enumerate(fused.dims[:-1]):
        if axis == fused.batch_layout.axis or dim == chain.position_symbol:
            prefix.append(1)
        elif isinstance(dim, int):
            prefix.append(dim)
        else:
            raise ChainError(f"axis {axis} ({dim!r}) of the fused port '{chain.fused_port}' has "
                             "no extent speculant can derive", value=dim,
                             path="speculative.proposal_execution.token_embedding_input")
    return tuple(prefix)


def row_scale(chain: ChainPlan) -> np.ndarray | None:
    """[] currency: ``token_embedding.scale``, each gathered row's factor (None: none)."""
    return None if chain.scale is None else np.asarray(chain.scale,
                                                       NUMPY_DTYPES[chain.currency])


def table_initializer(package: Package, chain: ChainPlan) -> TensorProto:
    """The target's initializer holding the token embeddings (load admitted it: A6)."""
    graph = package.graphs[package.plan.target].graph
    return next(i for i in graph.initializer if i.name == chain.table)


def _check_names(graph: onnx.GraphProto, artifact: str) -> None:
    """The rewrite's names must be free in the drafter's graph (an AdmissionError otherwise)."""
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    taken.update(value.name for value in (*graph.input, *graph.output, *graph.initializer))
    clashes = sorted(name for name in taken if name.startswith(_PREFIX))
    if clashes:
        raise AdmissionError(
            f"the chained drafter's graph already names {clashes}: the prefix '{_PREFIX}' is "
            "speculant's, for the step graph it derives at load", file=artifact,
            path="speculative.proposer", value=clashes[0],
            remedy=f"rename those values in the drafter's graph (no name may start with "
            f"'{_PREFIX}')")


def _rewrite(graph: onnx.GraphProto, chain: ChainPlan, step_shape: tuple[int | str, ...],
             table: TensorProto, ports: Ports, ids: np.ndarray | None, vocab: int) -> None:
    fused = next(i for i in graph.input if i.name == chain.fused_port)
    elem_type = fused.type.tensor_type.elem_type
    graph.input.remove(fused)
    prefix = list(step_shape[:-1])
    token_shape = [dim for dim in prefix if isinstance(dim, str)][:1] or [1]  # [B] or [1]
    graph.input.extend([
        helper.make_tensor_value_info(TABLE, elem_type, list(table.dims)),
        helper.make_tensor_value_info(TOKEN, TensorProto.INT32, token_shape),
        helper.make_tensor_value_info(CARRY, elem_type, [*prefix, chain.carry_width]),
    ])
    logits_rank = _rank_of(graph, chain.logits_output, ports)
    broadcast = any(isinstance(dim, int) and dim != 1 for dim in prefix)  # a wider step
    constants = {  # [1 or B (-1), 1, ..., 1, W_E]
        "row_shape": [-1 if isinstance(dim, str) else 1 for dim in prefix] + [table.dims[1]],
        **({"prefix_shape": [*prefix, 1], "last_row": -1} if broadcast else {}),  # Expand, Gather
    }
    graph.initializer.extend(
        numpy_helper.from_array(_int64(value), _PREFIX + key) for key, value in constants.items())
    scale = row_scale(chain)
    if scale is not None:
        graph.initializer.append(numpy_helper.from_array(scale, SCALE))
    n = _PREFIX
    row = n + ("row_e" if broadcast else "row_r")
    gathered = n + ("row" if scale is None else "row_stored")
    prologue = [  # the fused input: the token's scaled row and the carry (at the prefix)
        helper.make_node("Gather", [TABLE, TOKEN], [gathered], axis=0),
        *([] if scale is None else [helper.make_node("Mul", [gathered, SCALE], [n + "row"])]),
        helper.make_node("Reshape", [n + "row", n + "row_shape"], [n + "row_r"]),
        *([helper.make_node("Expand", [n + "row_r", n + "prefix_shape"], [row])]
          if broadcast else []),
        helper.make_node("Concat", [row, CARRY], [chain.fused_port], axis=-1),
    ]
    if ids is not None:
        _map_scores(graph, chain.logits_output, logits_rank, ids, vocab)
    rows = helper.make_node("Flatten", [chain.logits_output], [n + "rows"], axis=logits_rank - 1)
    epilogue = [rows, *([  # the argmax of the last score row ([rows, V]: a view)
        helper.make_node("Gather", [n + "rows", n + "last_row"], [n + "scores"], axis=0),
        helper.make_node("ArgMax", [n + "scores"], [NEXT64], axis=0, keepdims=1),
    ] if broadcast else [  # one row: its argmax, no copy of the row first
        helper.make_node("ArgMax", [n + "rows"], [NEXT64], axis=1, keepdims=0),
    ]), helper.make_node("Cast", [NEXT64], [NEXT], to=TensorProto.INT32)]
    nodes = [*prologue, *graph.node, *epilogue]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info(NEXT, TensorProto.INT32, token_shape))


def _map_scores(graph: onnx.GraphProto, scores: str, rank: int, ids: np.ndarray,
                vocab: int) -> None:
    """A mapped vocabulary: the drafter's scores [..., V_q] (renamed) moved to their target
    columns of the output ``scores`` [..., V], ``-inf`` on ids no proposer id maps to; so its
    argmax, the draft, is a target id (the next step's token) and, sampling, ``q`` is 0 there."""
    own, n = _PREFIX + "draft_scores", _PREFIX
    for values in [v for node in graph.node for v in (node.input, node.output)]:
        values[:] = [own if v == scores else v for v in values]
    output = next(o for o in graph.output if o.name == scores)
    for dim in output.type.tensor_type.shape.dim[-1:]:
        dim.dim_value = vocab
    columns = np.full(vocab, ids.size, np.int64)  # V_q: the padded -inf column
    columns[ids] = np.arange(ids.size)
    fill = np.asarray(-np.inf, helper.tensor_dtype_to_np_dtype(output.type.tensor_type.elem_type))
    graph.initializer.extend(numpy_helper.from_array(value, n + key) for key, value in (
        ("columns", columns), ("fill", fill), ("pads", _int64([0] * (2 * rank - 1) + [1]))))
    graph.node.extend([helper.make_node("Pad", [own, n + "pads", n + "fill"], [n + "padded"]),
                       helper.make_node("Gather", [n + "padded", n + "columns"], [scores],
                                        axis=-1)])


def _rank_of(graph: onnx.GraphProto, output: str, ports: Ports) -> int:
    """The rank of the logits output: its port contract's (load checked it)."""
    contract = ports.outputs.get(output)
    if contract is not None:
        return contract.rank
    declared = next(o for o in graph.output if o.name == output)
    return len(declared.type.tensor_type.shape.dim)


def bootstrap_component(step: StepComponent, carry_output: str) -> StepComponent:
    """The step graph with the carry its only output: a proposal's step 0, whose prediction
    is ``p`` (known already), without the scores and the argmax (ONNX Runtime runs every node
    of a graph; the LM head is most of a drafter step on the CPU) and their weights."""
    model = onnx.load_from_string(step.source)
    graph = model.graph
    nodes = _live(list(graph.node), carry_output)
    used = {name for node in nodes for name in node.input}
    initializers = [t for t in graph.initializer if t.name in used]
    outputs = [o for o in graph.output if o.name == carry_output]
    produced = {name for node in nodes for name in node.output}
    value_info = [v for v in graph.value_info if v.name in produced]
    for field, kept in ((graph.node, nodes), (graph.initializer, initializers),
                        (graph.output, outputs), (graph.value_info, value_info)):
        del field[:]
        field.extend(kept)
    ports = Ports(inputs=dict(step.ports.inputs),
                  outputs={carry_output: step.ports.outputs[carry_output]},
                  roles=dict(step.ports.roles))
    return StepComponent(model.SerializeToString(), ports)


def _live(nodes: list[onnx.NodeProto], output: str) -> list[onnx.NodeProto]:
    """``nodes`` (in order) less those ``output`` does not depend on."""
    needed, kept = {output}, []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            needed.update(node.input)
            kept.append(node)
    return kept[::-1]


def _int64(value: object) -> np.ndarray:
    return np.asarray(value, dtype=np.int64)


def chain_component(step: StepComponent, depth: int, carry_output: str) -> StepComponent | None:
    """The step graph unrolled ``depth`` (>= 2) times: one run of the whole proposal.

    Step ``j``'s nodes are the step graph's, their values prefixed ``speculant.chain.s{j}/``
    (the inputs other than ``TOKEN`` and ``CARRY``, and the initializers, are shared: every
    step reads the same borrowed caches, length and table). Step 0 is fed ``TOKENS[0]`` (s)
    and ``CARRY``, step 1 ``TOKENS[1]`` (p), step ``j >= 2`` step ``j − 1``'s ``NEXT64`` (as
    ArgMax gives it: Gather takes int64); each step's carry output is the next step's carry.
    Output: ``DRAFTS = Cast(Concat(NEXT64_1 … NEXT64_{D−1}))``; the nodes it does not depend
    on (step 0's scores and argmax, each step's Cast) are dropped. None where a node holds a
    subgraph (its outer names would need renaming inside it): step by step then.
    """
    model = onnx.load_from_string(step.source)
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for a in node.attribute):
        return None
    shared = {i.name for i in graph.input if i.name not in (TOKEN, CARRY)}
    shared.update(i.name for i in graph.initializer)
    graph.initializer.extend(numpy_helper.from_array(_int64([j]), f"{_PREFIX}at{j}")
                             for j in (0, 1))
    nodes = [helper.make_node("Gather", [TOKENS, f"{_PREFIX}at{j}"], [f"{_PREFIX}token{j}"],
                              axis=0) for j in (0, 1)]
    token, carry = f"{_PREFIX}token0", CARRY
    for j in range(depth):
        prefix = f"{_PREFIX}s{j}/"
        fed = {TOKEN: token, CARRY: carry}  # what this step reads in place of its inputs
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = prefix + node.name if node.name else ""
            for values in (copy.input, copy.output):
                values[:] = [name if not name or name in shared else
                             fed.get(name, prefix + name) for name in values]
            nodes.append(copy)
        token = f"{_PREFIX}token1" if j == 0 else prefix + NEXT64  # Gather takes int64
        carry = prefix + carry_output
    nodes += [helper.make_node("Concat", [f"{_PREFIX}s{j}/{NEXT64}" for j in range(1, depth)],
                               [DRAFTS + "64"], axis=0),  # one Cast for all drafts
              helper.make_node("Cast", [DRAFTS + "64"], [DRAFTS], to=TensorProto.INT32)]
    nodes = _live(nodes, DRAFTS)  # step 0's scores and argmax: ONNX Runtime would run them
    del graph.value_info[:]
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(DRAFTS, TensorProto.INT32, [depth - 1]))
    kept = [i for i in graph.input if i.name not in (TOKEN, CARRY)]
    carry_input = next(i for i in graph.input if i.name == CARRY)
    del graph.input[:]
    graph.input.extend([*kept, helper.make_tensor_value_info(TOKENS, TensorProto.INT32, [2]),
                        carry_input])
    del graph.node[:]
    graph.node.extend(nodes)
    inputs = {port: c for port, c in step.ports.inputs.items() if port != TOKEN}
    inputs[TOKENS] = TensorContract(dtype="int32", rank=1, shape=[2])
    outputs = {DRAFTS: TensorContract(dtype="int32", rank=1, shape=[depth - 1])}
    return StepComponent(model.SerializeToString(), Ports(inputs=inputs, outputs=outputs))
