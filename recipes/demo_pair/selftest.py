#!/usr/bin/env python3
"""Consistency checks of a trained demo pair against plain, unvectorised re-implementations.

    python3 recipes/demo_pair/selftest.py DIR [--prompts 4] [--k 3] [--device cpu]

1. The functional target forward (pairlib.TargetView) equals transformers' own logits, and its
   cached greedy decode equals transformers' full-recompute greedy.
2. The vectorised chain (all positions at once, as trained and evaluated) equals the plain
   runtime loop of docs/design/spec/runtime.md §9.4 on single contexts.
3. The acceptance figures of a greedy run (pairlib.simulate_greedy_runs) equal a brute-force
   speculative decode: rounds of drafter_reference_round + a full target pass for
   verification, committing a tokens per round, as docs/design/spec/runtime.md §10-§14 do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pairlib  # noqa: E402
import torch  # noqa: E402


def load(dir_: Path, device: str):
    from safetensors.torch import load_file

    target, _ = pairlib.load_hf(dir_ / "target_config.json", dir_ / "target.safetensors", device)
    tv = pairlib.TargetView(target)
    drafter = pairlib.Drafter.from_export_state(load_file(str(dir_ / "drafter.safetensors")), tv)
    return target, tv, drafter.to(device).eval()


@torch.no_grad()
def brute_force_trace(target, tv, drafter, prompt: list[int], new_tokens: int, k: int):
    """Speculative greedy decode, one round at a time, full recompute: (k_r, a_r) trace and
    the generated tokens."""
    dev = tv.embed.device

    def argmaxes(ids):
        return target(input_ids=torch.tensor([ids], device=dev)).logits[0].argmax(-1).tolist()

    gen = [argmaxes(prompt)[-1]]  # prefill commits the pending token
    trace = []
    while len(gen) < new_tokens:
        r = new_tokens - len(gen)
        kr = min(k, r - 1)
        if kr <= 0:
            gen.append(argmaxes(prompt + gen)[-1])
            continue
        consumed = prompt + gen[:-1]
        drafts = pairlib.drafter_reference_round(tv, drafter, consumed, gen[-1], kr)
        block = [gen[-1]] + drafts
        t = argmaxes(consumed + block)[len(consumed):]  # t[i] after consuming block[0..i]
        a = 1
        while a <= kr and block[a] == t[a - 1]:
            a += 1
        gen += block[1:a] + [t[a - 1]]
        trace.append((kr, a))
    return trace, gen[:new_tokens]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    target, tv, drafter = load(args.dir, args.device)
    items = json.loads((args.dir / "val_prompts.json").read_text())["prompts"][:args.prompts]
    prompts = [it["prompt"] for it in items]
    ok = True
    dev = tv.embed.device
    P = torch.tensor(prompts, device=dev)

    d = tv.check(P)
    cur = P.clone()
    with torch.no_grad():
        for _ in range(16):
            nxt = target(input_ids=cur).logits[:, -1].argmax(-1, keepdim=True)
            cur = torch.cat([cur, nxt], 1)
    same = torch.equal(cur[:, P.shape[1]:], tv.greedy(P, 16))
    print(f"1. functional forward max|dlogits| = {d:.2e}; cached greedy == HF greedy: {same}")
    ok &= d < 1e-3 and same

    stream = torch.cat([P, torch.tensor([it["continuation"] for it in items], device=dev)], 1)
    D = pairlib.chain_drafts_all_positions(tv, drafter, stream, 8)
    n = bad = 0
    for b in range(len(prompts)):
        for c in range(P.shape[1] - 1, stream.shape[1] - 2, 7):
            ref = pairlib.drafter_reference_round(tv, drafter, stream[b, :c + 1].tolist(),
                                                  int(stream[b, c + 1]), 8)
            n += 1
            bad += ref != D[b, c].tolist()
    print(f"2. vectorised chain == §9.4 loop: {n - bad}/{n} contexts")
    ok &= bad == 0

    greedy = torch.cat([P, tv.greedy(P, args.new_tokens)], 1)
    Dg = pairlib.chain_drafts_all_positions(tv, drafter, greedy, 8)
    pad = torch.full((len(prompts), 10), -1, device=dev, dtype=greedy.dtype)
    gp = torch.cat([greedy, pad], 1)
    A = [{c: int(pairlib.leading_matches(Dg[b, c], gp[b, c + 2:c + 10]))
          for c in range(greedy.shape[1] - 1)} for b in range(len(prompts))]
    sim = pairlib.simulate_greedy_runs(A, P.shape[1], args.new_tokens, args.k)
    brute, same_tokens = [], True
    for b, p in enumerate(prompts):
        tr, gen = brute_force_trace(target, tv, drafter, p, args.new_tokens, args.k)
        brute += tr
        same_tokens &= gen == greedy[b, P.shape[1]:].tolist()
    print(f"3. greedy-run simulation == brute-force speculative decode (k={args.k}): "
          f"{sim == brute} ({len(brute)} rounds, mean a "
          f"{sum(a for _, a in brute) / max(1, len(brute)):.3f}); "
          f"speculative tokens == greedy tokens: {same_tokens}")
    ok &= sim == brute and same_tokens
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
