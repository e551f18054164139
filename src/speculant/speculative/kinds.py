"""Proposer kinds: the one registry that maps a name to its proposer, its bound on k, its
default k, its request check and its builder (STYLE habit 5).

| name | proposer | declared by | bound on k |
|---|---|---|---|
| ``chained`` | ChainedProposer (per engine) | the ``speculative`` section | max_proposal_width |
| ``draft`` | DraftModelProposer (per request) | ``load(..., draft=PATH)`` | rollback_positions |
| ``prompt_lookup`` | PromptLookupProposer | nothing (no model) | rollback_positions |
| ``lookup_chained`` | LookupChainedProposer (per request) | ``speculative`` | max_proposal_width |

(``rollback_positions``: the smallest of the target's state groups.)

``auto`` is not a kind: it is ``chained`` where the auto-enable rule holds
(docs/design/spec/runtime.md §2.4), plain decoding otherwise. Admission, the CLI's choices
and help, and the bench's default list all read :data:`KINDS`; nothing else switches on a
kind's name.

``k``: an int is a fixed width (within the bound); None is the kind's default width, fixed;
``"auto"`` (the default of :class:`~speculant.workflow.options.GenerationOptions`) is the
measured width policy of ``speculative/width.py``, choosing each round's width in ``0 … the
kind's default`` from the engine's measured costs (:attr:`ProposerSources.costs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from speculant.errors import RequestError
from speculant.package.plan import LoadPlan
from speculant.session.session import ComponentSession
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.draft_model import DraftModel
from speculant.speculative.draft_rows import DraftRows
from speculant.speculative.lookup_chained import LookupChainedProposer
from speculant.speculative.prompt_lookup import PromptLookupProposer
from speculant.speculative.proposal import Proposer
from speculant.speculative.width import AUTO as AUTO_K
from speculant.speculative.width import FixedWidth, MeasuredWidth, WidthCosts, WidthPolicy
from speculant.workflow.cells import RowCells
from speculant.workflow.request import Request

AUTO = "auto"


@dataclass(frozen=True)
class ProposerSources:
    """What an engine has loaded that proposers are built from."""

    plan: LoadPlan
    chained: ChainedProposer | None  # the declared chained proposer, if any
    draft: DraftModel | None  # the draft model loaded beside the target, if any
    logits_width: int | None  # the target's, to check a draft's vocabulary against
    tokenizer_vocab: int | None
    can_auto_enable: bool  # the package's auto-enable rule holds
    costs: WidthCosts = field(default_factory=WidthCosts)  # measured, for k="auto"
    target_session: ComponentSession | None = None  # observed while k="auto" decodes
    proposing_sessions: tuple[ComponentSession, ...] = ()  # the proposers' sessions, alike
    # requests decoded together (speculative/scheduler.py): only kinds that can run per row,
    # the chained drafter stepping the rows together (made on first use: chain_rows.py), the
    # draft model too where its package batches (draft_rows.py; None: each row's draft model
    # with caches of its own, not the engine's pool, kept for one request); ``row``: the
    # request's row of the scheduler's caches, reserved
    is_batched: bool = False
    chained_rows: Callable[[], Proposer] | None = None
    draft_rows: Callable[[], DraftRows | None] | None = None
    row: RowCells | None = None


@dataclass(frozen=True)
class Bound:
    max_k: int
    path: str  # the field the bound comes from, for messages


class ProposerKind(Protocol):
    """One proposer kind. ``bound`` raises :class:`RequestError` where the engine cannot run
    the kind at all; ``check`` refuses request settings the kind cannot serve."""

    name: str
    help: str
    can_batch: bool  # whether requests decoded together (one row each) can use it

    def bound(self, sources: ProposerSources) -> Bound: ...
    def default_k(self, sources: ProposerSources) -> int: ...
    def check(self, sources: ProposerSources, request: Request) -> None: ...
    def build(self, sources: ProposerSources, request: Request, k: int) -> Proposer: ...


def _rollback_bound(sources: ProposerSources, name: str) -> Bound:
    bound = sources.plan.undeclared_rollback_bound
    if bound is None:
        raise RequestError(
            f"proposer '{name}' needs every state group of the target to declare "
            "capabilities.rollback_positions (the rollback bound), and this package does not",
            path="rollback_positions", value=name,
            remedy="declare rollback_positions on the target's state groups")
    return Bound(bound, "rollback_positions")


class Chained:
    name = "chained"
    help = "the chained drafter the package declares"
    can_batch = True  # every chained row of a step drafted in one run per step (chain_rows)

    def bound(self, sources: ProposerSources) -> Bound:
        if sources.chained is None or sources.plan.rollback_bound is None:
            raise RequestError("this package declares no chained speculative contract "
                               "(no 'speculative' section with proposal_execution.kind: "
                               "chained)", path="speculative", value=self.name,
                               remedy="decode without a proposer, or use "
                                      "proposer='prompt_lookup'")
        return Bound(sources.plan.rollback_bound, "speculative.max_proposal_width")

    def default_k(self, sources: ProposerSources) -> int:
        return self.bound(sources).max_k

    def check(self, sources: ProposerSources, request: Request) -> None:
        pass  # a subset vocabulary samples too (its q is 0 beyond its ids); rows or alone

    def build(self, sources: ProposerSources, request: Request, k: int) -> Proposer:
        assert sources.chained is not None
        if sources.is_batched:
            assert sources.chained_rows is not None
            return sources.chained_rows()
        return sources.chained


class Draft:
    name = "draft"
    help = "a draft model (load(..., draft=PATH); CLI --draft)"
    can_batch = True

    def bound(self, sources: ProposerSources) -> Bound:
        if sources.draft is None:
            raise RequestError("proposer 'draft' needs a draft model, and none is loaded",
                               path="draft", value=self.name,
                               remedy="load the target with speculant.load(PATH, "
                                      "draft=DRAFT_PATH) (CLI: --draft DRAFT_PATH)")
        return _rollback_bound(sources, self.name)

    def default_k(self, sources: ProposerSources) -> int:
        assert sources.draft is not None
        bound = self.bound(sources).max_k
        own = sources.draft.rollback_bound
        return bound if own is None else max(1, min(bound, own + 1))

    def check(self, sources: ProposerSources, request: Request) -> None:
        pass  # the draft side admits the request itself, in build

    def build(self, sources: ProposerSources, request: Request, k: int) -> Proposer:
        """Batch 1: the request's own draft model; decoded together, its row of the draft
        model's rows (one batched pass per draft step for every row: draft_rows.py) where
        the draft package batches and no grammar forces its drafts (drafted one by one as
        alone), else a draft model with caches of its own."""
        assert sources.draft is not None
        vocab = {"target_logits_width": sources.logits_width,
                 "target_tokenizer_vocab": sources.tokenizer_vocab}
        rows = sources.draft_rows() if sources.draft_rows is not None else None
        if rows is not None and sources.row is not None and request.options.grammar is None:
            return rows.start(sources.row, request, k, **vocab)
        return sources.draft.start(request, k, is_pooled=not sources.is_batched, **vocab)


class PromptLookup:
    name = "prompt_lookup"
    help = "n-grams of the prompt and the output (no model)"
    can_batch = True

    def bound(self, sources: ProposerSources) -> Bound:
        return _rollback_bound(sources, self.name)

    def default_k(self, sources: ProposerSources) -> int:
        return self.bound(sources).max_k

    def check(self, sources: ProposerSources, request: Request) -> None:
        pass  # ngram_range is checked with the options

    def build(self, sources: ProposerSources, request: Request, k: int) -> Proposer:
        return PromptLookupProposer(*request.options.ngram_range)


class LookupChained(Chained):
    """The chained drafter's bound, default and checks; each round prompt lookup's drafts
    where a 2- or 3-gram recurs (speculative/lookup_chained.py)."""

    name = "lookup_chained"
    help = "prompt lookup where the context repeats, the chained drafter elsewhere"

    def build(self, sources: ProposerSources, request: Request, k: int) -> Proposer:
        return LookupChainedProposer(super().build(sources, request, k),
                                     *request.options.ngram_range)


KINDS: dict[str, ProposerKind] = {kind.name: kind for kind in (
    Chained(), Draft(), PromptLookup(), LookupChained())}
NAMES = tuple(KINDS)  # every name a request, the CLI and the bench may use


def resolve(name: str | None, sources: ProposerSources) -> ProposerKind | None:
    """The kind ``name`` asks for (None: plain decoding; ``auto``: chained or none)."""
    if name is None:
        return None
    if name == AUTO:
        return KINDS["chained"] if sources.can_auto_enable and sources.chained else None
    kind = KINDS.get(name)
    if kind is None:
        raise RequestError(f"unknown proposer '{name}'", path="proposer", value=name,
                           expected=f"one of {', '.join(map(repr, NAMES))} or '{AUTO}'")
    return kind


def widest_k(sources: ProposerSources, proposer: str | None, k: int | str | None) -> int:
    """The widest proposal a request of ``proposer`` and ``k`` may make, which its static
    caches are sized for (0: no proposer): ``k`` where fixed, else its kind's default."""
    kind = resolve(proposer, sources)
    if kind is None:
        return 0
    return k if isinstance(k, int) else kind.default_k(sources)


