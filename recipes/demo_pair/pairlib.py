"""Models of the demo pair: the target's functional forward, the chained drafter, the draft model.

This module is the reference the ONNX exporter must agree with. Conventions (HF Llama):

* RMSNorm: ``w * (x32 * rsqrt(mean(x32**2, -1) + eps)).to(x.dtype)``, eps = 1e-5.
* RoPE (rotate-half, HF default): ``inv_freq[i] = theta ** (-2i / d)``, ``ang = pos * inv_freq``,
  ``cos = cos(cat(ang, ang))``, ``sin = sin(cat(ang, ang))``,
  ``rope(x) = x * cos + cat(-x[d/2:], x[:d/2]) * sin``; head_dim d = 32, theta = 10000.
* GQA: query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)`` (HF ``repeat_kv``).
* Attention scale ``1 / sqrt(head_dim)``; softmax over keys ``0..c`` (causal).

The chained drafter (Gemma-4-assistant pattern, cacheless), for a chain context at position c
(the last consumed position; every step uses position id c and the borrowed cache of extent c+1):

    fused   = concat(E[token] * sqrt(hidden), carry)          # [.., 2*hidden]
    x       = in_proj(fused)                                  # Linear(2H -> H), no bias
    x       = x + o_proj(attn(rope_c(q_proj(input_layernorm(x))), K_last[0..c], V_last[0..c]))
    x       = x + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(x)
    h       = norm(x)                                         # next carry
    logits  = h @ E^T                                         # tied, frozen LM head

``K_last``/``V_last`` are the target's LAST decoder layer's keys (after RoPE) and values, i.e. the
target's own KV cache of that layer. ``carry_0`` is the target's hidden state after its final
norm at position c (the ``folded_carry_seed``), and ``E`` the target's (tied) embedding table.
"""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- configs

TARGET_ARCH = dict(
    vocab_size=4096, hidden_size=192, num_hidden_layers=5, num_attention_heads=6,
    num_key_value_heads=2, head_dim=32, intermediate_size=512, max_position_embeddings=512,
    tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5, attention_bias=False,
    mlp_bias=False, hidden_act="silu",
)
DRAFT_ARCH = dict(
    vocab_size=4096, hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
    num_key_value_heads=1, head_dim=32, intermediate_size=256, max_position_embeddings=512,
    tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5, attention_bias=False,
    mlp_bias=False, hidden_act="silu",
)


def config_dict(arch: dict, eos_id: int) -> dict:
    """A version-neutral HF LlamaConfig dict: loads with ``LlamaConfig(**d)`` under transformers
    4.x (``rope_theta``) and 5.x (``rope_parameters``)."""
    d = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32"}
    d.update(arch)
    d.update(bos_token_id=None, eos_token_id=eos_id, pad_token_id=None, initializer_range=0.02,
             use_cache=True, attention_dropout=0.0, pretraining_tp=1,
             rope_scaling=None,
             rope_parameters={"rope_type": "default", "rope_theta": arch["rope_theta"]})
    return d


def hf_config(d: dict):
    from transformers import LlamaConfig

    kw = {k: v for k, v in d.items() if k not in ("architectures", "model_type", "torch_dtype")}
    try:
        cfg = LlamaConfig(**kw, attn_implementation="sdpa")
    except TypeError:  # pragma: no cover - very old transformers
        cfg = LlamaConfig(**kw)
    cfg.architectures = ["LlamaForCausalLM"]
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if float(theta) != float(d["rope_theta"]):
        raise RuntimeError(f"rope theta did not survive the config: {theta}")
    return cfg


def build_hf(d: dict):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(hf_config(d))
    model.tie_weights()
    return model


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """float32, contiguous, without the tied ``lm_head.weight``."""
    sd = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        sd[name] = t.detach().to("cpu", torch.float32).contiguous().clone()
    return sd


