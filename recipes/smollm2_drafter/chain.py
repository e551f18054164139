"""Training and measuring the chained drafter on the target's own continuations.

The drafter is ``recipes/demo_pair/pairlib.Drafter`` (the reference the ONNX exporter
matches). A training example is one chat sequence ``prompt + continuation`` (the target's own
greedy or sampled output); a chain context is every position ``c`` of the continuation side
(``c >= prompt_len - 1``), the rows of one batch vectorised as the demo pair does:

    step 0 (bootstrap): token x[c],   carry = the target's final-norm hidden h[c]
                        -> trained toward the target's p(. | x[..c])
    step j = 1..U-1:    token x[c+j], carry = the drafter's own output of step j-1
                        -> trained toward the target's p(. | x[..c+j])

every step at position id ``c`` reading the target's last-layer KV of positions ``0..c``
(causal rows), exactly as the runtime's round drives it (docs/design/spec/runtime.md §9.4: the seed token, then
the pending token, then its own drafts; on the target's greedy stream the pending token and
every accepted draft are ``x[c+1..]``).

The drafter's LM head is ``E[:N]``, the target table's first ``N = head_rows`` rows (a subset
vocabulary; N = V: all of them). Loss per step: forward KL(p_N || q) with ``p_N`` the target's
distribution restricted to the first N ids and renormalized (``log_softmax`` of the target's
first N logits): the drafter can put mass nowhere else, and the restriction keeps the order of
those ids, so wherever the target's greedy token is < N (the only place a draft can be
accepted) ``argmax p_N`` is that token. The steps are weighted (``step_weights``, normalized
over the steps a batch reaches), gradients through the carry chain.

Acceptance (``acceptance``) replays the runtime's round loop on greedy continuations.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from pairlib import (
    Drafter,
    TargetView,
    chain_drafts_all_positions,
    leading_matches,
    rope_tables,
    summarize,
)


def pad_batch(seqs: list[list[int]], device, multiple: int = 64) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    width = ((width + multiple - 1) // multiple) * multiple
    out = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s)
    return out.to(device)


def shifted(ids: torch.Tensor, j: int) -> torch.Tensor:
    """ids[:, c + j] at column c (zeros past the end)."""
    if j == 0:
        return ids
    return torch.cat([ids[:, j:], torch.zeros_like(ids[:, :j])], dim=1)


def step_weights(unroll: int, decay: float, bootstrap: float) -> list[float]:
    """Loss weight per chained step: ``bootstrap`` for step 0 (its prediction is never a
    draft, its output is the first draft's carry), ``decay ** (j - 1)`` for draft j >= 1."""
    return [bootstrap] + [decay ** (j - 1) for j in range(1, unroll)]


def chain_loss(tv: TargetView, drafter: Drafter, ids: torch.Tensor, prompt_lens: torch.Tensor,
               lens: torch.Tensor, weights: list[float], head_rows: int
               ) -> tuple[torch.Tensor, list[float], list[float]]:
    """The weighted mean over ``len(weights)`` chained steps of KL(p_N || q) on one batch
    (N = ``head_rows``, see the module docstring).

    ids [B, T] long; prompt_lens, lens [B] long. Returns (loss, kl per step, argmax agreement
    per step: the drafter's argmax equals the target's restricted argmax)."""
    B, T = ids.shape
    E = tv.embed
    head = E[:head_rows]  # [N, H]: the drafter's LM head, the table's first N rows
    with torch.no_grad():
        st = tv(ids, want_logits=False)
        pos = torch.arange(T, device=ids.device)[None]
        # positions t whose target distribution is a teacher: continuation side, next token known
        is_teacher = (pos >= prompt_lens[:, None] - 1) & (pos <= lens[:, None] - 2)  # [B, T]
        row_of = torch.cumsum(is_teacher.flatten(), 0).view(B, T) - 1
        teacher = F.log_softmax((st["h"][is_teacher] @ head.t()).float(), dim=-1)  # [R, N]
        teacher_top = teacher.argmax(-1)
    cos, sin = rope_tables(torch.arange(T, device=ids.device), drafter.hd, drafter.theta)
    carry = st["h"]
    losses, used, kls, agree = [], [], [], []
    for j, weight in enumerate(weights):
        h = drafter.step(E, shifted(ids, j), carry, cos, sin, st["k"], st["v"], causal=True)
        carry = h
        rows = (pos >= prompt_lens[:, None] - 1) & shifted(is_teacher, j)
        if not bool(rows.any()):
            break
        logq = F.log_softmax((h[rows] @ head.t().to(h.dtype)).float(), dim=-1)  # [r, N]
        target_rows = shifted(row_of, j)[rows]
        kl = F.kl_div(logq, teacher[target_rows], log_target=True, reduction="batchmean")
        losses.append(kl * weight)
        used.append(weight)
        kls.append(float(kl.detach()))
        agree.append(float((logq.detach().argmax(-1) == teacher_top[target_rows]).float().mean()))
    return torch.stack(losses).sum() / sum(used), kls, agree


def lr_at(progress: float, step: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def batches(examples: list[dict], batch_size: int, generator: torch.Generator):
    """Endless batches; each pool of 16 batches is sorted by length (little padding)."""
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        pool = 16 * batch_size
        for start in range(0, len(order) - batch_size + 1, pool):
            chunk = sorted(order[start:start + pool], key=lambda i: len(examples[i]["ids"]))
            groups = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
            for g in torch.randperm(len(groups), generator=generator).tolist():
                if len(groups[g]) == batch_size:
                    yield [examples[i] for i in groups[g]]


@torch.no_grad()
def validate(tv: TargetView, drafter: Drafter, batches: list[list[dict]], weights: list[float],
             head_rows: int, device, autocast: bool) -> dict:
    """The chained loss on held-out batches (no gradients): the weighted loss, and the KL
    and the agreement per step, each the mean over the batches."""
    dtype = torch.bfloat16 if autocast else torch.float32
    was_training = drafter.training
    drafter.eval()
    losses, kls, agree = [], [], []
    for batch in batches:
        ids = pad_batch([e["ids"] for e in batch], device)
        prompt_lens = torch.tensor([e["prompt_len"] for e in batch], device=device)
        lens = torch.tensor([len(e["ids"]) for e in batch], device=device)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=autocast):
            loss, step_kls, step_agree = chain_loss(tv, drafter, ids, prompt_lens, lens, weights,
                                                    head_rows)
        losses.append(float(loss))
        kls.append(step_kls)
        agree.append(step_agree)
    drafter.train(was_training)
    steps = min(len(k) for k in kls)
    return {"val_loss": sum(losses) / len(losses),
            "val_kl": [sum(k[j] for k in kls) / len(kls) for j in range(steps)],
            "val_agree": [sum(a[j] for a in agree) / len(agree) for j in range(steps)]}


def train(tv: TargetView, drafter: Drafter, examples: list[dict], *, seconds: float,
          max_steps: int, batch_size: int, lr: float, warmup: int, weights: list[float],
          head_rows: int, seed: int, log, device, autocast: bool,
          val_batches: list[list[dict]] = (), val_every: int = 0) -> dict:
    """Train ``drafter`` in place for ``seconds`` (or ``max_steps`` when > 0; the LR schedule
    follows whichever is the budget). ``log(dict)`` receives one line per logged step, and
    every ``val_every`` steps (and after the last) the held-out loss of ``val_batches``."""
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    stream = batches(examples, batch_size, gen)
    start, step, tokens = time.time(), 0, 0
    dtype = torch.bfloat16 if autocast else torch.float32
    while True:
        elapsed = time.time() - start
        progress = step / max_steps if max_steps else elapsed / seconds
        if progress >= 1.0:
            break
        batch = next(stream)
        ids = pad_batch([e["ids"] for e in batch], device)
        prompt_lens = torch.tensor([e["prompt_len"] for e in batch], device=device)
        lens = torch.tensor([len(e["ids"]) for e in batch], device=device)
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, step, lr, warmup)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=autocast):
            loss, kls, agree = chain_loss(tv, drafter, ids, prompt_lens, lens, weights,
                                          head_rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0))
        opt.step()
        tokens += int((lens - prompt_lens).sum())
        step += 1
        if step % 10 == 0 or step == 1:
            log({"stage": "drafter", "kind": "train", "step": step, "loss": float(loss.detach()),
                 "kl": kls, "agree": agree, "grad_norm": grad_norm,
                 "lr": opt.param_groups[0]["lr"], "continuation_tokens": tokens,
                 "train_seconds": round(time.time() - start, 2)})
        if val_batches and val_every and step % val_every == 0:
            log({"stage": "drafter", "kind": "val", "step": step,
                 **validate(tv, drafter, val_batches, weights, head_rows, device, autocast)})
    result = {"steps": step, "continuation_tokens": tokens,
              "seconds": round(time.time() - start, 2)}
    if val_batches:
        final = validate(tv, drafter, val_batches, weights, head_rows, device, autocast)
        log({"stage": "drafter", "kind": "val", "step": step, **final})
        result["validation"] = final
    return result


