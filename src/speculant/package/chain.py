"""The chained speculative contract (docs/design/spec/metadata.md §4.9): rules 26–32, the
proposal forms speculant cannot run (rule 27), admission of the embedding table and the widths
(A6–A8), and the plan's ``ChainPlan``.

Derive first, then check what was derived: ``derive`` reads the chain's facts from the
document once — the fused, seed and carry contracts, the position symbol σ (the fused port's
second-to-last axis) and the borrowed-cache symbol κ (the borrowed ports' sequence axis) —
and the rules, the summary and the plan all read those facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from speculant.errors import AdmissionError, MetadataError, ProblemCollector, UnsupportedError
from speculant.package.common import (
    GROUPS,
    PE,
    WF,
    groups_of,
    invokes_of,
    is_empty,
    last_extent,
    ports_of,
    unsupported,
)
from speculant.package.graphs import graph_ports, onnx_dtype_name, static_last
from speculant.package.model import Document, TensorContract
from speculant.package.paths import confine
from speculant.package.plan import ChainPlan

SPECULATIVE_IDENTITY = "onnx-genai.speculative"  # the speculative contract speculant implements
MAX_LISTED_INITIALIZERS = 8
MAP_PATH = "speculative.vocabulary.artifact"  # a mapped vocabulary's map
NAME_AXES_REMEDY = "give each sequence-like extent its own symbol: run `speculant metadata " \
                   "name-axes PACKAGE`, which republishes the document with distinct symbols"


@dataclass(frozen=True)
class ChainFacts:
    """What the document says about the chain, read once (every field tolerates a document
    that breaks the rules: a missing port is ``None``)."""

    fused: TensorContract | None  # the proposer's token_embedding_input port
    seed: TensorContract | None  # the target's folded_carry_seed output
    carry: TensorContract | None  # the proposer's folded_carry_output
    position_symbol: str | None  # σ
    borrowed_symbols: dict[str, str] = field(default_factory=dict)  # proposer port -> κ
    borrowed: dict[str, str] = field(default_factory=dict)  # proposer port -> cell it reads

    @property
    def kv_symbol(self) -> str | None:
        return next(iter(self.borrowed_symbols.values()), None)


def derive(doc: Document) -> ChainFacts | None:
    """The chain's facts, or ``None`` for a document without a speculative section."""
    spec = doc.speculative
    if spec is None or doc.pipeline is None:
        return None
    wf = doc.workflow
    pe = spec.proposal_execution
    p_inputs, p_outputs = ports_of(wf.components.get(spec.proposer))
    _, t_outputs = ports_of(wf.components.get(spec.target))
    fused = p_inputs.get(pe.token_embedding_input or "")
    seed = t_outputs.get(pe.folded_carry_seed.output) if pe.folded_carry_seed else None
    carry = p_outputs.get(pe.folded_carry_output or "")
    sigma = None
    if fused is not None and fused.rank >= 3 and isinstance(fused.dims[-2], str):
        sigma = fused.dims[-2]
    symbols: dict[str, str] = {}
    borrowed: dict[str, str] = {}
    for group in groups_of(wf).values():
        for cell_name, alias in group.ports.get(spec.proposer, {}).items():
            if alias.access != "read_only":
                continue
            borrowed[alias.input] = cell_name
            contract, axis = p_inputs.get(alias.input), group.sequence_axis
            if contract is None or axis is None or axis >= contract.rank:
                continue
            if isinstance(contract.dims[axis], str):
                symbols[alias.input] = contract.dims[axis]
    return ChainFacts(fused, seed, carry, sigma, symbols, borrowed)