def load_hf(config_path, weights_path, device="cpu"):
    from safetensors.torch import load_file

    with open(config_path) as f:
        d = json.load(f)
    model = build_hf(d)
    missing, unexpected = model.load_state_dict(load_file(str(weights_path)), strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match the config: missing {missing}, "
                           f"unexpected {unexpected}")
    model.tie_weights()
    return model.to(device).eval(), d


# ----------------------------------------------------------------------------- primitives


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin of shape [len(positions), head_dim], float32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                        device=positions.device).float() / head_dim))
    ang = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, R, d]; cos/sin [R, d] or [B, 1, R, d]."""
    return (x * cos.to(x.dtype)) + (rotate_half(x) * sin.to(x.dtype))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


# ----------------------------------------------------------------------------- target


class TargetView:
    """Functional forward of an HF LlamaForCausalLM that also returns the last layer's KV.

    It reads the HF modules' weights (so it trains/loads nothing of its own) and never touches
    HF's cache objects or hidden-state plumbing, whose APIs move between versions.
    ``check()`` compares its logits with HF's own forward.
    """

    def __init__(self, model):
        self.model = model
        cfg = model.config
        self.H = cfg.hidden_size
        self.nh = cfg.num_attention_heads
        self.nkv = cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or self.H // self.nh
        self.eps = cfg.rms_norm_eps
        theta = getattr(cfg, "rope_theta", None)
        if theta is None:
            theta = cfg.rope_parameters["rope_theta"]
        self.theta = float(theta)

    @property
    def embed(self) -> torch.Tensor:
        return self.model.model.embed_tokens.weight

    def _attn_proj(self, layer, x, cos, sin):
        B, T, _ = x.shape
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, self.eps)
        q = a.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = a.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = a.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, layer, x, q, k, v, causal):
        B, T, _ = x.shape
        rep = self.nh // self.nkv
        o = F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep),
                                           is_causal=causal)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        x = x + layer.self_attn.o_proj(o)
        n = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
        return x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(n)) * layer.mlp.up_proj(n))

    def forward(self, ids: torch.Tensor, want_logits: bool = True):
        """ids [B, T] (positions 0..T-1) -> dict(h=[B,T,H] after the final norm,
        k, v = last layer's keys (post-RoPE) / values [B, nkv, T, hd], logits [B,T,V])."""
        m = self.model.model
        T = ids.shape[1]
        cos, sin = rope_tables(torch.arange(T, device=ids.device), self.hd, self.theta)
        x = m.embed_tokens(ids)
        k = v = None
        for layer in m.layers:
            q, k, v = self._attn_proj(layer, x, cos, sin)
            x = self._finish(layer, x, q, k, v, causal=True)
        h = rms_norm(x, m.norm.weight, self.eps)
        out = {"h": h, "k": k, "v": v}
        if want_logits:
            out["logits"] = h @ self.embed.t().to(h.dtype)
        return out

    __call__ = forward

    @torch.no_grad()
    def greedy(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        """Greedy continuation of n tokens with a per-layer KV cache -> [B, n]."""
        m = self.model.model
        B, P = ids.shape
        total = P + n
        cos_all, sin_all = rope_tables(torch.arange(total, device=ids.device), self.hd,
                                       self.theta)
        L = len(m.layers)
        dt = m.embed_tokens.weight.dtype
        K = torch.zeros(L, B, self.nkv, total, self.hd, device=ids.device, dtype=dt)
        V = torch.zeros_like(K)
        out = []
        cur, start = ids, 0
        rep = self.nh // self.nkv
        for _ in range(n):
            T = cur.shape[1]
            cos, sin = cos_all[start:start + T], sin_all[start:start + T]
            x = m.embed_tokens(cur)
            for li, layer in enumerate(m.layers):
                q, k, v = self._attn_proj(layer, x, cos, sin)
                K[li, :, :, start:start + T] = k
                V[li, :, :, start:start + T] = v
                kk, vv = K[li, :, :, :start + T], V[li, :, :, :start + T]
                if start == 0:
                    o = F.scaled_dot_product_attention(q, repeat_kv(kk, rep),
                                                       repeat_kv(vv, rep), is_causal=True)
                else:  # one query row at position start, keys 0..start
                    o = F.scaled_dot_product_attention(q, repeat_kv(kk, rep),
                                                       repeat_kv(vv, rep))
                o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
                x = x + layer.self_attn.o_proj(o)
                nn_ = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
                x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(nn_))
                                            * layer.mlp.up_proj(nn_))
            h = rms_norm(x[:, -1:], m.norm.weight, self.eps)
            nxt = (h @ self.embed.t().to(h.dtype)).argmax(-1)  # [B, 1]
            out.append(nxt)
            start += T
            cur = nxt
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def check(self, ids: torch.Tensor) -> float:
        """max |logits - HF logits| on ids (float32 expected ~1e-5)."""
        ref = self.model(input_ids=ids).logits.float()
        mine = self.forward(ids)["logits"].float()
        return float((ref - mine).abs().max())


