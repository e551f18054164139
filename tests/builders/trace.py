"""Expected streams and speculative traces, computed from the fixture's definition.

``speculative_trace`` follows runtime.md §5-§14 round by round: width capping (§13),
the proposal, verification, greedy acceptance, commit with stop checks, and the next chain
context. The target's choices come from ``definition.next_token``; the chained drafts come from
``reference.drafter_forward`` fed exactly what a correctly wired chain feeds it (the oracle of
runtime.md §15: a fresh target pass over ``x[0..C')`` gives carry_0 and the borrowed cache).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from builders import definition as fx
from builders import reference as ref

Proposer = Callable[[list[int], int, int], list[int]]  # (x[0..C], C, k_r) -> drafts


def target_next(spec: fx.FixtureSpec, stream: Sequence[int], i: int) -> int:
    """The target's token after position ``i`` of ``stream`` (needs ``stream[0..i]``)."""
    prev_code = fx.code(stream[i - 1]) if i > 0 else 0
    return fx.next_token(prev_code, stream[i], spec.is_deviation(i))


def target_pass(spec: fx.FixtureSpec, tokens: Sequence[int],
                dtype: str = "float32") -> ref.TargetOutputs:
    """A fresh target pass over ``tokens`` from empty caches (positions 0..len-1)."""
    n = len(tokens)
    ids = np.asarray(tokens, np.int64).reshape(1, n)
    return ref.target_forward(spec, ids, np.arange(n, dtype=np.int64).reshape(1, n),
                              np.ones((1, n), np.int64), ref.empty_cache(dtype),
                              ref.empty_cache(dtype), fx.EMBEDDING_TABLE.astype(dtype))


# -- proposers -----------------------------------------------------------------------------
def chained_drafts(spec: fx.FixtureSpec, stream: Sequence[int], consumed: int, k: int,
                   dtype: str = "float32") -> list[int]:
    """runtime.md §9.4 with a correct chain context: ``stream[0..consumed]`` ends with the
    pending token. Returns ``k`` drafts after ``k + 1`` drafter invocations."""
    context = target_pass(spec, stream[:consumed], dtype)  # the oracle's fresh pass
    last, carry = stream[consumed - 1], context.hidden_states[0, consumed - 1]
    positions = np.array([[consumed - 1]], np.int64)
    mask = np.ones((1, consumed), np.int64)
    drafts: list[int] = []
    for j in range(k + 1):
        out = ref.drafter_forward(spec, ref.fused_input(last, carry, dtype), positions, mask,
                                  context.present_key, context.present_value)
        carry = out.projected_state[0, -1].astype(dtype)
        if j == 0:
            last = stream[consumed]  # bootstrap: the pending token
        else:
            last = int(out.tokens[0, -1])
            drafts.append(last)
    return drafts


def prompt_lookup_drafts(stream: Sequence[int], k: int, n_max: int = 3,
                         n_min: int = 1) -> list[int]:
    """runtime.md §18: the up to ``k`` tokens after the most recent earlier occurrence of the
    stream's last n-gram, n from ``n_max`` down to ``n_min``; [] when none is found."""
    length = len(stream)
    for n in range(n_max, n_min - 1, -1):
        if n >= length:
            continue
        tail = list(stream[length - n:])
        for start in range(length - n - 1, -1, -1):
            if list(stream[start:start + n]) == tail:
                return list(stream[start + n:start + n + k])
    return []


def draft_model_drafts(draft_spec: fx.FixtureSpec, stream: Sequence[int], k: int) -> list[int]:
    """A greedy-decoder draft model: its own greedy continuation of ``stream``."""
    extended = list(stream)
    for _ in range(k):
        extended.append(target_next(draft_spec, extended, len(extended) - 1))
    return extended[len(stream):]


# -- the trace -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Round:
    """One round (``k > 0``) or greedy step (``k == 0``) starting at consumed count
    ``consumed``: block ``[pending] + drafts``, target tokens ``targets`` (t[1..k+1]),
    ``accepted`` = a, ``committed`` = what was appended (shorter than a if a stop cut in)."""

    consumed: int
    k: int
    drafts: tuple[int, ...]
    targets: tuple[int, ...]
    accepted: int
    committed: tuple[int, ...]

    @property
    def is_greedy_step(self) -> bool:
        return self.k == 0