def check(doc: Document, facts: ChainFacts | None, out: ProblemCollector) -> None:
    spec = doc.speculative
    if spec is None or facts is None:
        return
    wf = doc.workflow
    for key in ("proposer", "target"):
        name = getattr(spec, key)
        if name not in wf.components:
            out.add(MetadataError, f"speculative {key} '{name}' is not a declared component",
                    path=f"speculative.{key}", value=name, rule="26",
                    expected="one of " + ", ".join(wf.components))
    if spec.proposer == spec.target:
        out.add(MetadataError, "speculative proposer and target are the same component",
                path="speculative.proposer", value=spec.proposer, rule="26",
                expected="two distinct components")
    _check_forms(doc, out)
    if spec.proposer in wf.components and spec.target in wf.components \
            and spec.proposer != spec.target and spec.proposal_execution.kind == "chained":
        _check_ports(doc, out)
        _check_carry(doc, facts, out)
        _check_bindings(doc, facts, out)


def _check_forms(doc: Document, out: ProblemCollector) -> None:
    """Rule 27: the proposal forms speculant cannot run."""
    spec = doc.speculative
    assert spec is not None
    pe = spec.proposal_execution
    if pe.kind != "chained":
        unsupported(out, "27", f"{pe.kind} proposal execution", f"{PE}.kind", pe.kind,
                    "chained (speculant runs chained proposers)")
    for key, implemented in (("identity", SPECULATIVE_IDENTITY), ("version", "1")):
        value = getattr(spec, key)
        if value not in (None, implemented):
            unsupported(out, "27", f"speculative contract {key} '{value}'",
                        f"speculative.{key}", value, f"{implemented} or absent")
    if not is_empty(spec.verification):
        unsupported(out, "27", "a declared verification contract", "speculative.verification",
                    None, "absent (speculant verifies against the target's logits role)")
    if pe.recurrent:
        unsupported(out, "27", "proposer-owned recurrent state", f"{PE}.recurrent", None,
                    "absent or empty")
    if not is_empty(spec.shared_weights):
        unsupported(out, "27", "shared_weights", "speculative.shared_weights", None,
                    "absent or empty")
    for role in spec.port_bindings:
        if role != "target_hidden_context":
            unsupported(out, "27", f"port_bindings role '{role}'",
                        f"speculative.port_bindings.{role}", role, "target_hidden_context")
    if pe.kind == "chained" and pe.folded_carry_output is None:
        unsupported(out, "27", "a chained proposal without folded_carry_output",
                    f"{PE}.folded_carry_output", None, "a proposer output port")


def _check_ports(doc: Document, out: ProblemCollector) -> None:
    """Rule 28."""
    spec = doc.speculative
    assert spec is not None
    pe = spec.proposal_execution
    p_inputs, p_outputs = ports_of(doc.workflow.components[spec.proposer])
    for key, ports, side in (("token_embedding_input", p_inputs, "input"),
                             ("logits_output", p_outputs, "output"),
                             ("folded_carry_output", p_outputs, "output")):
        port = getattr(pe, key)
        if port is None:
            if key != "folded_carry_output":  # its absence is unsupported (rule 27)
                out.add(MetadataError, f"a chained proposal needs {key}", path=f"{PE}.{key}",
                        expected=f"a proposer {side} port", rule="28")
        elif port not in ports:
            out.add(MetadataError, f"{key} '{port}' is not a declared {side} port of proposer "
                    f"'{spec.proposer}'", path=f"{PE}.{key}", value=port, rule="28",
                    expected="one of " + ", ".join(ports))