# ----------------------------------------------------------------------------- drafter


class DrafterAttention(nn.Module):
    def __init__(self, H, nh, hd):
        super().__init__()
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)


class DrafterMLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, H, nh, hd, inter, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = DrafterAttention(H, nh, hd)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = DrafterMLP(H, inter)


class Drafter(nn.Module):
    """Saved with the prefix ``drafter.``: ``drafter.in_proj.weight`` [H, 2H],
    ``drafter.layer.{input_layernorm,post_attention_layernorm}.weight``,
    ``drafter.layer.self_attn.{q_proj,o_proj}.weight``,
    ``drafter.layer.mlp.{gate_proj,up_proj,down_proj}.weight``, ``drafter.norm.weight``."""

    def __init__(self, H=192, nh=6, nkv=2, hd=32, inter=512, eps=1e-5, theta=10000.0):
        super().__init__()
        self.H, self.nh, self.nkv, self.hd, self.eps, self.theta = H, nh, nkv, hd, eps, theta
        self.scale = math.sqrt(H)
        self.in_proj = nn.Linear(2 * H, H, bias=False)
        self.layer = DrafterLayer(H, nh, hd, inter, eps)
        self.norm = RMSNorm(H, eps)

    @torch.no_grad()
    def init_from_target(self, tv: TargetView, noise_std: float, generator=None):
        last = tv.model.model.layers[-1]
        self.layer.input_layernorm.weight.copy_(last.input_layernorm.weight)
        self.layer.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        self.layer.self_attn.q_proj.weight.copy_(last.self_attn.q_proj.weight)
        self.layer.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(self.layer.mlp, n).weight.copy_(getattr(last.mlp, n).weight)
        self.norm.weight.copy_(tv.model.model.norm.weight)
        w = torch.zeros(self.H, 2 * self.H)
        w[:, :self.H] = torch.randn(self.H, self.H, generator=generator) * noise_std
        w[:, self.H:] = torch.eye(self.H)
        self.in_proj.weight.copy_(w.to(self.in_proj.weight.device))

    def step(self, embed: torch.Tensor, tokens: torch.Tensor, carry: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             causal: bool) -> torch.Tensor:
        """One drafter invocation for R rows.

        tokens [B, R], carry [B, R, H]; cos/sin [R, hd] at each row's chain position c;
        k, v [B, nkv, S, hd]: the target's last-layer keys/values. With ``causal`` row r is the
        chain context at position r and sees keys 0..r (S == R); otherwise every row sees all S
        keys (one chain context of extent S). Returns the next carry h [B, R, H] (logits are
        ``h @ E^T``)."""
        B, R = tokens.shape
        e = F.embedding(tokens, embed) * self.scale
        x = self.in_proj(torch.cat([e.to(carry.dtype), carry], dim=-1))
        L = self.layer
        n = L.input_layernorm(x)
        q = L.self_attn.q_proj(n).view(B, R, self.nh, self.hd).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        rep = self.nh // self.nkv
        o = F.scaled_dot_product_attention(q, repeat_kv(k, rep).to(q.dtype),
                                           repeat_kv(v, rep).to(q.dtype), is_causal=causal)
        o = o.transpose(1, 2).reshape(B, R, self.nh * self.hd)
        x = x + L.self_attn.o_proj(o)
        x = x + L.mlp(L.post_attention_layernorm(x))
        return self.norm(x)

    def export_state(self) -> dict[str, torch.Tensor]:
        return {f"drafter.{k}": t.detach().to("cpu", torch.float32).contiguous().clone()
                for k, t in self.state_dict().items()}

    def load_export_state(self, sd: dict[str, torch.Tensor]):
        own = {k[len("drafter."):]: t for k, t in sd.items() if k.startswith("drafter.")}
        self.load_state_dict(own, strict=True)

    @classmethod
    def for_target(cls, tv: TargetView, inter: int) -> Drafter:
        """An untrained drafter of the shape the target ``tv`` dictates, with ``inter`` MLP
        units (the target's own width, or another: ``--drafter-inter``)."""
        c = tv.model.config
        return cls(H=c.hidden_size, nh=c.num_attention_heads, nkv=c.num_key_value_heads,
                   hd=tv.hd, inter=inter, eps=c.rms_norm_eps, theta=tv.theta)

    @classmethod
    def from_export_state(cls, sd: dict[str, torch.Tensor], tv: TargetView) -> Drafter:
        """The drafter saved by ``export_state``, for the target ``tv``, at its saved MLP
        width."""
        drafter = cls.for_target(tv, sd["drafter.layer.mlp.up_proj.weight"].shape[0])
        drafter.load_export_state(sd)
        return drafter


