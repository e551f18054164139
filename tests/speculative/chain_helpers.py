"""Recording, oracles, checks and planted defects for the chained-speculation tests.

* :func:`run_recorded` runs one ``generate`` with hooks that record every proposal (the state
  it started from, its drafts, what each proposer invocation received and produced), every
  ``DecodeState.advance`` (the cells' extents after it) and every target pass.
* Oracles (runtime.md §15, test-only): :func:`full_recompute_greedy` runs the target over the
  whole stream from empty caches for each new token; :func:`oracle_drafts` runs the runtime's
  proposer on a ``DecodeState`` whose chain context is a fresh pass over ``x[0..C')`` with
  ``num_kept = C'``; :func:`reference_drafts` is the numpy reference chain of the fixture.
* ``check_*`` functions raise ``AssertionError``; the planted-defect tests show that each
  plant makes the matching check raise, so the tests that call the checks on the real runtime
  would fail with the defect in place.
* ``plant_*`` functions install a defect with a ``MonkeyPatch`` (install plants before
  :func:`run_recorded`, which wraps whatever is installed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import speculant
from builders import definition as fx
from builders import reference as ref
from builders.trace import Trace, chained_drafts, speculative_trace
from speculant.speculative import chain_graph
from speculant.speculative import proposal as proposal_module
from speculant.speculative.chain_graph import CARRY, TABLE, TOKEN, step_component
from speculant.speculative.chained import ChainedProposer
from speculant.tensors import Value
from speculant.workflow.state import DecodeState, empty_cells
from speculant.workflow.target_pass import PassResult, TargetPass

SPEC = fx.make_spec()  # the function every shared fixture package computes
MAX_NEW = 40
ROLLBACK_BOUND = 8  # max_proposal_width of the shared pair (conftest.MAX_WIDTH)
WIDTHS = (1, 2, 3, 4, 8)
# Prompts: three that run to the budget, one that stops on EOS at the end of a round, one
# whose EOS cuts a round short (drafts after the EOS are discarded).
PROMPTS = ((5, 9, 3), (2,), (7, 8, 9, 10, 11, 12), (20, 4), (2, 11))
PROBE_PROMPT = (5, 9, 3)  # the prompt of the stated acceptance figures and the plants


# -- recording ------------------------------------------------------------------------------
class FusedProbe:
    """The fused input an engine's step graph builds from a step's bound inputs: the step
    graph (made as the engine made it, plants included) with the fused port as an output."""

    def __init__(self, engine: speculant.Engine) -> None:
        chain = engine.package.plan.chain
        model = onnx.load_from_string(step_component(engine.package).source)
        elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(chain.currency))
        model.graph.output.append(helper.make_tensor_value_info(chain.fused_port, elem_type,
                                                                None))
        self.port = chain.fused_port
        self.session = ort.InferenceSession(model.SerializeToString(),
                                            providers=["CPUExecutionProvider"])

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run([self.port], inputs)[0]


@dataclass
class Step:
    """One proposer invocation: host copies of its input and output ports."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    probe: FusedProbe

    @property
    def fused(self) -> np.ndarray:
        """The fused input [1, 1, W_F] the step graph built from what it was bound
        (test_chain_graph.py holds the drafter fed exactly it to the step's outputs)."""
        return self.probe(self.inputs)


@dataclass
class Proposal:
    tokens: list[int]  # x[0..C]: the stream when the proposal started, pending token last
    consumed: int  # C (= C' of the chain context)
    latest_start: int  # C0 of the pass the chain context comes from
    latest_tokens: int  # n of that pass
    keep: int
    k: int
    drafts: list[int]
    steps: list[Step]
    state: DecodeState  # the live state (its admitted inputs and rules, for the oracle)


@dataclass
class Advance:
    pass_tokens: int  # n of the pass the state advanced over
    keep: int  # as the round asked (before any planted change)
    expected: int  # C' = C0 + keep
    consumed: int  # what the state says afterwards
    extents: dict[str, int]  # cell -> extent on its sequence axis afterwards


