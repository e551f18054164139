"""Batched generation by the target: one prefill, then one-token steps over a preallocated
KV cache (no ``generate``, no ``torch.compile``).

    rows = generate_batch(target, prompts, max_new_tokens=192, stop_ids={2},
                          sampling=Sampling(temperature=0.7, top_p=0.95), generator=g)

Prompts are left-padded to one width ``P``; row ``r`` has ``pad_r`` padding slots, and its
token at slot ``s`` sits at position ``s - pad_r`` and sees the keys of its own non-padding
slots ``<= s`` (a padding slot sees itself only: finite values no real query reads). The
cache ``[layers, B, kv_heads, P + max_new_tokens, head_dim]`` is written in place.

Sampling draws from ``softmax(top-K logits / temperature)`` cut to the smallest prefix by
descending probability that reaches ``top_p`` (K = :data:`TOP_K_CAP`: no row is sorted over the
whole vocabulary; it differs from plain top-p only where the nucleus holds more than K ids).
A row ends at its first stop id (kept); the loop ends when every row has.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speculant_tools.train_drafter.llama import TorchLlama, rms_norm, rope_tables

TOP_K_CAP = 256


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen; ``temperature == 0``: the argmax (greedy)."""

    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = Sampling()


def next_tokens(logits: torch.Tensor, sampling: Sampling,
                generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] scores -> [B] token ids."""
    if sampling.is_greedy:
        return logits.argmax(-1)
    values, ids = logits.float().topk(min(TOP_K_CAP, logits.shape[-1]), dim=-1)  # sorted
    probs = torch.softmax(values / sampling.temperature, dim=-1)
    before = probs.cumsum(-1) - probs  # the mass of the more probable ids
    probs = torch.where(before < sampling.top_p, probs, torch.zeros_like(probs))  # keeps 1
    choice = torch.multinomial(probs, 1, generator=generator)  # renormalizes
    return ids.gather(-1, choice)[:, 0]


@torch.no_grad()
def generate_batch(target: TorchLlama, prompts: list[list[int]], *, max_new_tokens: int,
                   stop_ids: Collection[int], sampling: Sampling = GREEDY,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """The continuation of every prompt: through its first stop id, or ``max_new_tokens``
    long. Runs in the target's dtype, on its device."""
    c = target.config
    device, dtype = target.embed.device, target.embed.dtype
    batch, width = len(prompts), max(len(p) for p in prompts)
    slots_total = width + max_new_tokens
    pads = torch.tensor([width - len(p) for p in prompts], device=device)  # [B]
    ids = torch.zeros(batch, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
    ids = ids.to(device)
    slots = torch.arange(slots_total, device=device)
    is_real = slots[None] >= pads[:, None]  # [B, S]: every decode slot is real
    positions = (slots[None] - pads[:, None]).clamp(min=0)  # [B, S]
    cos_table, sin_table = rope_tables(torch.arange(slots_total, device=device), c.head_dim,
                                       c.rope_theta)
    cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]  # [B, 1, S, d]
    keys = torch.empty(len(target.layers), batch, c.num_key_value_heads, slots_total,
                       c.head_dim, device=device, dtype=dtype)
    values = torch.empty_like(keys)
    stops = torch.tensor(sorted(set(stop_ids)) or [-1], device=device)

    # prefill: slots 0..P-1, causal over the row's own slots; a padding slot sees itself
    causal = slots[:width, None] >= slots[None, :width]
    allowed = (causal[None] & is_real[:, None, :width]) | torch.eye(
        width, dtype=torch.bool, device=device)[None]
    x = F.embedding(ids, target.embed)
    for li, layer in enumerate(target.layers):
        q, k, v = target.project(layer, x, cos[:, :, :width], sin[:, :, :width])
        keys[li, :, :, :width], values[li, :, :, :width] = k, v
        x = target.attend(layer, x, q, k, v, allowed[:, None], is_causal=False)
    token = next_tokens(target.logits(rms_norm(x[:, -1], target.norm, target.eps)), sampling,
                        generator)
    out, done = [token], torch.isin(token, stops)
    for step in range(1, max_new_tokens):
        if step % 8 == 0 and bool(done.all()):
            break
        slot = width + step - 1  # where `token` is written
        x = F.embedding(token[:, None], target.embed)
        mask = is_real[:, None, None, :slot + 1]  # [B, 1, 1, slot + 1]
        for li, layer in enumerate(target.layers):
            q, k, v = target.project(layer, x, cos[:, :, slot:slot + 1],
                                     sin[:, :, slot:slot + 1])
            keys[li, :, :, slot:slot + 1], values[li, :, :, slot:slot + 1] = k, v
            x = target.attend(layer, x, q, keys[li, :, :, :slot + 1],
                              values[li, :, :, :slot + 1], mask, is_causal=False)
        token = next_tokens(target.logits(rms_norm(x[:, -1], target.norm, target.eps)),
                            sampling, generator)
        out.append(token)
        done = done | torch.isin(token, stops)
    rows = torch.stack(out, dim=1).tolist()  # [B, <= max_new_tokens]
    return [_through_first_stop(row, stop_ids) for row in rows]


def _through_first_stop(row: list[int], stop_ids: Collection[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in stop_ids:
            return row[:i + 1]
    return row
