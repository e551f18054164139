"""Acceptance on held-out greedy streams, measured by the runtime's own greedy round.

    report = measure_acceptance(target, drafter, streams, max_new_tokens=128, head_rows=N)
    report["4"]["mean_accepted_length"], report["4"]["first_draft_acceptance"]

A stream is ``{"ids": prompt + the target's greedy answer, "prompt_len"}``, the answer ending
at a stop token or after ``max_new_tokens``. For every chain context ``c`` the drafter drafts
``k_max`` tokens exactly as a round does (``docs/design/chained.md``: ``x[c]`` with the
seed ``h[c]`` (``ChainedDrafter.seed``), then the pending token ``x[c+1]``, then its own
argmax drafts over the first ``N`` ids, every step at position ``c`` reading the target's
keys of ``0..c``); the number of leading drafts equal to ``x[c+2..]`` is what the target
accepts there. The round loop is then replayed per stream: the prefill commits the pending
token, each round proposes ``k_r = min(k, remaining - 1)`` drafts and commits
``a_r = 1 + accepted`` tokens. A draft id >= N never equals the stream, so it is never
accepted.
"""

from __future__ import annotations

import torch

from speculant_tools.train_drafter.drafter import ChainedDrafter
from speculant_tools.train_drafter.llama import TorchLlama, rope_tables
from speculant_tools.train_drafter.objective import Batch

WIDTHS = (1, 2, 4, 8)


@torch.no_grad()
def chain_drafts(target: TorchLlama, drafter: ChainedDrafter, ids: torch.Tensor, k: int,
                 head_rows: int) -> torch.Tensor:
    """Drafts [B, T - 1, k]: row ``c`` is the proposal of a round whose chain context is
    ``c`` and whose pending token is ``ids[:, c + 1]``."""
    state = target.features(ids, drafter.stream_layers)
    contexts = ids.shape[1] - 1
    cos, sin = rope_tables(torch.arange(contexts, device=ids.device), target.config.head_dim,
                           target.config.rope_theta)
    keys, values = state.keys[:, :, :contexts], state.values[:, :, :contexts]
    carry, token, drafts = drafter.seed(state)[:, :contexts], ids[:, :contexts], []
    for j in range(k + 1):
        carry = drafter.step(target.embed, token, carry, cos, sin, keys, values)
        if j == 0:
            token = ids[:, 1:contexts + 1]  # the pending token
        else:
            token = target.logits(carry, head_rows).argmax(-1)
            drafts.append(token)
    return torch.stack(drafts, dim=-1)


def leading_matches(drafts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[..., k] x [..., k] -> how many leading entries agree [...]"""
    return (drafts == truth).int().cumprod(dim=-1).sum(dim=-1)


def replay_rounds(accepted: list[int], prompt_len: int, answer_len: int,
                  max_new_tokens: int, k: int) -> list[tuple[int, int]]:
    """``(k_r, a_r)`` of every round of the runtime's greedy loop over one stream, where
    ``accepted[c]`` drafts (of ``k_max``) are accepted from context ``c``."""
    rounds, committed = [], 1  # the prefill commits the pending token
    end = min(answer_len, max_new_tokens)
    while committed < end:
        width = min(k, max_new_tokens - committed - 1)
        if width <= 0:
            committed += 1
            continue
        a = 1 + min(width, accepted[prompt_len + committed - 2])
        rounds.append((width, a))
        committed += a
    return rounds


def summarize(rounds: list[tuple[int, int]], k: int) -> dict:
    """Mean accepted length (tokens committed a round), first-draft acceptance and the
    acceptance at each draft position."""
    rounds = [(width, a) for width, a in rounds if width > 0]
    proposed = [sum(1 for width, _ in rounds if width > i) for i in range(k)]
    accepted = [sum(1 for width, a in rounds if width > i and a - 1 > i) for i in range(k)]
    return {
        "rounds": len(rounds),
        "mean_accepted_length": sum(a for _, a in rounds) / len(rounds) if rounds else None,
        "first_draft_acceptance": (sum(a >= 2 for _, a in rounds) / len(rounds)
                                   if rounds else None),
        "acceptance_by_position": [a / p if p else None
                                   for a, p in zip(accepted, proposed, strict=True)],
    }


@torch.no_grad()
def measure_acceptance(target: TorchLlama, drafter: ChainedDrafter, streams: list[dict],
                       max_new_tokens: int, head_rows: int, batch_size: int = 16) -> dict:
    """Acceptance at k = 1, 2, 4, 8 over ``streams`` (see the module docstring), and
    ``stream_coverage``: the share of answer tokens < N (a bound on first-draft
    acceptance)."""
    k_max = max(WIDTHS)
    device = target.embed.device
    per_stream, covered, total = [], 0, 0
    for start in range(0, len(streams), batch_size):
        group = streams[start:start + batch_size]
        ids = Batch.of(group, device, multiple=8).ids
        width = ids.shape[1]
        drafts = chain_drafts(target, drafter, ids, k_max, head_rows)  # [B, T-1, k_max]
        for row, stream in enumerate(group):
            length, prompt_len = len(stream["ids"]), stream["prompt_len"]
            truth = torch.full((width + k_max + 2,), -1, dtype=torch.long, device=device)
            truth[:length] = ids[row, :length]
            columns = torch.arange(width - 1, device=device)
            window = truth[columns[:, None] + 2 + torch.arange(k_max, device=device)[None]]
            per_stream.append((leading_matches(drafts[row], window).tolist(), prompt_len,
                               length - prompt_len))
            covered += int((ids[row, prompt_len:length] < head_rows).sum())
            total += length - prompt_len
    report: dict = {"streams": len(streams), "answer_tokens": total,
                    "stream_coverage": covered / max(total, 1)}
    for k in WIDTHS:
        rounds = [r for accepted, prompt_len, answer_len in per_stream
                  for r in replay_rounds(accepted, prompt_len, answer_len, max_new_tokens, k)]
        report[str(k)] = summarize(rounds, k)
    return report