@dataclass
class Trace:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # generated (committed) tokens
    rounds: list[Round] = field(default_factory=list)  # rounds and greedy steps, in order
    stop_reason: str = ""  # "budget" | "eos" | "context"
    proposer_kind: str = "chained"  # "chained" | "draft_model" | "prompt_lookup" | "none"
    num_rollback_cells: int = 2

    def pairs(self) -> list[tuple[int, int]]:
        """The per-round ``(k_r, a_r)`` trace (greedy steps excluded)."""
        return [(r.k, r.accepted) for r in self.rounds if not r.is_greedy_step]

    def drafts(self) -> list[tuple[int, ...]]:
        return [r.drafts for r in self.rounds if not r.is_greedy_step]

    def counters(self) -> dict[str, int]:
        """The stats record of evidence.md §2 (residency counters excluded); argmax_rows
        counts the rows reduced to ids (prefill, every target row, every draft)."""
        rounds = [r for r in self.rounds if not r.is_greedy_step]
        rollbacks = [r for r in rounds if r.accepted <= r.k]
        greedy_steps = len(self.rounds) - len(rounds)
        accepted = sum(r.accepted - 1 for r in rounds)
        proposed = sum(r.k for r in rounds)
        # per round: (proposer invocations, proposer argmax rows) for k_r drafts
        per_round = {"chained": lambda k: (k + 1, k), "draft_model": lambda k: (k, k),
                     "prompt_lookup": lambda k: (0, 0), "none": lambda k: (0, 0)}
        proposer = [per_round[self.proposer_kind](r.k) for r in rounds]
        return {
            "rounds": len(rounds),
            "greedy_steps": greedy_steps,
            "drafts_proposed": proposed,
            "accepted_drafts": accepted,
            "rejected_drafts": proposed - accepted,
            "rounds_with_first_draft_accepted": sum(r.accepted >= 2 for r in rounds),
            "full_accepts": len(rounds) - len(rollbacks),
            "rollbacks": len(rollbacks),
            "rolled_back_positions": sum(r.k + 1 - r.accepted for r in rollbacks),
            "rolled_back_cells": len(rollbacks) * self.num_rollback_cells,
            "proposer_invocations": sum(invocations for invocations, _ in proposer),
            "target_passes": 1 + len(rounds) + greedy_steps,
            "argmax_rows": 1 + greedy_steps + proposed + len(rounds)
            + sum(rows for _, rows in proposer),
        }


def context_cap(spec: fx.FixtureSpec, max_context: int | None = None) -> int:
    return spec.max_context if max_context is None else min(spec.max_context, max_context)


def speculative_trace(spec: fx.FixtureSpec, prompt: Sequence[int], max_new_tokens: int,
                      k: int = 0, *, proposer: str | fx.FixtureSpec | None = "chained",
                      rollback_bound: int = 4, eos_ids: Iterable[int] = (fx.EOS_ID,),
                      max_context: int | None = None, dtype: str = "float32",
                      num_rollback_cells: int = 2) -> Trace:
    """The exact decode of ``prompt``: ``proposer`` is "chained", "prompt_lookup", a
    ``FixtureSpec`` (a draft model built from it), or None / ``k == 0`` for plain greedy.
    ``rollback_bound`` is max_proposal_width (chained) or the groups' rollback_positions."""
    cap = context_cap(spec, max_context)
    if not prompt or len(prompt) >= cap:
        raise ValueError(f"prompt of {len(prompt)} tokens with a context cap of {cap}")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    eos = frozenset(eos_ids)
    x = list(prompt)
    kind = "draft_model" if isinstance(proposer, fx.FixtureSpec) else (proposer or "none")
    trace = Trace(prompt=list(prompt), proposer_kind=kind,
                  num_rollback_cells=num_rollback_cells)
    propose = _proposer(spec, proposer, dtype) if (proposer is not None and k > 0) else None

    def commit(token: int) -> bool:
        """Append ``token``; True when decoding stops (runtime.md §13, in commit order)."""
        x.append(token)
        trace.tokens.append(token)
        if len(trace.tokens) == max_new_tokens:
            trace.stop_reason = "budget"
        elif token in eos:
            trace.stop_reason = "eos"
        elif len(x) == cap:
            trace.stop_reason = "context"
        return bool(trace.stop_reason)

    consumed = len(prompt)
    pending = target_next(spec, x, consumed - 1)  # prefill
    stopped = commit(pending)
    while not stopped:
        remaining = max_new_tokens - len(trace.tokens)
        k_r = min(k, rollback_bound, remaining - 1, cap - len(x) - 1) if propose else 0
        drafts = propose(x, consumed, k_r) if k_r > 0 else []
        k_r = len(drafts)  # prompt lookup may find fewer
        block = [pending] + drafts
        targets = [target_next(spec, x[:consumed] + block[:i], consumed + i - 1)
                   for i in range(1, k_r + 2)]
        accepted = 1
        while accepted <= k_r and block[accepted] == targets[accepted - 1]:
            accepted += 1
        committed: list[int] = []
        for token in block[1:accepted] + [targets[accepted - 1]]:
            committed.append(token)
            if stopped := commit(token):
                break
        trace.rounds.append(Round(consumed, k_r, tuple(drafts), tuple(targets), accepted,
                                  tuple(committed)))
        consumed += accepted
        pending = targets[accepted - 1]
    return trace


def _proposer(spec: fx.FixtureSpec, proposer: str | fx.FixtureSpec, dtype: str) -> Proposer:
    if isinstance(proposer, fx.FixtureSpec):
        return lambda x, consumed, k: draft_model_drafts(proposer, x[:consumed + 1], k)
    if proposer == "chained":
        return lambda x, consumed, k: chained_drafts(spec, x, consumed, k, dtype)
    if proposer == "prompt_lookup":
        return lambda x, consumed, k: prompt_lookup_drafts(x[:consumed + 1], k)
    raise ValueError(f"unknown proposer {proposer!r}")


def greedy_stream(spec: fx.FixtureSpec, prompt: Sequence[int], max_new_tokens: int, *,
                  eos_ids: Iterable[int] = (fx.EOS_ID,),
                  max_context: int | None = None) -> list[int]:
    """The generated tokens of a plain greedy decode (the stream G of runtime.md §14.2)."""
    return speculative_trace(spec, prompt, max_new_tokens, proposer=None, eos_ids=eos_ids,
                             max_context=max_context).tokens
