"""The target's continuations in large batches: one prefill, then a plain decode loop over a
preallocated KV cache (no ``generate``, no ``torch.compile``).

    rows = decode_batch(model, prompts, new_tokens=192, eos_id=2, sample=True,
                        temperature=0.7, top_p=0.95, generator=g)

Prompts are left-padded to one width ``P``; row ``r`` has ``pad_r`` padding slots, and its
token at slot ``s`` sits at position ``s - pad_r`` (RoPE) and sees the keys of its own
non-padding slots ``<= s``. A padding slot attends to itself only (finite values, never read
by a real query). The cache ``[layers, B, kv_heads, P + new_tokens, head_dim]`` (23 KB a
token for SmolLM2-135M in bfloat16) is written in place; a decode step's attention reads its
prefix. Grouped-query attention without copying the cache: the one query of a step is
reshaped to ``[B, kv_heads, groups, head_dim]`` (query head ``h`` reads KV head
``h // groups``, as HF's ``repeat_kv``).

Sampling: ``softmax(top-64 logits / temperature)``, then the smallest prefix of it by
descending probability reaching ``top_p``, renormalized, one draw. The top-64 cut (instead of
``generate``'s top-p over all 49,152 ids) only differs where the nucleus holds more than 64
ids, and avoids sorting every row; the continuations are training data, not a served
distribution. Rows stop at EOS (the EOS kept); the loop stops when every row has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pairlib import apply_rope, repeat_kv, rms_norm, rope_tables

TOP_K_CAP = 64


def _mlp(layer, x: torch.Tensor, eps: float) -> torch.Tensor:
    n = rms_norm(x, layer.post_attention_layernorm.weight, eps)
    return x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(n)) * layer.mlp.up_proj(n))


def next_tokens(logits: torch.Tensor, sample: bool, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] scores -> [B] token ids (argmax, or a top-64 nucleus draw)."""
    if not sample:
        return logits.argmax(-1)
    values, ids = logits.float().topk(min(TOP_K_CAP, logits.shape[-1]), dim=-1)  # sorted
    probs = torch.softmax(values / temperature, dim=-1)  # [B, 64]
    before = probs.cumsum(-1) - probs  # mass of the more probable ids
    probs = torch.where(before < top_p, probs, torch.zeros_like(probs))  # keeps >= 1 id
    choice = torch.multinomial(probs, 1, generator=generator)  # renormalizes
    return ids.gather(-1, choice)[:, 0]


@torch.no_grad()
def decode_batch(model, prompts: list[list[int]], *, new_tokens: int, eos_id: int, sample: bool,
                 temperature: float = 0.7, top_p: float = 0.95,
                 generator: torch.Generator | None = None) -> list[list[int]]:
    """The continuation of every prompt (through its EOS, or ``new_tokens`` long) by the HF
    ``LlamaForCausalLM`` ``model`` (its weights, in its dtype and device)."""
    m, cfg = model.model, model.config
    device, dtype = m.embed_tokens.weight.device, m.embed_tokens.weight.dtype
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    eps, groups, embed = cfg.rms_norm_eps, nh // nkv, m.embed_tokens.weight
    B, P = len(prompts), max(len(p) for p in prompts)
    S = P + new_tokens
    pads = torch.tensor([P - len(p) for p in prompts], device=device)  # [B]
    ids = torch.full((B, P), eos_id, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, P - len(p):] = torch.tensor(p)
    ids = ids.to(device)
    slots = torch.arange(S, device=device)
    valid = slots[None] >= pads[:, None]  # [B, S] non-padding slots (all decode slots)
    positions = (slots[None] - pads[:, None]).clamp(min=0)  # [B, S]
    cos_table, sin_table = rope_tables(torch.arange(S, device=device), hd, float(theta))
    cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]  # [B, 1, S, hd]
    K = torch.empty(len(m.layers), B, nkv, S, hd, device=device, dtype=dtype)
    V = torch.empty_like(K)

    # prefill: slots 0..P-1, causal over the row's own slots, a padding slot sees itself
    causal = slots[:P, None] >= slots[None, :P]  # [P, P]
    allowed = (causal[None] & valid[:, None, :P]) | torch.eye(P, dtype=torch.bool,
                                                              device=device)[None]
    allowed = allowed[:, None]  # [B, 1, P, P]
    x = F.embedding(ids, embed)  # [B, P, H]
    for li, layer in enumerate(m.layers):
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, eps)
        q = apply_rope(a.q_proj(h).view(B, P, nh, hd).transpose(1, 2), cos[:, :, :P],
                       sin[:, :, :P])
        k = apply_rope(a.k_proj(h).view(B, P, nkv, hd).transpose(1, 2), cos[:, :, :P],
                       sin[:, :, :P])
        v = a.v_proj(h).view(B, P, nkv, hd).transpose(1, 2)
        K[li, :, :, :P], V[li, :, :, :P] = k, v
        o = F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                           attn_mask=allowed)
        x = _mlp(layer, x + a.o_proj(o.transpose(1, 2).reshape(B, P, nh * hd)), eps)
    h = rms_norm(x[:, -1], m.norm.weight, eps)  # [B, H]
    token = next_tokens(h @ embed.t(), sample, temperature, top_p, generator)  # [B]

    out = [token]
    done = token == eos_id
    for step in range(1, new_tokens):
        slot = P + step - 1  # where `token` is written
        if step % 8 == 0 and bool(done.all()):
            break
        x = F.embedding(token[:, None], embed)  # [B, 1, H]
        c, s = cos[:, :, slot:slot + 1], sin[:, :, slot:slot + 1]
        mask = valid[:, None, None, :slot + 1]  # [B, 1, 1, slot + 1]
        for li, layer in enumerate(m.layers):
            a = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, eps)
            q = apply_rope(a.q_proj(h).view(B, 1, nh, hd).transpose(1, 2), c, s)
            K[li, :, :, slot:slot + 1] = apply_rope(
                a.k_proj(h).view(B, 1, nkv, hd).transpose(1, 2), c, s)
            V[li, :, :, slot:slot + 1] = a.v_proj(h).view(B, 1, nkv, hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(q.reshape(B, nkv, groups, hd),
                                               K[li, :, :, :slot + 1], V[li, :, :, :slot + 1],
                                               attn_mask=mask)  # [B, nkv, groups, hd]
            x = _mlp(layer, x + a.o_proj(o.reshape(B, 1, nh * hd)), eps)
        h = rms_norm(x[:, -1], m.norm.weight, eps)
        token = next_tokens(h @ embed.t(), sample, temperature, top_p, generator)
        out.append(token)
        done = done | (token == eos_id)
    rows = torch.stack(out, dim=1).tolist()  # [B, <= new_tokens]
    return [row[:row.index(eos_id) + 1] if eos_id in row else row for row in rows]