def simulate_rounds(accepted: list[int], prompt_len: int, continuation_len: int,
                    max_new_tokens: int, k: int) -> list[tuple[int, int]]:
    """The runtime's round loop (§13-§14) over one greedy stream: ``accepted[c]`` = how many
    leading drafts (of 8) the target accepts from chain position ``c``; the stream ends at
    ``continuation_len`` committed tokens (EOS, or the cap). Returns (k_r, a_r) per round."""
    pairs, n = [], 1  # prefill commits the pending token
    while n < min(continuation_len, max_new_tokens):
        kr = min(k, max_new_tokens - n - 1)
        if kr <= 0:
            n += 1
            continue
        a = 1 + min(kr, accepted[prompt_len + n - 2])
        pairs.append((kr, a))
        n += a
    return pairs


@torch.no_grad()
def acceptance(tv: TargetView, drafter: Drafter, streams: list[dict], max_new_tokens: int,
               head_rows: int, kmax: int = 8, batch_size: int = 16) -> dict:
    """Mean accepted length, first-draft acceptance and acceptance by position at k = 1..kmax
    on greedy streams (``{"ids", "prompt_len"}``: prompt + the target's greedy continuation,
    ending at EOS or after ``max_new_tokens``); drafts are argmaxes over the first
    ``head_rows`` ids, accepted only where equal to the stream (so a token >= N never is).
    Also ``greedy_consistency``: the share of continuation positions where the teacher-forced
    argmax equals the stream's next token, and ``stream_coverage``: the share of stream
    tokens < N (the bound on first-draft acceptance)."""
    device = tv.embed.device
    accepted_all, consistent, total, covered = [], 0, 0, 0
    for start in range(0, len(streams), batch_size):
        group = streams[start:start + batch_size]
        ids = pad_batch([s["ids"] for s in group], device, multiple=8)
        width = ids.shape[1]
        drafts = chain_drafts_all_positions(tv, drafter, ids, kmax,
                                            head=tv.embed[:head_rows])  # [B, T-1, kmax]
        logits = tv(ids)["logits"]
        for b, s in enumerate(group):
            length, plen = len(s["ids"]), s["prompt_len"]
            truth = torch.full((width + kmax + 2,), -1, dtype=torch.long, device=device)
            truth[:length] = ids[b, :length]
            cols = torch.arange(width - 1, device=device)
            window = truth[cols[:, None] + 2 + torch.arange(kmax, device=device)[None]]
            accepted_all.append((leading_matches(drafts[b], window).tolist(), plen,
                                 length - plen))
            top = logits[b, plen - 1:length - 1].argmax(-1)
            consistent += int((top == ids[b, plen:length]).sum())
            covered += int((ids[b, plen:length] < head_rows).sum())
            total += length - plen
    report = {"streams": len(streams), "greedy_consistency": consistent / max(total, 1),
              "continuation_tokens": total, "stream_coverage": covered / max(total, 1)}
    for k in (1, 2, 3, 4, 5, 6, 7, 8):
        if k > kmax:
            break
        pairs = []
        for accepted, plen, clen in accepted_all:
            pairs += simulate_rounds(accepted, plen, clen, max_new_tokens, k)
        report[str(k)] = summarize(pairs, k)
    return report
