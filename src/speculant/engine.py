"""`load()` and `Engine`: a loaded package, its sessions, and the request-scoped API
(`generate`, `stream`, `chat`, `chat_stream`, `decode`); speculant/aio.py gives it to asyncio.

Every request is admitted — its options checked by type and range, its prompt against the
vocabulary and the context, its proposer against its kind's bound — before its first token;
its statistics come back with its result. Requests to one engine are served one at a time,
in arrival order: a :class:`Decode` (or the :class:`Stream` over it) holds the engine from
admission until it is exhausted or closed (generation.py says when an abandoned one is closed).
A package with a batched target graph also decodes requests together (`submit`,
`submit_stream`, `generate_many`): each a row of the engine's scheduler
(speculative/scheduler.py), beside, not behind, the one-at-a-time requests.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from speculant.errors import RequestError, SpeculantError
from speculant.generation import BatchedDecode, Decode, Generation, Stream, Turns
from speculant.package.package import Package
from speculant.session.graphs import decide
from speculant.session.session import ComponentSession
from speculant.speculative.chain_graph import (
    StepComponent,
    bootstrap_component,
    chain_component,
    step_component,
)
from speculant.speculative.chain_rows import ChainRows
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.decode import choose_route
from speculant.speculative.draft_model import DraftModel
from speculant.speculative.draft_rows import DraftRows, can_draft_rows
from speculant.speculative.kinds import ProposerSources, admit_proposer, build_proposer
from speculant.speculative.proposal import Proposer
from speculant.speculative.scheduler import PREFILL_CHUNK, Scheduler
from speculant.speculative.width import WidthPolicy
from speculant.tensors import HOST, Residency, make_seam
from speculant.text.chat import (
    DEFAULT_LIMITS,
    ChatTemplate,
    TemplateLimits,
    load_chat_template,
)
from speculant.text.tokenizer import tokenizer_for
from speculant.workflow.batched_pass import BatchedTargetPass, open_batched_pass
from speculant.workflow.cells import StaticPool
from speculant.workflow.constraint import compile_constraint
from speculant.workflow.logprobs import Logprobs
from speculant.workflow.options import GenerationOptions, checked_text, checked_token_ids
from speculant.workflow.request import Request, admit_request
from speculant.workflow.sampler import Sampler
from speculant.workflow.state import DecodeState, StopRules
from speculant.workflow.stop_text import StopText
from speculant.workflow.target_pass import TargetPass

Prompt = str | Sequence[int]
Messages = Sequence[Mapping[str, str]]

__all__ = ["BatchedDecode", "Decode", "Engine", "Generation", "Stream", "load"]


class Engine:
    """A loaded package, ready to decode. Build it with :func:`load`."""

    def __init__(self, package: Package, device: str = "cpu", *, use_tf32: bool = False,
                 outputs_on_host: bool = False, ordering: str = "shared_stream",
                 threads: int | None = None, draft: Package | None = None,
                 cuda_graphs: bool | str = "auto", overlap: bool = True,
                 unroll_chain: bool = True,
                 template_limits: TemplateLimits = DEFAULT_LIMITS,
                 max_batch: int | None = None, prefill_chunk: int = PREFILL_CHUNK) -> None:
        """``outputs_on_host`` binds every CUDA output to host memory (ORT copies it out):
        the host-staged configuration that parity tests compare against, never a default.
        ``threads``: ONNX Runtime's intra-op threads (None: its default, one per physical core);
        CPU sessions share the process's one pool, sized by the first, where the process
        allows it (:func:`speculant.share_cpu_pool`; the CLI does) (:attr:`cpu_pool`).
        ``draft``: a greedy-decoder package loaded beside the target as its draft model
        (``proposer="draft"``), on the same device.
        ``cuda_graphs`` (True, False, ``"auto"``: on where the package has static caches and
        the device is CUDA) captures each pass plan as a CUDA graph (``session/graphs.py``);
        :attr:`cuda_graphs` says what each session does, and every decode's stats carry it.
        ``overlap``: on CUDA, captured pass plans return once their replay is queued, so the
        host prepares the next step meanwhile (False: every run waits for its work, ORT's
        default). ``unroll_chain`` (the default; False: step by step): on a device, a greedy
        chained proposal on static caches is one run of the step graph unrolled k + 1 times
        (chain_graph.chain_component). ``template_limits``: the deadline, output cap and
        memory of each chat-template render (text/template_worker.py), the load's trial
        render included. ``max_batch`` (None: the package's ``max_rows``) and
        ``prefill_chunk``: the scheduler's rows and the prompt tokens a row consumes per step
        (:meth:`submit`, :meth:`generate_many`; packages with a batched target graph)."""
        self.package = package
        self.device = str(Residency.parse(device))
        self.seam = make_seam(self.device, ordering=ordering)
        plan, wf = package.plan, package.document.workflow
        graphs = decide(cuda_graphs, self.device, outputs_on_host=outputs_on_host,
                        has_static_caches=package.plan.static is not None)
        components = {plan.target: (package.model_source(plan.target),
                                    wf.components[plan.target].ports)}
        if plan.proposer is not None and plan.chain is not None:  # its step graph, made once
            step = step_component(package)
            components[plan.proposer] = (step.source, step.ports)
        elif plan.proposer is not None:
            components[plan.proposer] = (package.model_source(plan.proposer),
                                         wf.components[plan.proposer].ports)
        def session(name: str, source: bytes | str, ports, artifact: str) -> ComponentSession:
            return ComponentSession(name, source, ports, self.device, self.seam,
                                    use_tf32=use_tf32, outputs_on_host=outputs_on_host,
                                    artifact=artifact, threads=threads, cuda_graphs=graphs,
                                    overlap=overlap)

        self.sessions = {name: session(name, source, ports, str(package.artifacts[name]))
                         for name, (source, ports) in components.items()}
        self._make_session = session  # the batched target's, with the scheduler (if ever)
        self._scheduler_shape = (max_batch, prefill_chunk)

        def step_variant(suffix: str, made_from: StepComponent) -> ComponentSession:
            """A session of a graph made from the step graph, reporting (timed alike) to the
            step session's observers."""
            made = session(f"{plan.proposer}.{suffix}", made_from.source, made_from.ports,
                           str(package.artifacts[plan.proposer]))
            made.observers = self.sessions[plan.proposer].observers  # the same list
            made.times_to_completion = self.sessions[plan.proposer].times_to_completion
            return made

        def chain_session(depth: int) -> ComponentSession | None:
            """The chain unrolled ``depth`` steps (one run per proposal: a device's launches
            cost more than a step's work)."""
            unrolled = chain_component(step, depth, plan.chain.carry_output)
            return None if unrolled is None else step_variant(f"chain{depth}", unrolled)

        self.chain_session = chain_session
        bootstrap_session = functools.cache(lambda: step_variant(  # step 0, its carry alone
            "bootstrap", bootstrap_component(step, plan.chain.carry_output)))

        self.draft = (DraftModel(draft, self.seam, self.device, use_tf32=use_tf32,
                                 outputs_on_host=outputs_on_host, threads=threads,
                                 cuda_graphs=decide(cuda_graphs, self.device,
                                                    outputs_on_host=outputs_on_host,
                                                    has_static_caches=bool(draft.plan.static)),
                                 overlap=overlap)
                      if draft is not None else None)
        described = {**self.sessions, **({"draft": self.draft.session} if self.draft else {})}
        self.cuda_graphs = "; ".join(f"{name}: {session.graphs.describe()}"
                                     for name, session in described.items())
        pool = self.sessions[plan.target].pool  # every session of one engine decides alike
        self.cpu_pool = pool.describe(" and ".join(f"the {name}" for name in described)) \
            if pool is not None else None  # None: not on the CPU
        self.target = TargetPass(package.document, plan, self.sessions[plan.target])
        self.vocab_size = package.logits_width
        self.proposer = (ChainedProposer(
            package, self.sessions[plan.proposer], self.seam,
            chain_session if unroll_chain and self.device != HOST and not outputs_on_host
            else None,  # the host keeps the step plans (no launches to save there)
            bootstrap_session)
            if plan.chain is not None and plan.proposer else None)
        self.tokenizer = tokenizer_for(package)  # with its load-time checks
        self.static_pool = StaticPool()  # static caches and their plans, kept across requests
        self.chat_template: ChatTemplate | None = load_chat_template(package.tokenizer_file,
                                                                    template_limits)
        target_session = self.sessions[plan.target]
        proposing = tuple(s for s in (self.sessions.get(plan.proposer or ""),
                                      self.draft.session if self.draft else None) if s)
        for timed in (target_session, *proposing):  # a run's time includes its device work
            timed.times_to_completion = True
        self.proposer_sources = ProposerSources(
            plan, self.proposer, self.draft, self.vocab_size, self.tokenizer.vocab_size,
            can_auto_enable=_can_auto_enable(package), target_session=target_session,
            proposing_sessions=proposing)
        self._turns = Turns()

    # -- the request-scoped API -----------------------------------------------------------
    def generate(self, prompt: Prompt | Sequence[Prompt],
                 options: GenerationOptions | int | None = None, /, *,
                 inputs: Mapping[str, np.ndarray] | None = None, **fields
                 ) -> Generation | list[Generation]:
        """Decode one request to the end. ``options`` (or ``**fields`` of
        :class:`GenerationOptions`; an int is ``max_new_tokens``) say how; ``inputs`` are
        caller values for the workflow's declared inputs. A list of prompts (texts, or
        lists of token ids) gives a list of results, in order, each equal to its prompt's
        own; they are decoded one after another, and an error names the prompt's index."""
        if not is_prompt_list(prompt):
            with self.decode(prompt, options, inputs=inputs, **fields) as decode:
                for _ in decode:
                    pass
                return decode.result
        results = []
        for i, one in enumerate(prompt):
            try:
                results.append(self.generate(one, options, inputs=inputs, **fields))
            except SpeculantError as error:
                raise of_prompt(error, i) from error
        return results

    def stream(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
               inputs: Mapping[str, np.ndarray] | None = None, **fields) -> Stream:
        """Admit now (a bad request raises here, before any piece), then iterate for text
        pieces as tokens are committed (never a broken UTF-8 character, never stop text);
        ``stream.result`` once exhausted; ``stream.close()`` stops early."""
        return Stream(self._open(prompt, GenerationOptions.of(options, **fields), inputs,
                                 with_text=True))

    def decode(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
               inputs: Mapping[str, np.ndarray] | None = None, **fields) -> Decode:
        """Admit now, then iterate for committed token ids; ``.result`` at the end."""
        options = GenerationOptions.of(options, **fields)
        return self._open(prompt, options, inputs, with_text=isinstance(prompt, str)
                          or bool(options.stop))

    def chat(self, messages: Messages, options: GenerationOptions | int | None = None, /,
             **fields) -> Generation:
        """:meth:`generate` on ``messages`` rendered by the package's chat template (with
        the assistant's turn opened); the template's end-of-turn tokens stop it."""
        return self.generate(*self.prepare_chat(messages, options, **fields))

    def chat_stream(self, messages: Messages, options: GenerationOptions | int | None = None,
                    /, **fields) -> Stream:
        """:meth:`stream` on ``messages`` rendered by the package's chat template."""
        return self.stream(*self.prepare_chat(messages, options, **fields))

    def render_chat(self, messages: Messages,
                    tools: Sequence[Mapping[str, object]] | None = None) -> str:
        """The prompt text the chat template makes of ``messages`` (and ``tools``, OpenAI's
        function definitions, the template's ``tools``)."""
        if self.chat_template is None:
            raise RequestError("this package has no chat template", path="messages",
                               file=str(self.package.root),
                               expected="tokenizer_config.json with a chat_template beside "
                                        "tokenizer.json",
                               remedy="add the model's tokenizer_config.json to the package, "
                                      "or send a plain prompt (generate / stream)")
        return self.chat_template.render(messages, add_generation_prompt=True, tools=tools)

    def prepare_chat(self, messages: Messages, options: GenerationOptions | int | None = None,
                     /, *, tools: Sequence[Mapping[str, object]] | None = None,
                     **fields) -> tuple[str, GenerationOptions]:
        """The prompt of ``messages`` and the options with the end-of-turn stops added
        (single-token endings as stop token ids, longer ones as stop strings): what
        :meth:`chat` generates from. It renders without taking the engine, so a server
        renders a chat before the request waits its turn. ``tools``: :meth:`render_chat`'s."""
        options = GenerationOptions.of(options, **fields)
        prompt = self.render_chat(messages, tools)
        assert self.chat_template is not None
        stop_ids, stops = list(options.stop_token_ids), list(
            (options.stop,) if isinstance(options.stop, str) else options.stop)
        for ending in self.chat_template.end_of_turn_texts():
            ids = self.tokenizer.encode(ending, add_special_tokens=False)
            if len(ids) == 1:
                stop_ids.append(ids[0])
            else:
                stops.append(ending)
        return prompt, GenerationOptions.of(options, stop=tuple(stops),
                                            stop_token_ids=tuple(stop_ids))

    # -- requests decoded together (speculative/scheduler.py) ------------------------------
    @functools.cached_property
    def scheduler(self) -> Scheduler:
        """The engine's scheduler, made on first use: the target's batched graph, its caches
        (``max_batch`` rows, grown to the rows' reservations) and its loop. A RequestError for a
        package without a batched graph."""
        rows, chunk = self._scheduler_shape
        return Scheduler(open_batched_pass(self.package, self._make_session, rows,
                                           self.sessions[self.package.plan.target]),
                         prefill_chunk=chunk)

    @functools.cached_property
    def chain_rows(self) -> ChainRows:
        """The chained drafter stepping the scheduler's rows together, made on first use: the
        step graph of B rows bound to the batched target's buffers (a ChainError where the
        drafter reads what the batched pass does not keep)."""
        package, plan = self.package, self.package.plan
        assert self.proposer is not None and plan.proposer is not None and plan.chain
        step = step_component(package, rows=True)
        return ChainRows(package, self.proposer, self.scheduler.target, *(
            self._make_session(f"{plan.proposer}.{name}", made.source, made.ports,
                               str(package.artifacts[plan.proposer]))
            for name, made in (("rows", step), ("rows.bootstrap", bootstrap_component(
                step, plan.chain.carry_output)))))

    @functools.cached_property
    def draft_rows(self) -> DraftRows | None:
        """The draft model drafting the scheduler's rows together, made on first use; None
        where its package has no batched graph of the scheduler's rows (rows draft alone)."""
        rows = self.scheduler.target.rows
        return DraftRows(self.draft, rows) if can_draft_rows(self.draft, rows) else None

    def submit(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
               inputs: Mapping[str, np.ndarray] | None = None, **fields) -> BatchedDecode:
        """Admit now (a bad request raises here) and queue the request on the scheduler;
        iterate the handle for committed token ids (each step runs every row), ``.result``
        at the end, ``.close()`` to cancel."""
        options = GenerationOptions.of(options, **fields)
        return self._submit(prompt, options, inputs,
                            with_text=isinstance(prompt, str) or bool(options.stop))

    def submit_stream(self, prompt: Prompt, options: GenerationOptions | int | None = None,
                      /, *, inputs: Mapping[str, np.ndarray] | None = None,
                      **fields) -> Stream:
        """:meth:`submit`, iterated for text pieces as :meth:`stream`'s are."""
        return Stream(self._submit(prompt, GenerationOptions.of(options, **fields), inputs,
                                   with_text=True))

    def _submit(self, prompt: Prompt, options: GenerationOptions,
                inputs: Mapping[str, np.ndarray] | None, *, with_text: bool) -> BatchedDecode:
        scheduler = self.scheduler
        state, proposer, policy = self._admit(prompt, options, inputs, with_text=with_text,
                                              batched=scheduler.target)
        return BatchedDecode(scheduler.submit(state, proposer, policy), scheduler,
                             self.tokenizer)

    def generate_many(self, prompts: Sequence[Prompt],
                      options: GenerationOptions | int | Sequence[GenerationOptions] | None
                      = None, /, *, inputs: Mapping[str, np.ndarray] | None = None,
                      **fields) -> list[Generation]:
        """Decode ``prompts`` together through the scheduler (continuous batching) and return
        what :meth:`generate` returns for each, in order. ``options``: one for all, or one
        per prompt; an error names the prompt's index, and none is decoded then."""
        handles = self.submit_many(prompts, options, inputs=inputs, **fields)
        try:
            while not all(handle.is_finished for handle in handles):
                self.scheduler.step()
        except BaseException:
            for handle in handles:
                handle.close()
            raise
        return results_of(handles)

    def submit_many(self, prompts: Sequence[Prompt],
                    options: GenerationOptions | int | Sequence[GenerationOptions] | None
                    = None, /, *, inputs: Mapping[str, np.ndarray] | None = None,
                    **fields) -> list[BatchedDecode]:
        """:meth:`submit` for each prompt (:meth:`generate_many`'s arguments), all or none:
        an error names the prompt's index, and the ones submitted before it are cancelled."""
        if not isinstance(prompts, list | tuple) or prompts and not is_prompt_list(prompts):
            raise RequestError("prompts must be a list of prompts (texts, or lists of token "
                               "ids)", path="prompts", value=type(prompts).__name__,
                               expected="[prompt, ...]",
                               remedy="wrap a single prompt in a list, or use generate")
        per_prompt = list(options) if isinstance(options, list | tuple) else \
            [options] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise RequestError(f"{len(per_prompt)} options for {len(prompts)} prompts",
                               path="options", value=len(per_prompt),
                               expected=f"one GenerationOptions, or {len(prompts)}")
        self.scheduler  # noqa: B018 - a package that cannot batch says so first
        handles: list[BatchedDecode] = []
        try:
            for i, (prompt, one) in enumerate(zip(prompts, per_prompt, strict=True)):
                try:
                    handles.append(self.submit(prompt, one, inputs=inputs, **fields))
                except SpeculantError as error:
                    raise of_prompt(error, i) from error
        except BaseException:
            for handle in handles:
                handle.close()
            raise
        return handles

    # -- admission ------------------------------------------------------------------------
    def admit(self, prompt: Prompt, options: GenerationOptions | int | None = None, /, *,
              inputs: Mapping[str, np.ndarray] | None = None, **fields) -> DecodeState:
        """Admit a request and return its decode state before the prefill (nothing runs)."""
        return self._admit(prompt, GenerationOptions.of(options, **fields), inputs,
                           with_text=False)[0]

    def _open(self, prompt: Prompt, options: GenerationOptions,
              inputs: Mapping[str, np.ndarray] | None, *, with_text: bool) -> Decode:
        turn = self._turns.wait()  # arrival order; held until the decode ends
        try:
            state, proposer, policy = self._admit(prompt, options, inputs, with_text=with_text)
        except BaseException:
            turn.release()
            raise
        route = choose_route(state, self.target, proposer)
        state.stats.route = route.reason
        return Decode(state, self.target, proposer, policy, route, turn, self.tokenizer)

    def _admit(self, prompt: Prompt, options: GenerationOptions,
               inputs: Mapping[str, np.ndarray] | None, *, with_text: bool,
               batched: BatchedTargetPass | None = None
               ) -> tuple[DecodeState, Proposer | None, WidthPolicy]:
        """``batched``: the request will decode with others, in a row of these caches."""
        options = options.checked()
        if isinstance(prompt, str | bytes | bytearray):
            prompt_ids = tuple(self.tokenizer.encode(checked_text("prompt", prompt)))
        else:
            prompt_ids = checked_token_ids("prompt_ids", prompt)
        if inputs is not None and not isinstance(inputs, Mapping):
            raise RequestError("inputs must be a mapping of input name to array",
                               path="inputs", value=type(inputs).__name__,
                               expected="a dict or None")
        request = Request(prompt_ids, options, dict(inputs or {}))
        plan = self.package.plan
        admitted = admit_request(plan, self.package.document.workflow.inputs, request,
                                 vocab_size=self.vocab_size, static_context_cap=plan.context_cap,
                                 never_materialized=self._fused_values())
        sources = self.proposer_sources if batched is None else dataclasses.replace(
            self.proposer_sources, is_batched=True, chained_rows=lambda: self.chain_rows,
            draft_rows=lambda: self.draft_rows)
        kind, k = admit_proposer(sources, request)
        row = batched.reserve(len(prompt_ids), options.max_new_tokens, k if kind else 0) \
            if batched is not None else None
        proposer, policy = build_proposer(dataclasses.replace(sources, row=row), kind,
                                          request, k)
        stop_ids = set(options.stop_token_ids)
        if options.stop_on_eos:
            stop_ids.update(plan.eos_ids)
        rules = StopRules(options.max_new_tokens, frozenset(stop_ids), admitted.context_cap)
        text = None
        if with_text or options.stop:
            if not self.tokenizer.has_text:
                what = "stop strings" if options.stop else "a text stream"
                raise RequestError(f"{what} need the tokenizer, and this package has none",
                                   path="stop" if options.stop else "prompt",
                                   file=str(self.package.root),
                                   remedy="use stop_token_ids and token ids (generate)")
            text = StopText(self.tokenizer, prompt_ids, options.stop)
        sampler = (Sampler(admitted.sampling, admitted.seed, options.acceptance)
                   if admitted.sampling is not None else None)
        constraint = None if options.grammar is None else compile_constraint(
            options.grammar, self.package.tokenizer_file, sorted(stop_ids), self.vocab_size)
        logprobs = None if options.logprobs is None and not options.prompt_logprobs else \
            Logprobs(options.logprobs or 0, options.prompt_logprobs)
        state = DecodeState.start(self.seam, self.package, rules, admitted, prompt_ids,
                                  sampler=sampler, text=text, k=k if proposer else 0,
                                  residency=self.sessions[plan.target].device,
                                  pool=self.static_pool, constraint=constraint,
                                  logprobs=logprobs, row=row)
        state.stats.proposer = kind.name if kind is not None else None
        if sampler is not None:
            state.stats.seed, state.stats.acceptance = sampler.seed, sampler.acceptance
        state.stats.cuda_graphs = self.cuda_graphs
        state.stats.cpu_pool = self.cpu_pool
        return state, proposer, policy

    def _fused_values(self) -> tuple[str, ...]:
        chain = self.package.plan.chain
        if chain is None:
            return ()
        value = self.package.plan.proposer_inputs.get(chain.fused_port)
        return (value,) if value else ()


def is_prompt_list(prompt: object) -> bool:
    """A list (or tuple) of prompts: not empty, each item a text or a sequence of token ids
    (a flat list of token ids is one prompt)."""
    return isinstance(prompt, list | tuple) and bool(prompt) and all(
        isinstance(item, str | list | tuple | np.ndarray) for item in prompt)


def results_of(handles: Sequence[BatchedDecode]) -> list[Generation]:
    """The results of finished requests, in order; an error names its request's index."""
    results = []
    for i, handle in enumerate(handles):
        try:
            results.append(handle.result)
        except SpeculantError as error:
            raise of_prompt(error, i) from error
    return results


def of_prompt(error: SpeculantError, index: int) -> SpeculantError:
    """``error`` of the ``index``-th prompt of a list: its paths under ``prompts[index]``."""
    where = f"prompts[{index}]"
    return type(error)(problems=[dataclasses.replace(
        problem, path=f"{where}.{problem.path}" if problem.path else where)
        for problem in error.problems])


def _can_auto_enable(package: Package) -> bool:
    """docs/design/spec/runtime.md §2.4's auto-enable rule: a distribution-preserving
    speculative section, every component's contract bitwise or distribution-preserving."""
    spec = package.document.speculative
    components = package.document.workflow.components.values()
    return spec is not None and spec.distribution_preserving and all(
        c.contract is not None and c.contract.equivalence in ("bitwise",
                                                              "distribution_preserving")
        for c in components)


def load(path: str | Path, device: str = "cpu", *, draft: str | Path | None = None,
         **options) -> Engine:
    """Load an inference package (a folder) and create its sessions on ``device``
    (``cpu``, ``cuda`` or ``cuda:N``); ``draft`` is the folder of a greedy-decoder package
    to load beside it as its draft model (``proposer="draft"``); ``options`` are
    :class:`Engine`'s keywords."""
    from speculant.package.loader import load_package

    draft_package = load_package(draft, device) if draft is not None else None
    return Engine(load_package(path, device), device, draft=draft_package, **options)