def _check_carry(doc: Document, facts: ChainFacts, out: ProblemCollector) -> None:
    """Rules 29–31, and one symbol κ on the sequence axis of every borrowed cache."""
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    pe = spec.proposal_execution
    if pe.folded_carry_output is None:
        return
    _, t_outputs = ports_of(wf.components[spec.target])
    for key, present in (("folded_carry_seed", pe.folded_carry_seed is not None),
                         ("token_embedding", pe.token_embedding is not None)):
        if not present:
            out.add(MetadataError, f"a folded carry needs {key}", path=f"{PE}.{key}",
                    expected="{component: <target>, ...}", rule="29")
    hidden = spec.port_bindings.get("target_hidden_context")
    hidden_path = "speculative.port_bindings.target_hidden_context"
    if hidden is None:
        out.add(MetadataError, "a folded carry needs port_bindings.target_hidden_context",
                path=hidden_path, rule="29",
                expected=f"'{pe.token_embedding_input}' (the token_embedding_input)")
    elif hidden != pe.token_embedding_input:
        out.add(MetadataError, "port_bindings.target_hidden_context must equal "
                "token_embedding_input: the carry comes back as the tail of the fused input",
                path=hidden_path, value=hidden, expected=str(pe.token_embedding_input),
                rule="29")
    target_kind = wf.components[spec.target].implementation.kind
    if target_kind != "onnx":
        out.add(MetadataError, "a folded carry needs an ONNX target", value=target_kind,
                path=f"{WF}.components.{spec.target}.implementation.kind", expected="onnx",
                rule="29")
    if pe.folded_carry_seed is not None:
        seed = pe.folded_carry_seed
        if seed.component != spec.target:
            out.add(MetadataError, "folded_carry_seed.component must be the target",
                    path=f"{PE}.folded_carry_seed.component", value=seed.component,
                    expected=spec.target, rule="29")
        if seed.output not in t_outputs:
            out.add(MetadataError, f"folded_carry_seed.output '{seed.output}' is not a declared "
                    f"output of target '{spec.target}'", path=f"{PE}.folded_carry_seed.output",
                    value=seed.output, expected="one of " + ", ".join(t_outputs), rule="29")
    if pe.token_embedding is not None:
        emb = pe.token_embedding
        if emb.component != spec.target:
            out.add(MetadataError, "token_embedding.component must be the target",
                    path=f"{PE}.token_embedding.component", value=emb.component,
                    expected=spec.target, rule="29")
        if not emb.table:
            out.add(MetadataError, "token_embedding.table is empty", rule="29",
                    path=f"{PE}.token_embedding.table", value=emb.table,
                    expected="the name of an initializer of the target model")
        if emb.scale is not None and (not math.isfinite(emb.scale) or emb.scale <= 0):
            out.add(MetadataError, f"token_embedding.scale {emb.scale} is not a finite number "
                    "> 0", path=f"{PE}.token_embedding.scale", value=emb.scale,
                    expected="a finite number > 0", rule="29")
    fused = facts.fused
    if fused is None:
        return
    for key, contract in (("folded_carry_seed.output", facts.seed),
                          ("folded_carry_output", facts.carry)):
        if contract is not None and contract.dtype != fused.dtype:
            out.add(MetadataError, f"{key} has dtype {contract.dtype} but the fused port "
                    f"'{pe.token_embedding_input}' (the chain's currency) is {fused.dtype}",
                    path=f"{PE}.{key}", value=contract.dtype, expected=fused.dtype, rule="30")
    w_f, w_seed, w_carry = last_extent(fused), last_extent(facts.seed), last_extent(facts.carry)
    if w_seed is not None and w_carry is not None and w_seed != w_carry:
        out.add(MetadataError, f"carry widths disagree: folded_carry_seed output is {w_seed}, "
                f"folded_carry_output is {w_carry}", path=f"{PE}.folded_carry_output",
                value=w_carry, expected=str(w_seed), rule="31")
    w_c = w_seed if w_seed is not None else w_carry
    if w_c is not None and w_f is not None and w_c >= w_f:
        out.add(MetadataError, f"carry width W_C {w_c} leaves no room for the embedding in the "
                f"fused width W_F {w_f}", path=f"{PE}.token_embedding_input",
                value={"W_C": w_c, "W_F": w_f}, expected="W_C < W_F", rule="31")
    kappas = facts.borrowed_symbols
    if len(set(kappas.values())) > 1:
        out.add(MetadataError, "borrowed cache ports disagree on the symbol of their sequence "
                f"axis: {kappas}", path=GROUPS, value=kappas, rule="§5",
                expected="one symbol (the borrowed-cache symbol)")


