"""Proposer kinds -> proposers: the one place where a kind names a class (STYLE habit 5).

| kind | proposer | declared by |
|---|---|---|
| ``chained`` | :class:`ChainedProposer` (one per engine) | the package's ``speculative`` section |
| ``draft`` | :class:`DraftModelProposer` (one per request) | ``load(..., draft=PATH)`` |
| ``prompt_lookup`` | :class:`PromptLookupProposer` | nothing: it needs no model |

Admission (``workflow/request.py``) has already checked the kind's name, ``k`` against its
bound and, for ``chained``, that the package declares it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speculant.errors import RequestError
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.draft_model import DraftModel
from speculant.speculative.prompt_lookup import PromptLookupProposer
from speculant.speculative.proposal import Proposer
from speculant.workflow.request import Request


@dataclass(frozen=True)
class ProposerSources:
    """What an engine has loaded that proposers are built from."""

    chained: ChainedProposer | None  # the declared chained proposer, if any
    draft: DraftModel | None  # the draft model loaded beside the target, if any
    logits_width: int | None  # the target's, to check a draft's vocabulary against
    tokenizer_vocab: int | None


def _draft(sources: ProposerSources, request: Request, k: int) -> Proposer:
    if sources.draft is None:
        raise RequestError("proposer 'draft' needs a draft model, and none is loaded",
                           path="draft", value="draft",
                           remedy="load the target with speculant.load(PATH, draft=DRAFT_PATH) "
                                  "(CLI: --draft DRAFT_PATH)")
    return sources.draft.start(request, k, target_logits_width=sources.logits_width,
                               target_tokenizer_vocab=sources.tokenizer_vocab)


def _chained(sources: ProposerSources, request: Request, k: int) -> Proposer:
    assert sources.chained is not None  # admission refused 'chained' without a chain
    return sources.chained


PROPOSERS: dict[str, Callable[[ProposerSources, Request, int], Proposer]] = {
    "chained": _chained,
    "draft": _draft,
    "prompt_lookup": lambda sources, request, k: PromptLookupProposer(*request.ngram_range),
}


def make_proposer(kind: str | None, sources: ProposerSources, request: Request,
                  k: int) -> Proposer | None:
    """The proposer of kind ``kind`` for one request (None: decode without one)."""
    return None if kind is None else PROPOSERS[kind](sources, request, k)
