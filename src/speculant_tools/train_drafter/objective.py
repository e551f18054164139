"""The drafter's loss: training-time test (the chain unrolled on its own carries) on top of
a teacher-forced step.

A training sequence is ``prompt + answer`` (the target's own greedy or sampled answer),
right-padded in a batch ``ids [B, T]``. Every answer-side position ``c`` (``c >=
prompt_len - 1``) is a chain context, all of them at once, as the runtime drives a round from
``c`` (``docs/design/chained.md``):

    step 0 (bootstrap):  token x[c],   carry = the seed h[c]              -> p(. | x[..c])
    step j = 1..U-1:     token x[c+j], carry = the drafter's step j-1     -> p(. | x[..c+j])

each step at position id ``c`` reading the target's last-layer keys and values of ``0..c``;
the seed ``h[c]`` is ``ChainedDrafter.seed``: the target's hidden state after its final norm,
or EAGLE-3's fused streams, whose projection trains jointly (gradients reach it through every
step); gradients flow through the carries (training-time test: the drafter learns on the carries it
will itself produce, never on the target's). On a greedy answer ``x[c+1..]`` are the pending
token and exactly the drafts a round accepts, so feeding them is the runtime's input wherever
a draft can still count; a step after a wrong draft never counts, whatever it is fed.

The teacher-forced step: token ``x[c+1]`` with the seed ``h[c]`` as the carry ->
``p(. | x[..c+1])``: the first draft's step given the carry a perfect bootstrap would make.

Loss per step: KL(p_N || q) with ``p_N`` the target's distribution over the first ``N`` ids
(the subset draft vocabulary), renormalized; ``argmax p_N`` is the target's greedy token
wherever that token is < N, the only place a draft can be accepted. The steps are weighted
(:meth:`Objective.step_weights`: the bootstrap ``bootstrap_weight``, draft ``j`` ``decay **
(j - 1)``, the teacher-forced step ``teacher_forcing_weight``), normalized over the steps a
batch reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant_tools.train_drafter.drafter import ChainedDrafter
from speculant_tools.train_drafter.llama import TorchLlama, rope_tables


@dataclass(frozen=True)
class Objective:
    head_rows: int  # N: the drafter scores the first N ids
    unroll: int = 6  # chained steps: the bootstrap and unroll - 1 drafts
    step_decay: float = 0.8  # draft j weighs decay ** (j - 1)
    bootstrap_weight: float = 0.5  # step 0 is never a draft; its output is draft 1's carry
    teacher_forcing_weight: float = 0.2

    def step_weights(self) -> list[float]:
        return [self.bootstrap_weight] + [self.step_decay ** (j - 1)
                                          for j in range(1, self.unroll)]


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] long, right-padded with 0
    prompt_lens: torch.Tensor  # [B] long
    lens: torch.Tensor  # [B] long: prompt + answer

    @classmethod
    def of(cls, examples: list[dict], device: torch.device, multiple: int = 16) -> Batch:
        """``examples``: ``{"ids": prompt + answer, "prompt_len": int}`` each."""
        width = max(len(e["ids"]) for e in examples)
        width = -(-width // multiple) * multiple
        ids = torch.zeros(len(examples), width, dtype=torch.long)
        for row, example in enumerate(examples):
            ids[row, :len(example["ids"])] = torch.tensor(example["ids"])
        return cls(ids.to(device),
                   torch.tensor([e["prompt_len"] for e in examples], device=device),
                   torch.tensor([len(e["ids"]) for e in examples], device=device))

    @property
    def num_answer_tokens(self) -> int:
        return int((self.lens - self.prompt_lens).sum())


def shifted(x: torch.Tensor, j: int) -> torch.Tensor:
    """``x[:, c + j]`` at column ``c``, zeros (False) past the end."""
    if j == 0:
        return x
    return torch.cat([x[:, j:], torch.zeros_like(x[:, :j])], dim=1)


@dataclass
class LossParts:
    loss: torch.Tensor  # the weighted mean: what is minimized
    step_kl: list[float]  # per chained step (0: the bootstrap)
    step_agree: list[float]  # the drafter's argmax == the target's restricted argmax
    teacher_forced_kl: float | None


def chained_loss(target: TorchLlama, drafter: ChainedDrafter, batch: Batch,
                 objective: Objective) -> LossParts:
    """The weighted loss of one batch (see the module docstring)."""
    ids = batch.ids
    rows_n, length = ids.shape
    embed, n = target.embed, objective.head_rows
    with torch.no_grad():
        state = target.features(ids, drafter.stream_layers)
        position = torch.arange(length, device=ids.device)[None]
        is_context = position >= batch.prompt_lens[:, None] - 1  # [B, T]
        is_teacher = is_context & (position <= batch.lens[:, None] - 2)  # next token known
        row_of = torch.cumsum(is_teacher.flatten(), 0).view(rows_n, length) - 1
        teacher = F.log_softmax(target.logits(state.hidden[is_teacher], n).float(), dim=-1)
        teacher_top = teacher.argmax(-1)
    cos, sin = rope_tables(torch.arange(length, device=ids.device), target.config.head_dim,
                           target.config.rope_theta)

    def kl_at(carry: torch.Tensor, j: int) -> tuple[torch.Tensor, float] | None:
        rows = is_context & shifted(is_teacher, j)
        if not bool(rows.any()):
            return None
        log_q = F.log_softmax(target.logits(carry[rows], n).float(), dim=-1)
        teacher_rows = shifted(row_of, j)[rows]
        kl = F.kl_div(log_q, teacher[teacher_rows], log_target=True, reduction="batchmean")
        agree = (log_q.detach().argmax(-1) == teacher_top[teacher_rows]).float().mean()
        return kl, float(agree)

    terms, used, step_kl, step_agree = [], [], [], []
    seed = drafter.seed(state)  # [B, T, H]; with the fused seed: trained
    carry = seed
    for j, weight in enumerate(objective.step_weights()):
        carry = drafter.step(embed, shifted(ids, j), carry, cos, sin, state.keys, state.values)
        found = kl_at(carry, j)
        if found is None:
            break
        terms.append(found[0] * weight)
        used.append(weight)
        step_kl.append(float(found[0].detach()))
        step_agree.append(found[1])
    teacher_forced_kl = None
    if objective.teacher_forcing_weight > 0:
        forced = drafter.step(embed, shifted(ids, 1), seed, cos, sin, state.keys,
                              state.values)
        found = kl_at(forced, 1)
        if found is not None:
            terms.append(found[0] * objective.teacher_forcing_weight)
            used.append(objective.teacher_forcing_weight)
            teacher_forced_kl = float(found[0].detach())
    if not terms:
        raise ValueError("a batch without one answer position: every example needs an answer "
                         "of at least two tokens")
    return LossParts(torch.stack(terms).sum() / sum(used), step_kl, step_agree,
                     teacher_forced_kl)