@torch.no_grad()
def widen_drafter_mlp(drafter: Drafter, inter: int, generator=None) -> Drafter:
    """A copy of ``drafter`` with ``inter`` (>= its own) MLP units and the same function: the
    trained units keep their rows and columns; each added unit gets ``gate``/``up`` rows drawn
    as ``nn.Linear`` draws them and a zero ``down_proj`` column (so it adds exactly 0 until
    trained)."""
    old = drafter.layer.mlp
    have, H = old.up_proj.weight.shape
    if inter < have:
        raise ValueError(f"cannot narrow the drafter's MLP from {have} to {inter} units")
    wide = Drafter(H=drafter.H, nh=drafter.nh, nkv=drafter.nkv, hd=drafter.hd, inter=inter,
                   eps=drafter.eps, theta=drafter.theta)
    own = {k: v for k, v in drafter.state_dict().items() if ".mlp." not in k}
    wide.load_state_dict(own, strict=False)
    bound = 1.0 / math.sqrt(H)
    for name in ("gate_proj", "up_proj"):
        w = torch.empty(inter, H).uniform_(-bound, bound, generator=generator)
        w[:have] = getattr(old, name).weight.detach().cpu()
        getattr(wide.layer.mlp, name).weight.copy_(w)
    down = torch.zeros(H, inter)
    down[:, :have] = old.down_proj.weight.detach().cpu()
    wide.layer.mlp.down_proj.weight.copy_(down)
    return wide


def drafter_reference_round(tv: TargetView, drafter: Drafter, context: list[int], pending: int,
                            k: int) -> list[int]:
    """The runtime's §9.4 loop for ONE chain context, written plainly (test oracle):
    seed s = context[-1], carry_0 = target h at c = len(context)-1, pending p, k drafts."""
    dev = tv.embed.device
    ids = torch.tensor([context], device=dev)
    st = tv(ids, want_logits=False)
    c = len(context) - 1
    cos, sin = rope_tables(torch.tensor([c], device=dev), drafter.hd, drafter.theta)
    carry = st["h"][:, c:c + 1]
    last, drafts = context[-1], []
    for j in range(k + 1):
        h = drafter.step(tv.embed, torch.tensor([[last]], device=dev), carry, cos, sin,
                         st["k"], st["v"], causal=False)
        carry = h
        if j == 0:
            last = pending
        else:
            d = int((h[0, -1] @ tv.embed.t().to(h.dtype)).argmax())
            drafts.append(d)
            last = d
    return drafts


