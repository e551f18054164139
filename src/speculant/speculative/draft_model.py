"""The draft-model proposer (docs/design/spec/runtime.md §18): a second greedy decoder that drafts.

A draft model is another package (a greedy decoder) loaded beside the target,
on the same device and the same tensor seam (so its passes follow the target's residency rules:
its logits are reduced to an id where they live and only the id is read back). Its passes run
through the same :class:`TargetPass` as the target's, and its rollback through the same
:func:`truncate_cells`.

Per request it owns its caches and its consumed tokens ``x[0..D)``. A round's proposal runs
one pass over ``x[D..C]`` (what it has not consumed, ending with the pending token), whose last
row gives ``d_1``, then ``k_r − 1`` one-token passes each consuming the previous draft:
``k_r`` invocations, after which ``D = C + k_r``. It never consumed ``d_{k_r}``, so after the
round the stream confirms its first ``D' = C + min(a, k_r)`` positions, which is
``min(D, C_next)`` with ``C_next = C + a``; it truncates its caches to what the stream still
confirms at the start of its next proposal (:func:`kept_length`: nothing runs on it in
between, but a round of width 0 may commit past a draft it rejected), so a fully accepted
block leaves it one token behind and its next pass consumes two.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

from speculant.errors import RequestError
from speculant.package.package import Package
from speculant.session.graphs import OFF, GraphDecision
from speculant.session.session import ComponentSession
from speculant.speculative.proposal import Proposal
from speculant.tensors import TensorSeam, Value
from speculant.text.tokenizer import load_tokenizer
from speculant.workflow.cells import StaticPool
from speculant.workflow.options import GenerationOptions
from speculant.workflow.request import Admitted, Request, admit_request
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState, set_control, start_cells
from speculant.workflow.target_pass import TargetPass


class DraftModel:
    """A loaded draft-model runtime: a greedy-decoder package, one session for its decoder on
    the target's device and seam, and a :class:`TargetPass` that runs its passes."""

    def __init__(self, package: Package, seam: TensorSeam, device: str, *,
                 use_tf32: bool = False, outputs_on_host: bool = False,
                 threads: int | None = None, cuda_graphs: GraphDecision = OFF,
                 overlap: bool = True) -> None:
        """``cuda_graphs``, ``overlap``: as the target's session (the engine decides them for
        the draft package: static caches on CUDA capture a graph per pass width)."""
        plan = package.plan
        self.package = package
        self.seam = seam

        def make_session(name: str, source: bytes | str, ports, artifact: str
                         ) -> ComponentSession:
            """A session of one of its graphs (its batched graph's too: draft_rows.py)."""
            return ComponentSession(name, source, ports, device, seam, use_tf32=use_tf32,
                                    outputs_on_host=outputs_on_host, artifact=artifact,
                                    threads=threads, cuda_graphs=cuda_graphs, overlap=overlap)

        self.make_session = make_session
        self.session = make_session(plan.target, package.model_source(plan.target),
                                    package.document.workflow.components[plan.target].ports,
                                    str(package.artifacts[plan.target]))
        self.runner = TargetPass(package.document, plan, self.session)
        self.logits_width = package.logits_width
        self.tokenizer_vocab = load_tokenizer(package.tokenizer_file).vocab_size
        self.rollback_bound = plan.undeclared_rollback_bound
        self.static_pool = StaticPool()  # its static caches and plans, kept across requests

    def start(self, request: Request, k: int, *, target_logits_width: int | None,
              target_tokenizer_vocab: int | None,
              is_pooled: bool = True) -> DraftModelProposer:
        """Admit ``request`` on the draft side (:meth:`admit`) and return its proposer.
        ``is_pooled``: its static caches are the pool's (requests one at a time); False: its
        own (requests decoded together, one by one: a package without a batched graph)."""
        admitted = self.admit(request, k, target_logits_width=target_logits_width,
                              target_tokenizer_vocab=target_tokenizer_vocab)
        cells = start_cells(self.seam, self.package, num_prompt=len(request.prompt_ids),
                            max_new_tokens=request.options.max_new_tokens, k=k,
                            residency=self.session.device, what="draft model's request",
                            pool=self.static_pool if is_pooled else None)
        return DraftModelProposer(self, admitted, cells)

    def admit(self, request: Request, k: int, *, target_logits_width: int | None,
              target_tokenizer_vocab: int | None) -> Admitted:
        """``request`` on the draft side: the vocabulary must equal the target's, its groups
        must allow rolling back ``k − 1`` positions, and its own admission must pass."""
        root = str(self.package.root)
        for what, draft_size, target_size in (
                ("logits width", self.logits_width, target_logits_width),
                ("tokenizer vocab_size", self.tokenizer_vocab, target_tokenizer_vocab)):
            if draft_size is not None and target_size is not None and draft_size != target_size:
                raise RequestError(
                    f"the draft model's vocabulary differs from the target's: {what} "
                    f"{draft_size} (draft) != {target_size} (target)", path="draft.vocab_size",
                    file=root, value=draft_size, expected=f"{target_size}, the target's")
        if self.rollback_bound is None or k - 1 > self.rollback_bound:
            raise RequestError(
                f"the draft model's state groups allow rolling back {self.rollback_bound} "
                f"positions; k = {k} needs {k - 1}", path="draft.rollback_positions",
                file=root, value=k, expected=f"k - 1 <= {self.rollback_bound}")
        options = request.options
        draft_request = Request(request.prompt_ids, GenerationOptions(
            max_new_tokens=options.max_new_tokens, seed=options.seed,
            temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
            min_p=options.min_p))
        try:
            admitted = admit_request(self.package.plan, self.package.document.workflow.inputs,
                                     draft_request, vocab_size=self.logits_width,
                                     static_context_cap=self.package.plan.context_cap)
        except RequestError as exc:
            raise RequestError(f"the draft model cannot take this request: {exc}",
                               path="draft", file=root) from exc
        return admitted