def available_kind(sources: ProposerSources) -> str | None:
    """The first kind of :data:`KINDS` this engine can run (chained, then draft, then
    prompt_lookup), or None: what a caller who asks for speculation without naming a kind
    gets (the chat's default)."""
    for kind in KINDS.values():
        try:
            kind.bound(sources)
        except RequestError:
            continue
        return kind.name
    return None


def admit_proposer(sources: ProposerSources, request: Request) -> tuple[ProposerKind | None,
                                                                          int]:
    """The request's kind and k: k defaults to the kind's default and
    must lie within its bound (``"auto"``: k is the largest width the controller may pick,
    the kind's default); the kind's own check runs last."""
    kind = resolve(request.options.proposer, sources)
    if kind is None:
        return None, 0
    if sources.is_batched and not kind.can_batch:
        asked = request.options.proposer
        raise RequestError(
            f"proposer '{kind.name}'" + (f" (what '{asked}' is here)" if asked != kind.name
                                         else "") + " does not run on requests decoded "
            "together yet", path="proposer", value=asked,
            expected="one of " + ", ".join(repr(k.name) for k in KINDS.values() if k.can_batch)
            + " or None",
            remedy="use proposer='prompt_lookup' or 'draft' (or None) with the scheduler "
                   "(generate_many / submit), or decode this request alone with "
                   "engine.generate(...)")
    bound = kind.bound(sources)
    asked = request.options.k
    k = asked if isinstance(asked, int) else kind.default_k(sources)
    if k > bound.max_k:
        raise RequestError(f"k = {k} exceeds {bound.path} = {bound.max_k}", path=bound.path,
                           value=k, expected=f"1 <= k <= {bound.max_k}")
    kind.check(sources, request)
    return kind, k


def build_proposer(sources: ProposerSources, kind: ProposerKind | None, request: Request,
                   k: int) -> tuple[Proposer | None, WidthPolicy]:
    """The admitted kind's proposer for ``request`` and its width policy: ``k`` fixed, or
    with ``k="auto"`` measured (``k`` then being the widest it may choose)."""
    if kind is None:
        return None, FixedWidth(0)
    proposer = kind.build(sources, request, k)
    if request.options.k != AUTO_K:
        return proposer, FixedWidth(k)
    return proposer, MeasuredWidth(k, kind.name, sources.costs, sources.target_session,
                                   sources.proposing_sessions)