# ----------------------------------------------------------------------------- acceptance


@torch.no_grad()
def chain_drafts_all_positions(tv: TargetView, drafter: Drafter, stream: torch.Tensor,
                               k: int, pending: torch.Tensor | None = None,
                               head: torch.Tensor | None = None) -> torch.Tensor:
    """For every position c of ``stream`` [B, T] (as the last consumed position), with pending
    token stream[c+1] (or ``pending[:, c]``), draft k tokens exactly as the runtime's round
    does. Vectorised over c: row c sees the target's last-layer KV of positions 0..c and uses
    position id c. ``head`` [N, H]: the LM head's rows (default: the whole table; a subset
    vocabulary: its first N rows, drafts < N). Returns drafts [B, T-1, k] (row c for
    c = 0..T-2)."""
    st = tv(stream, want_logits=False)
    B, T = stream.shape
    R = T - 1
    cos, sin = rope_tables(torch.arange(R, device=stream.device), drafter.hd, drafter.theta)
    E = tv.embed
    head = E if head is None else head
    k_, v_ = st["k"][:, :, :R], st["v"][:, :, :R]
    carry = st["h"][:, :R]
    last = stream[:, :R]
    drafts = []
    for j in range(k + 1):
        h = drafter.step(E, last, carry, cos, sin, k_, v_, causal=True)
        carry = h
        if j == 0:
            last = stream[:, 1:R + 1] if pending is None else pending[:, :R]
        else:
            d = (h @ head.t().to(h.dtype)).argmax(-1)
            drafts.append(d)
            last = d
    return torch.stack(drafts, dim=-1)


@torch.no_grad()
def draft_model_drafts(draft_model, contexts: dict[int, torch.Tensor],
                       k: int) -> dict[int, torch.Tensor]:
    """Draft-model proposer: from each context (consumed tokens + the pending token), k greedy
    tokens of the draft model (its own KV cache). {c: [B, c+2]} -> {c: [B, k]}."""
    view = TargetView(draft_model)
    return {c: view.greedy(ctx, k) for c, ctx in contexts.items()}


