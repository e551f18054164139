"""`load()` and `Engine`: a loaded package, its sessions, and `generate` / `stream`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speculant.errors import RequestError
from speculant.package.package import Package
from speculant.session.session import ComponentSession
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.draft_model import DraftModel
from speculant.speculative.factory import ProposerSources, make_proposer
from speculant.speculative.round import run_round
from speculant.tensors.seam import make_seam, residency_for_device
from speculant.text.detokenizer import IncrementalDetokenizer
from speculant.text.tokenizer import tokenizer_for
from speculant.workflow.decode import empty_cells, prefill
from speculant.workflow.request import Request, admit
from speculant.workflow.sampler import Sampler
from speculant.workflow.state import DecodeState, StopRules
from speculant.workflow.stats import DecodeStats
from speculant.workflow.target_pass import TargetPass


@dataclass
class Generation:
    token_ids: list[int]  # the generated tokens (prompt excluded)
    text: str | None  # their text, when the package has a tokenizer
    stats: DecodeStats
    time_to_first_token_s: float
    total_s: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.total_s if self.total_s > 0 else float("inf")


class Engine:
    """A loaded package, ready to decode. Build it with :func:`load`."""

    def __init__(self, package: Package, device: str = "cpu", *, use_tf32: bool = False,
                 outputs_on_host: bool = False, ordering: str = "shared_stream",
                 threads: int | None = None, draft: Package | None = None) -> None:
        """``outputs_on_host`` binds every CUDA output to host memory (ORT copies it out):
        the host-staged configuration that parity tests compare against, never a default.
        ``threads`` sets ONNX Runtime's intra-op thread count of every session (None: ORT's
        default, one per physical core). ``draft`` is a greedy-decoder package loaded beside
        the target as its draft model (``proposer="draft"``), on the same device."""
        self.package = package
        self.device = residency_for_device(device)
        self.seam = make_seam(self.device, ordering=ordering)
        plan, wf = package.plan, package.document.workflow
        self.sessions = {
            name: ComponentSession(name, package.model_source(name), wf.components[name].ports,
                                   self.device, self.seam, use_tf32=use_tf32,
                                   outputs_on_host=outputs_on_host,
                                   artifact=str(package.artifacts[name]), threads=threads)
            for name in (plan.target, plan.proposer) if name is not None}
        self.target = TargetPass(package.document, plan, self.sessions[plan.target])
        self.vocab_size = package.logits_width
        self.proposer = (ChainedProposer(package, self.sessions[plan.proposer], self.seam,
                                         self.vocab_size)
                         if plan.chain is not None and plan.proposer else None)
        self.tokenizer = tokenizer_for(package)  # with its load-time checks
        self.draft = (DraftModel(draft, self.seam, self.device, use_tf32=use_tf32,
                                 outputs_on_host=outputs_on_host, threads=threads)
                      if draft is not None else None)
        self.stats: DecodeStats | None = None  # the latest decode's statistics

    # -- decoding -------------------------------------------------------------------------
    def request(self, prompt: str | Sequence[int], max_new_tokens: int = 64, *,
                speculative: bool = False, proposer: str | None = None, k: int | None = None,
                stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                stop_on_eos: bool = True, inputs: Mapping[str, np.ndarray] | None = None,
                max_context: int | None = None, seed: int = 0, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                ngram_range: tuple[int, int] = (1, 3)) -> Request:
        """Turn API arguments into a :class:`Request` (text prompts are tokenized).

        ``proposer``: None (plain decoding), ``"chained"`` (the package's declared proposer;
        ``speculative=True`` means this), ``"draft"`` (the draft model given to :func:`load`),
        ``"prompt_lookup"`` (n-grams of the stream, ``ngram_range = (n_min, n_max)``) or
        ``"auto"``; ``k`` drafts per round. ``temperature`` 0 is greedy (argmax, bit-exact);
        above 0 tokens are sampled from ``T(row)`` (``top_k`` 0: no limit, ``top_p``,
        ``min_p``) with one generator seeded by ``seed``, and speculation verifies by
        rejection sampling, so the output follows the target's distribution exactly."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if any(np.ndim(i) != 0 for i in ids):
            raise RequestError("the prompt has more than one row; speculant decodes one "
                               "sequence per request", path="prompt_ids",
                               expected="a flat sequence of token ids")
        if speculative and proposer is None:
            proposer = "chained"
        sequences = tuple(tuple(self.tokenizer.encode(s, add_special_tokens=False)) for s in stop)
        return Request(tuple(int(i) for i in ids), max_new_tokens, proposer, k,
                       tuple(stop_token_ids), sequences, stop_on_eos, dict(inputs or {}),
                       max_context, seed, temperature, top_k, top_p, min_p,
                       tuple(ngram_range))  # type: ignore[arg-type]

    def decode(self, request: Request) -> Iterator[int]:
        """Yield committed token ids as they are committed; stats land in ``self.stats``."""
        plan = self.package.plan
        admitted = admit(plan, self.package.document.workflow.inputs, request,
                         vocab_size=self.vocab_size, static_context_cap=plan.context_cap,
                         never_materialized=self._fused_values())
        if request.proposer == "auto":
            admitted.proposer, admitted.k = self._auto_proposer(request.k)
        stop_ids = set(request.stop_token_ids)
        if request.stop_on_eos:
            stop_ids.update(plan.eos_ids)
        rules = StopRules(request.max_new_tokens, frozenset(stop_ids), request.stop_sequences,
                          admitted.context_cap)
        proposer = make_proposer(admitted.proposer, self._proposer_sources, request, admitted.k)
        sampler = (Sampler.seeded(admitted.sampling, request.seed)
                   if admitted.sampling is not None else None)
        state = DecodeState(self.seam, plan, rules, admitted, list(request.prompt_ids),
                            len(request.prompt_ids), empty_cells(self.package), sampler=sampler)
        state.stats.proposer = admitted.proposer
        self.stats = state.stats
        try:
            if not self._controls_allow_a_pass(admitted):
                state.stop_reason = "inactive"
                return
            yield from prefill(state, self.target)
            while not state.is_stopped:
                yield from run_round(state, self.target, proposer, admitted.k)
        finally:
            state.stats.stop_reason = state.stop_reason
            state.stats.residency = self.seam.counters.snapshot()

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 64,
                 **options) -> Generation:
        """Decode one request to the end; see :meth:`request` for the options."""
        request = self.request(prompt, max_new_tokens, **options)
        started = time.perf_counter()
        first_at = None
        ids: list[int] = []
        for token in self.decode(request):
            first_at = first_at or time.perf_counter()
            ids.append(token)
        total = time.perf_counter() - started
        text = self.tokenizer.decode(ids) if self.tokenizer.has_text else None
        assert self.stats is not None
        return Generation(ids, text, self.stats, (first_at or started) - started, total)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 64,
               **options) -> Iterator[str]:
        """Yield text pieces as tokens are committed (never a broken UTF-8 sequence)."""
        request = self.request(prompt, max_new_tokens, **options)
        detokenizer = IncrementalDetokenizer(self.tokenizer, context_ids=request.prompt_ids)
        for token in self.decode(request):
            piece = detokenizer.push(token)
            if piece:
                yield piece
        tail = detokenizer.flush()
        if tail:
            yield tail

    # -- helpers --------------------------------------------------------------------------
    @property
    def _proposer_sources(self) -> ProposerSources:
        return ProposerSources(self.proposer, self.draft, self.vocab_size,
                               self.tokenizer.vocab_size)

    def _fused_values(self) -> tuple[str, ...]:
        chain = self.package.plan.chain
        if chain is None:
            return ()
        value = self.package.plan.proposer_inputs.get(chain.fused_port)
        return (value,) if value else ()

    def _auto_proposer(self, k: int | None) -> tuple[str | None, int]:
        """The auto-enable rule of runtime.md §2.4."""
        doc, plan = self.package.document, self.package.plan
        spec = doc.speculative
        components = doc.workflow.components.values()
        safe = spec is not None and spec.distribution_preserving and all(
            c.contract is not None and c.contract.equivalence in ("bitwise",
                                                                  "distribution_preserving")
            for c in components)
        if not safe or plan.chain is None:
            return None, 0
        width = k if k is not None else spec.max_proposal_width
        if not 1 <= width <= spec.max_proposal_width:
            raise RequestError(f"k = {width} outside [1, {spec.max_proposal_width}]",
                               path="speculative.max_proposal_width", value=width)
        return "chained", width

    @staticmethod
    def _controls_allow_a_pass(admitted) -> bool:
        active = admitted.controls.get("active")
        done = admitted.controls.get("done")
        return not ((active is not None and not bool(active.data.reshape(-1)[0])) or
                    (done is not None and bool(done.data.reshape(-1)[0])))


def load(path: str | Path, device: str = "cpu", *, draft: str | Path | None = None,
         **options) -> Engine:
    """Load an inference package (a folder) and create its sessions on ``device``
    (``cpu``, ``cuda`` or ``cuda:N``); ``draft`` is the folder of a greedy-decoder package
    to load beside it as its draft model (``proposer="draft"``); ``options`` are
    :class:`Engine`'s keywords."""
    from speculant.package.loader import load_package

    draft_package = load_package(draft) if draft is not None else None
    return Engine(load_package(path), device, draft=draft_package, **options)