def _check_bindings(doc: Document, facts: ChainFacts, out: ProblemCollector) -> None:
    """Rule 32 (U parts), σ = κ included."""
    spec = doc.speculative
    assert spec is not None
    wf = doc.workflow
    pe = spec.proposal_execution
    sigma = facts.position_symbol
    if sigma is not None and sigma in facts.borrowed_symbols.values():
        # Rule 32 makes σ = κ a MetadataError. The published Gemma 4 E2B speculative
        # example (conformance 24) names every sequence-like axis `sequence`, so σ = κ there,
        # and published documents must validate at metadata level: speculant therefore treats
        # it as an UnsupportedError of a runnable load, with the remedy.
        ports = sorted(p for p, k in facts.borrowed_symbols.items() if k == sigma)
        out.add(UnsupportedError,
                f"the fused port '{pe.token_embedding_input}' and the borrowed cache ports "
                f"{ports} use one symbol '{sigma}' for the position axis (σ) and the borrowed "
                "cache axis (κ); speculant would narrow the borrowed caches to one position",
                path=f"{WF}.components.{spec.proposer}.ports.inputs.{pe.token_embedding_input}"
                ".shape", value=sigma, expected="distinct symbols for σ and κ",
                remedy=NAME_AXES_REMEDY, rule="32")
    target_outputs: dict[str, str] = {}
    for index, step in invokes_of(wf, spec.target)[:1]:
        target_outputs = step.invoke_outputs()
        seed = pe.folded_carry_seed
        if seed is not None and seed.output not in target_outputs:
            unsupported(out, "32", f"a target invoke that does not bind the seed output "
                        f"'{seed.output}'", f"{WF}.steps.{index}.outputs.{seed.output}",
                        None, "a binding for the folded_carry_seed output")
    produced = set(target_outputs.values())
    for index, step in invokes_of(wf, spec.proposer)[:1]:
        for port, value in (step.inputs or {}).items():
            if port == pe.token_embedding_input or port in facts.borrowed:
                continue
            if value not in wf.inputs and value not in produced:
                unsupported(out, "32", f"a proposer input '{port}' bound to '{value}', which is "
                            "neither a workflow input nor a target output",
                            f"{WF}.steps.{index}.inputs.{port}", value,
                            "a workflow input or a target output")