@dataclass
class Recording:
    engine: speculant.Engine
    prompt: tuple[int, ...]
    k: int | None
    max_new_tokens: int
    generation: speculant.Generation | None = None
    error: BaseException | None = None
    proposals: list[Proposal] = field(default_factory=list)
    advances: list[Advance] = field(default_factory=list)
    passes: list[PassResult] = field(default_factory=list)
    bound_controls: list[dict[str, np.ndarray]] = field(default_factory=list)  # per pass
    proposer_invocations: int = 0  # every proposer session invocation during the run

    @property
    def stats(self):
        assert self.generation is not None, f"the run raised {self.error!r}"
        return self.generation.stats

    @property
    def tokens(self) -> list[int]:
        assert self.generation is not None, f"the run raised {self.error!r}"
        return self.generation.token_ids

    @property
    def dtype(self) -> str:
        return self.engine.package.plan.chain.currency if self.engine.package.plan.chain \
            else "float32"


def _host_copy(value: Value) -> np.ndarray:
    assert value.residency == "host", f"CPU tests expect host values, got {value.describe()}"
    return np.array(value.data, copy=True)


def run_recorded(engine: speculant.Engine, mp: pytest.MonkeyPatch, prompt, k: int | None = None,
                 max_new_tokens: int = MAX_NEW, *, catch: tuple[type[BaseException], ...] = (),
                 **options: Any) -> Recording:
    """One ``generate`` (speculative when ``k`` is given) with recording hooks installed on
    ``mp``. Exceptions of the classes in ``catch`` are kept in ``Recording.error``."""
    rec = Recording(engine, tuple(prompt), k, max_new_tokens)
    current: list[Step] | None = None

    proposer = engine.proposer
    if proposer is not None:
        propose, invoke = proposer.propose, proposer.session.invoke
        probe = FusedProbe(engine) if engine.package.plan.chain is not None else None

        def recording_propose(state: DecodeState, width: int) -> proposal_module.Proposal:
            nonlocal current
            current = []
            proposal = Proposal(list(state.tokens), state.consumed, state.latest.start,
                                len(state.latest.tokens), state.num_kept, width, [], current,
                                state)
            try:
                drafted = propose(state, width)
            finally:
                current = None
            proposal.drafts = list(drafted.tokens)
            rec.proposals.append(proposal)
            return drafted

        def recording_invoke(inputs, outputs=None):
            produced = invoke(inputs, outputs)
            rec.proposer_invocations += 1
            if current is not None:
                current.append(Step({p: _host_copy(v) for p, v in inputs.items()},
                                    {p: _host_copy(v) for p, v in produced.items()}, probe))
            return produced

        mp.setattr(proposer, "propose", recording_propose)
        mp.setattr(proposer.session, "invoke", recording_invoke)

    run_pass = engine.target.run
    serving = engine.package.plan.serving

    def recording_run(tokens, start, cells, admitted, controls, **options):
        vp = run_pass(tokens, start, cells, admitted, controls, **options)
        rec.passes.append(vp)
        rec.bound_controls.append({c: _host_copy(vp.values[name]) for c, name in serving.items()
                                   if name in vp.values})
        return vp

    mp.setattr(engine.target, "run", recording_run)

    advance = DecodeState.advance

    def recording_advance(self: DecodeState, vp: PassResult, keep: int) -> None:
        advance(self, vp, keep)
        extents = {name: self.cells[name].shape[cell.sequence_axis]
                   for name, cell in self.plan.cells.items()}
        rec.advances.append(Advance(len(vp.tokens), keep, vp.start + keep, self.consumed,
                                    extents))

    mp.setattr(DecodeState, "advance", recording_advance)

    if k is not None:
        options = {"speculative": True, "k": k, **options}
    try:
        rec.generation = engine.generate(list(prompt), max_new_tokens, **options)
    except catch as exc:
        rec.error = exc
    return rec


# -- oracles --------------------------------------------------------------------------------
def reference_trace(prompt, k: int, max_new_tokens: int = MAX_NEW,
                    dtype: str = "float32") -> Trace:
    return speculative_trace(SPEC, list(prompt), max_new_tokens, k, rollback_bound=ROLLBACK_BOUND,
                             dtype=dtype)


def admitted_for(engine: speculant.Engine, prompt, max_new_tokens: int = MAX_NEW):
    return engine.admit(list(prompt), max_new_tokens).admitted