def leading_matches(drafts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """drafts, truth [..., k] -> number of leading equal entries [...]"""
    eq = (drafts == truth).int()
    return eq.cumprod(dim=-1).sum(dim=-1)


def summarize(pairs: list[tuple[int, int]], k: int) -> dict:
    """pairs: (k_r, a_r) of every round (same as recipes/demo_pair/demo_pair_report.py)."""
    rounds = [(kr, a) for kr, a in pairs if kr > 0]
    proposed = [sum(1 for kr, _ in rounds if kr > i) for i in range(k)]
    accepted = [sum(1 for kr, a in rounds if kr > i and a - 1 > i) for i in range(k)]
    return {
        "rounds": len(rounds),
        "mean_accepted_length": sum(a for _, a in rounds) / len(rounds) if rounds else None,
        "first_draft_acceptance": sum(a >= 2 for _, a in rounds) / len(rounds) if rounds else None,
        "acceptance_by_position": [a / p if p else None
                                   for a, p in zip(accepted, proposed, strict=True)],
    }


def simulate_greedy_runs(A: list[list[int]], prompt_len: int, new_tokens: int,
                         k: int) -> list[tuple[int, int]]:
    """A[b][c] = number of leading drafts (of 8) the target accepts from chain position c on
    prompt b's greedy stream. Replays the runtime's round loop (§13-§14) for max_new_tokens =
    new_tokens, width k, no EOS stop; returns the (k_r, a_r) trace."""
    pairs = []
    for Ab in A:
        n = 1  # prefill commits the first token (the pending token)
        while n < new_tokens:
            r = new_tokens - n
            kr = min(k, r - 1)
            if kr <= 0:
                n += 1
                continue
            c = prompt_len + n - 2
            a = 1 + min(kr, Ab[c])
            pairs.append((kr, a))
            n += a
    return pairs


@torch.no_grad()
def acceptance_report(tv: TargetView, prompts: list[list[int]], continuations: list[list[int]],
                      drafter: Drafter | None = None, draft_model=None, new_tokens: int = 64,
                      kmax: int = 8) -> dict:
    """Acceptance at k = 1..kmax on the val prompts. The first two follow
    recipes/demo_pair/demo_pair_report.py:

    * greedy_continuations: the runtime's round loop decoding ``new_tokens`` tokens from each
      prompt; drafts verified against the target's greedy stream.
    * real_text: teacher-forced on prompt + real continuation: for every c in
      [P-1, len-2-k), chain context at c, pending = x[c+1], a = 1 + leading drafts equal to
      the REAL tokens x[c+2..].
    * real_context: the runtime's round on a real-text context: for every c in [P-1, len-2-k),
      context x[0..c], pending = the target's argmax at c, a = 1 + leading drafts equal to the
      target's own greedy continuation of x[0..c] (what a round of the runtime accepts there).
    """
    dev = tv.embed.device
    P = len(prompts[0])
    assert all(len(p) == P for p in prompts)
    prompt_t = torch.tensor(prompts, device=dev)
    real = torch.cat([prompt_t, torch.tensor(continuations, device=dev)], 1)
    greedy = torch.cat([prompt_t, tv.greedy(prompt_t, new_tokens)], dim=1)
    if greedy.shape != real.shape:
        raise ValueError("new_tokens must equal the continuation length")
    B, T = real.shape
    rows = list(range(P - 1, T - 2))
    # the target's greedy rollouts from each real context: [B, kmax + 1] per row
    rollout = {c: tv.greedy(real[:, :c + 1], kmax + 1) for c in rows}
    pend_real = torch.zeros(B, T - 1, dtype=real.dtype, device=dev)
    for c in rows:
        pend_real[:, c] = rollout[c][:, 0]
    pad = torch.full((B, kmax + 2), -1, device=dev, dtype=real.dtype)
    cases = {
        "greedy_continuations": (greedy, None,
                                 {c: torch.cat([greedy, pad], 1)[:, c + 2:c + 2 + kmax]
                                  for c in rows}),
        "real_text": (real, None,
                      {c: torch.cat([real, pad], 1)[:, c + 2:c + 2 + kmax] for c in rows}),
        "real_context": (real, pend_real, {c: rollout[c][:, 1:] for c in rows}),
    }
    proposers = []
    if drafter is not None:
        proposers.append(("drafter", drafter))
    if draft_model is not None:
        proposers.append(("draft_model", draft_model))
    report = {}
    for pname, prop in proposers:
        rep = {}
        for sname, (stream, pending, truth) in cases.items():
            if pname == "drafter":
                D = chain_drafts_all_positions(tv, prop, stream, kmax, pending)
                drafts = {c: D[:, c] for c in rows}
            else:
                if pending is None:
                    ctxs = {c: stream[:, :c + 2] for c in rows}
                else:
                    ctxs = {c: torch.cat([stream[:, :c + 1], pending[:, c:c + 1]], 1)
                            for c in rows}
                drafts = draft_model_drafts(prop, ctxs, kmax)
            A = {c: leading_matches(drafts[c], truth[c]).tolist() for c in rows}
            out = {}
            for k in range(1, kmax + 1):
                if sname == "greedy_continuations":
                    Ab = [{c: A[c][b] for c in rows} for b in range(B)]
                    pairs = simulate_greedy_runs(Ab, P, new_tokens, k)
                else:
                    pairs = [(k, 1 + min(k, A[c][b])) for c in range(P - 1, T - 2 - k)
                             for b in range(B)]
                out[str(k)] = summarize(pairs, k)
            rep[sname] = out
        report[pname] = rep
    return report