# -- admission: A6–A8 -----------------------------------------------------------------------
def admit(doc: Document, graphs: dict[str, onnx.ModelProto], files: dict[str, str],
          out: ProblemCollector, root: Path) -> int | None:
    """A6 (the table is a target initializer), A7 (its shape and currency), A8 (widths and
    vocabularies, a mapped vocabulary's map). Returns W_E when the table admits."""
    spec = doc.speculative
    if spec is None or spec.target not in graphs or spec.proposer not in graphs:
        return None
    wf = doc.workflow
    pe = spec.proposal_execution
    target_model = graphs[spec.target]
    p_inputs, p_outputs = ports_of(wf.components[spec.proposer])
    t_ports = wf.components[spec.target].ports
    _, t_outputs = ports_of(wf.components[spec.target])
    p_graph_in, p_graph_out = graph_ports(graphs[spec.proposer])
    _, t_graph_out = graph_ports(target_model)
    target_file, proposer_file = files[spec.target], files[spec.proposer]
    table_path = f"{PE}.token_embedding.table"

    w_e = v_e = None
    if pe.kind == "chained" and pe.token_embedding is not None:
        table_name = pe.token_embedding.table
        tables = {t.name: t for t in target_model.graph.initializer}
        table = tables.get(table_name)
        if table is None:
            names = list(tables)
            listed = ", ".join(names[:MAX_LISTED_INITIALIZERS])
            more = ", ..." if len(names) > MAX_LISTED_INITIALIZERS else ""
            out.add(AdmissionError, f"token_embedding.table '{table_name}' is not an initializer "
                    f"of component '{spec.target}' (its model has {len(names)} initializers: "
                    f"{listed}{more})", path=table_path, file=target_file, value=table_name,
                    expected="the name of an initializer of the target model", rule="A6")
        else:
            dims = list(table.dims)
            fused = p_inputs.get(pe.token_embedding_input or "")
            currency = fused.dtype if fused is not None else None
            if len(dims) != 2 or min(dims, default=0) <= 0:
                out.add(AdmissionError, f"embedding table '{table_name}' of component "
                        f"'{spec.target}' has shape {dims}", path=table_path, file=target_file,
                        value=dims, expected="rank 2 with static dims [V_E, W_E]", rule="A7")
            else:
                v_e, w_e = dims
            table_dtype = onnx_dtype_name(table.data_type)
            if currency is not None and table_dtype != currency:
                out.add(AdmissionError, f"embedding table '{table_name}' of component "
                        f"'{spec.target}' is {table_dtype} but the chain's currency (the dtype "
                        f"of fused port '{pe.token_embedding_input}') is {currency}",
                        path=table_path, file=target_file, value=table_dtype,
                        expected=currency, rule="A7")
    fused_port = pe.token_embedding_input or ""
    w_f = static_last(p_inputs.get(fused_port), p_graph_in.get(fused_port))
    w_c = None
    if pe.folded_carry_seed is not None:
        seed_port = pe.folded_carry_seed.output
        w_c = static_last(t_outputs.get(seed_port), t_graph_out.get(seed_port))
    if w_c is None and pe.folded_carry_output:
        w_c = static_last(p_outputs.get(pe.folded_carry_output),
                          p_graph_out.get(pe.folded_carry_output))
    if w_e is not None and w_c is not None and w_f is not None and w_e + w_c != w_f:
        out.add(AdmissionError, f"widths do not add up: embedding W_E {w_e} + carry W_C {w_c} "
                f"!= fused W_F {w_f} (port '{fused_port}' of '{spec.proposer}')",
                path=f"{PE}.token_embedding_input", file=proposer_file,
                value={"W_E": w_e, "W_C": w_c, "W_F": w_f}, expected="W_E + W_C = W_F",
                rule="A8")
    logits_port = pe.logits_output or ""
    proposer_vocab = static_last(p_outputs.get(logits_port), p_graph_out.get(logits_port))
    target_logits = next((p for p, r in (t_ports.roles.items() if t_ports else [])
                          if r == "logits"), "")
    target_vocab = static_last(t_outputs.get(target_logits), t_graph_out.get(target_logits))
    vocabulary = spec.vocabulary
    if vocabulary.kind == "identical" and proposer_vocab is not None \
            and target_vocab is not None and proposer_vocab != target_vocab:
        out.add(AdmissionError, f"vocabulary is identical but proposer '{spec.proposer}' logits "
                f"'{logits_port}' are {proposer_vocab} wide and target '{spec.target}' logits "
                f"'{target_logits}' are {target_vocab} wide", path="speculative.vocabulary.kind",
                file=proposer_file, value=proposer_vocab, expected=str(target_vocab), rule="A8")
    if vocabulary.kind == "subset" and proposer_vocab is not None:
        size_path = "speculative.vocabulary.proposer_vocab_size"
        if proposer_vocab != vocabulary.proposer_vocab_size:
            out.add(AdmissionError, f"proposer '{spec.proposer}' logits '{logits_port}' are "
                    f"{proposer_vocab} wide but proposer_vocab_size is "
                    f"{vocabulary.proposer_vocab_size}", path=size_path, file=proposer_file,
                    value=proposer_vocab, expected=str(vocabulary.proposer_vocab_size),
                    rule="A8")
        if target_vocab is not None and proposer_vocab > target_vocab:
            out.add(AdmissionError, f"proposer vocabulary {proposer_vocab} exceeds the target's "
                    f"{target_vocab}", path=size_path, file=proposer_file, value=proposer_vocab,
                    expected=f"<= {target_vocab}", rule="A8")
    if vocabulary.kind == "mapped":
        _admit_map(root, str(vocabulary.artifact), proposer_vocab, target_vocab or v_e, out)
    if v_e is not None and proposer_vocab is not None and v_e < proposer_vocab:
        out.add(AdmissionError, f"embedding table has {v_e} rows, fewer than the proposer "
                f"vocabulary {proposer_vocab}", path=table_path, file=target_file, value=v_e,
                expected=f">= {proposer_vocab}", rule="A8")
    return w_e