def fresh_pass(engine: speculant.Engine, tokens, admitted) -> PassResult:
    """The target over ``tokens`` from empty caches (C0 = 0); bypasses recording hooks."""
    return TargetPass.run(engine.target, list(tokens), 0, empty_cells(engine.package), admitted,
                          dict(admitted.initial_controls))


def last_row_argmax(engine: speculant.Engine, logits: Value) -> int:
    seam = engine.seam
    return seam.read_token_ids(seam.argmax_rows(seam.last_along_axis(logits,
                                                                     logits.rank - 2)))[0]


def full_recompute_greedy(engine: speculant.Engine, prompt,
                          max_new_tokens: int = MAX_NEW) -> list[int]:
    """runtime.md §15: every new token from a pass over the whole stream, empty caches."""
    admitted = admitted_for(engine, prompt, max_new_tokens)
    eos = set(engine.package.plan.eos_ids)
    cap = engine.package.plan.context_cap
    stream, generated = list(prompt), []
    while len(generated) < max_new_tokens:
        token = last_row_argmax(engine, fresh_pass(engine, stream, admitted).logits)
        stream.append(token)
        generated.append(token)
        if token in eos or (cap is not None and len(stream) >= cap):
            break
    return generated


def oracle_drafts(engine: speculant.Engine, proposal: Proposal) -> list[int]:
    """The runtime's proposer on the chain context of a fresh pass over ``x[0..C')`` with
    ``num_kept = C'`` (runtime.md §14.4); bypasses recording hooks."""
    consumed, live = proposal.consumed, proposal.state
    vp = fresh_pass(engine, proposal.tokens[:consumed], live.admitted)
    state = DecodeState.after_pass(engine.seam, live.plan, live.admitted, proposal.tokens, vp,
                                   consumed, live.rules)
    state.sampler = live.sampler
    return ChainedProposer.propose(engine.proposer, state, proposal.k).tokens


def reference_drafts(proposal: Proposal, dtype: str) -> list[int]:
    """The fixture's numpy chain, fed what a correctly wired chain feeds it."""
    return chained_drafts(SPEC, proposal.tokens, proposal.consumed, proposal.k, dtype)


# -- checks (each raises AssertionError) ----------------------------------------------------
def check_tokens_equal_greedy(rec: Recording, greedy: list[int]) -> None:
    """E1."""
    assert rec.error is None, f"the run raised {rec.error!r}"
    assert rec.tokens == greedy, f"speculative {rec.tokens} != greedy {greedy}"


def check_exact_trace(rec: Recording) -> None:
    """The per-round (k_r, a_r) trace, the drafts and the counters equal the reference."""
    assert rec.error is None, f"the run raised {rec.error!r}"
    expected = reference_trace(rec.prompt, rec.k, rec.max_new_tokens, rec.dtype)
    assert rec.stats.trace == expected.pairs()
    assert [tuple(p.drafts) for p in rec.proposals] == expected.drafts()
    counters = {name: getattr(rec.stats, name) for name in expected.counters()}
    assert counters == expected.counters()


def check_e3(rec: Recording) -> None:
    """Every round's drafts equal those of the chain built from a fresh pass over x[0..C'),
    both through the runtime's proposer and through the numpy reference chain."""
    assert rec.proposals, "no proposal was recorded"
    for i, proposal in enumerate(rec.proposals):
        fresh = oracle_drafts(rec.engine, proposal)
        reference = reference_drafts(proposal, rec.dtype)
        assert proposal.drafts == fresh == reference, (
            f"proposal {i} at C={proposal.consumed} (keep={proposal.keep} of the pass at "
            f"C0={proposal.latest_start}): drafts {proposal.drafts}, fresh-pass oracle {fresh}, "
            f"reference {reference}")


def check_cell_extents(rec: Recording) -> None:
    """After every advance each cell holds exactly C' positions, C' = C0 + keep, and the
    sequence of C' values is the reference's."""
    assert rec.advances, "no advance was recorded"
    for i, adv in enumerate(rec.advances):
        assert adv.consumed == adv.expected, f"advance {i}: C = {adv.consumed}, C' = {adv.expected}"
        assert set(adv.extents.values()) == {adv.expected}, (
            f"advance {i}: cell extents {adv.extents}, C' = {adv.expected}")
    if rec.k is not None:
        expected = reference_trace(rec.prompt, rec.k, rec.max_new_tokens, rec.dtype)
        consumed = [len(rec.prompt)] + [r.consumed + r.accepted for r in expected.rounds]
        assert [adv.expected for adv in rec.advances] == consumed