def kept_length(confirmed: int, held: Sequence[int], state: DecodeState) -> int:
    """``D'``: how many of a draft's first slots hold the stream ``x[0..C)``, where its first
    ``confirmed`` slots do and the next ``len(held)`` hold ``held`` (the drafts its last
    proposal consumed). After a round that verified them ``D' = min(D, C)``; but a round of
    width 0 (no proposal: a greedy step of ``k="auto"`` or of a width policy) may commit
    past a rejected draft before the next proposal, so a held draft counts only where the
    stream holds it too, and only those before the first that it does not."""
    kept = confirmed
    for token in held:
        if kept >= state.consumed or state.tokens[kept] != token:
            break
        kept += 1
    return min(kept, state.consumed)


class DraftModelProposer:
    """One request's draft model: its caches (extent ``D`` on each sequence axis) and the
    tokens ``x[0..D)`` they hold."""

    def __init__(self, model: DraftModel, admitted: Admitted, cells: dict[str, Value]) -> None:
        self.model = model
        self.admitted = admitted
        self.controls: dict[str, Value] = dict(admitted.initial_controls)
        # empty cells, or its static buffers (allocated once; their length is D)
        self.cells: dict[str, Value] = cells
        self.tokens: list[int] = []  # x[0..D): what the draft has consumed
        self.confirmed = 0  # its first slots that held the stream at its last proposal

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Up to ``k`` drafts, one draft-model pass per draft it chooses (capped by its own
        context). Under a grammar (workflow/constraint.py) the drafts start with the tokens
        it forces (consumed by the next pass, none run for them), each later one is chosen
        from the pass's row masked by the grammar advanced along the drafts before it, and
        drafting ends where the grammar can take no more."""
        seam, constraint = state.seam, state.constraint
        # D' = C + min(a, k_r); the bytes it moves count in the decode's rollback_bytes_moved
        state.stats.rollback_bytes_moved += self._roll_back(kept_length(
            self.confirmed, self.tokens[self.confirmed:], state)) or 0
        cap = self.admitted.context_cap
        if cap is not None:  # its caches may reach extent cap - 1, as the target's do
            k = min(k, cap - 1 - state.consumed)
        drafts: list[int] = []
        probs: list[Value] = []  # q_i = T(row i) under rejection sampling
        pending = state.tokens[len(self.tokens):state.consumed + 1]  # x[D..C]
        num_passes = 0
        with constraint.drafting() if constraint is not None else nullcontext():
            forced = constraint.forced_tokens(max(k, 0)) if constraint is not None and (
                state.sampler is None or state.sampler.is_keyed) else []  # no q to return
            for i in range(max(k, 0)):
                if i < len(forced):
                    token, q = forced[i], None
                else:
                    row = self._run(pending)
                    num_passes += 1
                    pending = []
                    position = state.consumed + 1 + i  # where this draft would stand
                    token, q = choose(seam, state.sampler, row, position,
                                      constraint)  # 4 bytes read back
                if constraint is not None and not constraint.advance(token):
                    break
                drafts.append(token)
                if q is not None:
                    probs.append(q)
                pending.append(token)
                if constraint is not None and constraint.is_finished:
                    break
        self.confirmed = min(len(self.tokens), state.consumed + 1)  # x[0..C], at most
        return Proposal(drafts, probs or None, num_invocations=num_passes,
                        num_scored_rows=num_passes)

    def _run(self, pending: list[int]) -> Value:
        """One draft-model pass consuming ``pending``; its last row [1, 1, V]."""
        seam = self.model.seam
        draft_pass = self.model.runner.run(pending, len(self.tokens), self.cells,
                                           self.admitted, self.controls)
        self.cells = draft_pass.presents  # static caches: the same buffers
        self.tokens += pending
        set_control(self.controls, "accepted_len", len(pending))
        return seam.last_along_axis(draft_pass.logits, draft_pass.logits.rank - 2)

    def _roll_back(self, length: int) -> int:
        """Keep the first ``length`` consumed positions (the draft's own rollback); returns
        the bytes it moved."""
        if length < len(self.tokens):
            # static caches: D = length, no byte moves
            self.cells, moved = self.cells.roll_back(self.model.seam, self.model.package.plan,
                                                     length)
            del self.tokens[length:]
            return moved
        return 0