def read_vocabulary_map(path: Path) -> np.ndarray:
    """[V_q], the target id of each proposer id: ``.npy``, else raw little-endian int64."""
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if (size := path.stat().st_size) % 8:
        raise ValueError(f"{size} bytes are not whole int64 values")
    return np.fromfile(path, "<i8")


def _admit_map(root: Path, artifact: str, width: int | None, vocab: int | None,
               out: ProblemCollector) -> None:
    """A8 for ``vocabulary: mapped``: one distinct target id per proposer id."""
    file = confine(root, artifact, MAP_PATH, out, what="vocabulary map")
    try:
        ids = read_vocabulary_map(file) if file is not None else np.arange(width or 0)
        problem = "is not a 1-D integer array" if ids.ndim != 1 or ids.dtype.kind not in "iu" \
            else f"has {ids.size} entries for {width} proposer ids" if width not in (
                None, ids.size) else "maps outside the target's ids" if ids.size and (
                ids.min() < 0 or ids.max() >= (vocab or ids.max() + 1)) \
            else "maps two proposer ids to one target id" if np.unique(ids).size < ids.size \
            else None
    except (OSError, ValueError, EOFError) as exc:
        problem, ids = f"cannot be read: {exc}", np.zeros(0)
    if problem is not None:
        out.add(AdmissionError, f"vocabulary map '{artifact}' {problem}", path=MAP_PATH,
                file=str(file), value=ids.tolist()[:16], rule="A8", expected=f"{width or 'V_q'}"
                f" distinct target ids in [0, {vocab or 'V'}), .npy or raw little-endian int64")


# -- what load derives ----------------------------------------------------------------------
def plan(doc: Document, facts: ChainFacts) -> ChainPlan | None:
    """The resolved chain of a document that passed the rules (None unless chained)."""
    spec = doc.speculative
    assert spec is not None
    pe = spec.proposal_execution
    if pe.kind != "chained":
        return None
    assert facts.fused is not None and pe.token_embedding_input and pe.logits_output
    assert pe.folded_carry_output and pe.folded_carry_seed and pe.token_embedding
    return ChainPlan(
        fused_port=pe.token_embedding_input, logits_output=pe.logits_output,
        carry_output=pe.folded_carry_output, seed_output=pe.folded_carry_seed.output,
        table=pe.token_embedding.table, scale=pe.token_embedding.scale,
        currency=facts.fused.dtype, fused_width=last_extent(facts.fused),
        carry_width=last_extent(facts.seed), position_symbol=facts.position_symbol,
        kv_symbol=facts.kv_symbol, borrowed=dict(facts.borrowed))


def chain_bound_inputs(doc: Document, chain: ChainPlan | None) -> tuple[str, ...]:
    """Workflow inputs that the proposer's invoke binds only to ports the chain fills itself
    (the fused port, the borrowed caches), and that nothing else reads: a caller never
    supplies them."""
    spec = doc.speculative
    if chain is None or spec is None:
        return ()
    wf = doc.workflow
    chain_ports = {chain.fused_port, *chain.borrowed}
    candidates: set[str] = set()
    elsewhere: set[str] = set()
    for step in wf.steps:
        for port, value in (step.inputs or {}).items():
            is_chain_port = step.component == spec.proposer and port in chain_ports
            (candidates if is_chain_port else elsewhere).add(value)
        if step.kind == "emit" and step.value:
            elsewhere.add(step.value)
    for cell in wf.state.values():
        elsewhere.update(v for v in (cell.initializer, cell.recurrence.max,
                                     cell.recurrence.increment) if v)
    if wf.serving is not None:
        elsewhere.update(v for v in (wf.serving.active, wf.serving.done,
                                     wf.serving.accepted_len) if v)
    return tuple(sorted(v for v in candidates - elsewhere if v in wf.inputs))