def check_identities(rec: Recording) -> None:
    """evidence.md §2 on one run (CPU: every residency counter but the table reads is 0)."""
    stats = rec.stats
    plan = rec.engine.package.plan
    # The round structure, reconstructed from the passes the state advanced over.
    assert rec.advances[0].pass_tokens == len(rec.prompt)  # prefill
    steps = [(adv.pass_tokens - 1, adv.keep) for adv in rec.advances[1:]]
    rounds = [(k_r, a) for k_r, a in steps if k_r > 0]
    greedy_steps = sum(1 for k_r, _ in steps if k_r == 0)
    assert all(a == 1 for k_r, a in steps if k_r == 0)
    assert stats.trace == rounds
    assert all(1 <= a <= k_r + 1 for k_r, a in rounds)
    assert [(p.k, len(p.drafts)) for p in rec.proposals] == [(k_r, k_r) for k_r, _ in rounds]
    rollbacks = [(k_r, a) for k_r, a in rounds if a <= k_r]

    assert stats.rounds == len(rounds)
    assert stats.greedy_steps == greedy_steps
    assert stats.drafts_proposed == sum(k_r for k_r, _ in rounds)
    assert stats.accepted_drafts == sum(a - 1 for _, a in rounds)
    assert stats.rejected_drafts == stats.drafts_proposed - stats.accepted_drafts
    assert stats.rounds_with_first_draft_accepted == sum(1 for _, a in rounds if a >= 2)
    assert stats.rollbacks == len(rollbacks) <= stats.rounds
    assert stats.full_accepts == stats.rounds - stats.rollbacks
    assert stats.rolled_back_positions == sum(k_r + 1 - a for k_r, a in rollbacks)
    assert stats.rolled_back_cells == stats.rollbacks * len(plan.rollback_state)
    assert stats.proposer_invocations == sum(k_r + 1 for k_r, _ in rounds)
    assert rec.proposer_invocations == stats.proposer_invocations  # counted at the session
    assert sum(len(p.steps) for p in rec.proposals) == stats.proposer_invocations
    assert stats.target_passes == 1 + stats.rounds + stats.greedy_steps == len(rec.passes)
    assert stats.argmax_rows == 1 + stats.greedy_steps + sum(2 * k_r + 1 for k_r, _ in rounds)

    n = len(rec.tokens)
    assert stats.committed == n
    uncut = 1 + sum(a for _, a in rounds) + stats.greedy_steps
    final_consumed = rec.advances[-1].expected
    assert final_consumed == len(rec.prompt) + uncut - 1
    if stats.stop_reason == "eos" and n < uncut:  # the EOS cut the last round short
        assert rec.tokens[-1] in plan.eos_ids
    else:
        assert n == uncut
        assert final_consumed == len(rec.prompt) + n - 1

    residency = dict(stats.residency)
    assert residency.pop("embedding_table_reads") <= 1
    assert all(count == 0 for count in residency.values()), residency


def embedded_tokens(proposal: Proposal) -> list[int]:
    """The token whose row step j embeds: s = x[C'-1], then p, then each draft but the last."""
    return [proposal.tokens[proposal.consumed - 1], proposal.tokens[proposal.consumed],
            *proposal.drafts[:-1]]


def check_e6_leading_segment(rec: Recording) -> None:
    """Each step's fused input starts with ``scale * table[token]`` exactly (scale applied
    once, rounded to the currency), in the currency."""
    chain = rec.engine.package.plan.chain
    assert rec.proposals, "no proposal was recorded"
    for proposal in rec.proposals:
        assert len(proposal.steps) == proposal.k + 1
        for j, (step, token) in enumerate(zip(proposal.steps, embedded_tokens(proposal),
                                              strict=True)):
            fused = step.fused  # [1, 1, W_F]
            assert fused.shape == (1, 1, fx.FUSED_WIDTH)
            assert fused.dtype == np.dtype(chain.currency)
            expected = ref.scaled_row(token, chain.currency)
            assert np.array_equal(fused[0, 0, :fx.EMBED_WIDTH], expected), (
                f"C={proposal.consumed} step {j}: leading segment "
                f"{fused[0, 0, :fx.EMBED_WIDTH]} != scaled row of token {token} {expected}")


def check_carry_chain(rec: Recording) -> None:
    """Step 0's trailing segment is the target's hidden row at C'-1 given x[0..C');
    step j's is the last row of step j-1's folded-carry output."""
    chain = rec.engine.package.plan.chain
    for proposal in rec.proposals:
        context = ref.target_forward(SPEC, *_prefix_inputs(proposal.tokens[:proposal.consumed],
                                                           rec.dtype))
        carry_0 = context.hidden_states[0, proposal.consumed - 1].astype(rec.dtype)
        trailing = [s.fused[0, 0, fx.EMBED_WIDTH:] for s in proposal.steps]
        assert np.array_equal(trailing[0], carry_0), (
            f"C={proposal.consumed}: carry_0 {trailing[0]} != target hidden row {carry_0}")
        for j in range(1, len(proposal.steps)):
            produced = proposal.steps[j - 1].outputs[chain.carry_output][0, -1]
            assert np.array_equal(trailing[j], produced), (
                f"C={proposal.consumed} step {j}: carry {trailing[j]} != step {j - 1}'s "
                f"folded carry {produced}")


def check_fixed_bindings(rec: Recording) -> None:
    """Every step: position id C'-1, mask of extent C', borrowed caches = the cache of
    x[0..C') exactly (the owner's output rolled back to C')."""
    chain = rec.engine.package.plan.chain
    for proposal in rec.proposals:
        consumed = proposal.consumed
        key, value = ref.cache_for(proposal.tokens[:consumed], rec.dtype)
        expected = dict(zip(sorted(chain.borrowed), (key, value), strict=True))
        for step in proposal.steps:
            assert step.inputs["position_ids"].tolist() == [[consumed - 1]]
            assert step.inputs["attention_mask"].shape == (1, consumed)
            for port, cache in expected.items():
                assert np.array_equal(step.inputs[port], cache), (
                    f"C={consumed}: borrowed '{port}' is not the cache of x[0..C')")


def _prefix_inputs(tokens, dtype: str):
    n = len(tokens)
    return (np.asarray([tokens], np.int64), np.arange(n, dtype=np.int64)[None],
            np.ones((1, n), np.int64), ref.empty_cache(dtype), ref.empty_cache(dtype),
            fx.EMBEDDING_TABLE.astype(dtype))


def first_draft_acceptance(rec: Recording) -> float:
    return rec.stats.rounds_with_first_draft_accepted / rec.stats.rounds


def fails(check, *args) -> bool:
    """True when ``check(*args)`` raises AssertionError (the plant is caught)."""
    try:
        check(*args)
    except AssertionError:
        return True
    return False


# -- planted defects ------------------------------------------------------------------------
def _with_sequence_extent(array: np.ndarray, axis: int, extent: int) -> np.ndarray:
    """``array`` zero-extended (never cut) to ``extent`` along ``axis``."""
    shape = list(array.shape)
    shape[axis] = extent - array.shape[axis]
    return np.concatenate([array, np.zeros(shape, array.dtype)], axis=axis)


def plant_borrowed_cache(mp: pytest.MonkeyPatch, how: str) -> None:
    """Bind the borrowed caches to something other than the owner's rolled-back output, at
    the extent C' the mask has (so only the contents are wrong):

    * ``"incoming"``: the cache the latest pass started from (one round stale; empty after
      prefill), zero-extended to C' as a static cache buffer would hold it;
    * ``"empty"``: zeros (an empty cache, or a target that writes zeros into its caches).
    """
    original = ChainedProposer._fixed_bindings

    def planted(self: ChainedProposer, state: DecodeState, into=None) -> dict[str, Value]:
        fixed = original(self, state, into)
        for port, cell_name in self.chain.borrowed.items():
            cell = self.package.plan.cells[cell_name]
            correct = fixed[port]
            if how == "incoming":
                stale = state.latest.values[cell.initializer].data
                array = _with_sequence_extent(stale, cell.sequence_axis,
                                              correct.shape[cell.sequence_axis])
            elif how == "empty":
                array = np.zeros(correct.shape, correct.data.dtype)
            else:
                raise ValueError(how)
            fixed[port] = Value.host(array, correct.dtype)
        return fixed

    mp.setattr(ChainedProposer, "_fixed_bindings", planted)


def plant_generic_borrowed_binding(mp: pytest.MonkeyPatch, engine: speculant.Engine) -> None:
    """Treat the borrowed ports as ordinary proposer inputs: bound from
    ``latest.values[value_name]`` (the value the proposer's declared invoke names), cut to C'."""
    mp.setattr(engine.proposer, "chain", dataclasses.replace(engine.proposer.chain, borrowed={}))


def plant_table_scale(mp: pytest.MonkeyPatch, times: int) -> None:
    """Each gathered row scaled by the declared scale to the power ``times`` (0: not
    scaled, 2: by its square). Only takes effect on an engine loaded after it."""
    declared = chain_graph.row_scale

    def planted(chain_plan):
        scale = declared(chain_plan)
        return None if times == 0 else scale ** times

    mp.setattr(chain_graph, "row_scale", planted)


def plant_unchained_carry(mp: pytest.MonkeyPatch) -> None:
    """Every step is fed carry_0: the step outputs' folded carry is dropped."""
    original = ChainedProposer._carry_0
    first: dict[int, Value] = {}

    def planted_carry_0(self: ChainedProposer, pass_result, num_kept: int) -> Value:
        first[id(self)] = original(self, pass_result, num_kept)
        return first[id(self)]

    mp.setattr(ChainedProposer, "_carry_0", planted_carry_0)
    mp.setattr(ChainedProposer, "_step_carry", lambda self, step_carry: first[id(self)])


def _propose_without_bootstrap(self: ChainedProposer, state: DecodeState,
                               k: int) -> proposal_module.Proposal:
    """runtime.md §9.4 without step 0: the first step embeds p with carry_0 and its
    prediction is taken as d_1 (k invocations)."""
    vp, keep, seam, chain = state.latest, state.num_kept, self.seam, self.chain
    fixed = {**self._fixed_bindings(state), TABLE: self.table}
    carry = seam.slice_axis(vp.seed, vp.seed.rank - 2, keep - 1, 1)
    token = seam.zeros((1,), "int32", self.residency)
    last, drafts = state.pending, []
    for _ in range(k):
        seam.write_ints(token, [last])
        out = self.session.invoke({**fixed, TOKEN: token, CARRY: carry},
                                  [chain.logits_output, chain.carry_output])
        carry = seam.last_along_axis(out[chain.carry_output], 1)
        last = seam.read_token_ids(seam.argmax_rows(seam.last_along_axis(
            out[chain.logits_output], 1)))[0]
        drafts.append(last)
    return proposal_module.Proposal(drafts, num_invocations=k, num_scored_rows=k)


def plant_skipped_bootstrap(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(ChainedProposer, "propose", _propose_without_bootstrap)


def plant_rollback_length(mp: pytest.MonkeyPatch, delta: int, *, cut_only: bool) -> None:
    """After a rejection, cut the rollback_state cells to ``C + a + delta``.

    ``cut_only``: the state still says C' = C + a (cells and counters disagree).
    Otherwise the loop believes the longer (shorter) length: the state advances to
    ``C + a + delta`` too (for ``delta = -1`` only where ``a >= 2``, so something is kept).
    """
    original = DecodeState.advance

    def planted(self: DecodeState, vp: PassResult, keep: int) -> None:
        rejected = keep < len(vp.tokens)
        if not cut_only:
            original(self, vp, keep + delta if rejected and keep + delta >= 1 else keep)
            return
        original(self, vp, keep)
        if rejected:
            for name in self.plan.rollback_state:
                cell = self.plan.cells[name]
                self.cells[name] = self.seam.truncate_axis(vp.presents[name], cell.sequence_axis,
                                                           vp.start + keep + delta)

    mp.setattr(DecodeState, "advance", planted)


def plant_unseeded_controls(mp: pytest.MonkeyPatch, engine: speculant.Engine) -> None:
    """Admission no longer knows the serving controls: they are ordinary required inputs."""
    package = engine.package
    mp.setattr(engine, "package", dataclasses.replace(
        package, plan=dataclasses.replace(package.plan, serving={})))
