"""Acceptance of a chained pair on validation prompts, written as JSON.

    uv run --extra cpu python recipes/demo_pair/demo_pair_report.py PACKAGE OUT_JSON [--tokens 64]
        [--device cpu] [--prompts FILE]

Two measurements, each at k = 1 … 8:

* **greedy continuations** — the runtime as it runs: speculative decode of N tokens from each
  prompt; the drafts are verified against the target's own greedy stream.
* **real held-out text** — teacher-forced on the real continuation: for every position c of
  ``prompt + continuation`` the chain context is taken from one target pass over the real text
  (keep = c + 1, cells cut to c + 1, pending token = the real x[c+1]), the proposer drafts k
  tokens exactly as in a round, and a = 1 + the number of leading drafts equal to the real
  tokens x[c+2 …].

Reported: mean accepted length (mean of a, tokens committed per target pass), first-draft
acceptance (share of rounds with a >= 2) and acceptance by draft position.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import speculant
from speculant.workflow.state import DecodeState

MAX_WIDTH = 8


def summarize(pairs: list[tuple[int, int]], k: int) -> dict:
    """pairs: (k_r, a_r) of every round."""
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


def widths(engine) -> range:
    return range(1, min(MAX_WIDTH, engine.package.plan.rollback_bound or 0) + 1)


def greedy_continuations(engine, prompts, tokens: int) -> dict:
    report = {}
    for k in widths(engine):
        pairs: list[tuple[int, int]] = []
        for prompt in prompts:
            run = engine.generate(prompt, tokens, speculative=True, k=k, stop_on_eos=False)
            pairs += run.stats.trace
        report[str(k)] = summarize(pairs, k)
    return report


def real_text(engine, items) -> dict:
    plan, seam = engine.package.plan, engine.seam
    pairs = {k: [] for k in widths(engine)}
    for prompt, continuation in items:
        text = list(prompt) + list(continuation)
        start = engine.admit(list(text), 1)  # admitted (the context cap applies), no pass yet
        vp = engine.target.run(text, 0, start.cells, start.admitted, start.controls)
        for k in widths(engine):
            for c in range(len(prompt) - 1, len(text) - 2 - k):
                state = DecodeState.after_pass(seam, plan, start.admitted, text[:c + 2], vp,
                                               num_kept=c + 1)
                drafts = engine.proposer.propose(state, k).tokens
                a = 1
                while a <= k and drafts[a - 1] == text[c + 1 + a]:
                    a += 1
                pairs[k].append((k, a))
    return {str(k): summarize(pairs[k], k) for k in widths(engine)}


def load_prompts(path: Path) -> list[tuple[list[int], list[int]]]:
    data = json.loads(path.read_text())
    items = data["prompts"] if isinstance(data, dict) else data
    return [(item["prompt"], item.get("continuation", [])) for item in items]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("package", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--prompts", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    engine = speculant.load(args.package, args.device)
    items = load_prompts(args.prompts or args.package / "val_prompts.json")
    started = time.perf_counter()
    report = {
        "package": str(args.package), "device": args.device,
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "python recipes/demo_pair/demo_pair_report.py " + " ".join(
            [str(args.package), str(args.out), f"--tokens {args.tokens}",
             f"--device {args.device}"]),
        "num_prompts": len(items), "new_tokens": args.tokens,
        "greedy_continuations": greedy_continuations(engine, [p for p, _ in items], args.tokens),
        "real_text": real_text(engine, [(p, c) for p, c in items if c]),
    }
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(report, indent=2))
    for mode in ("greedy_continuations", "real_text"):
        k4 = report[mode]["4"]
        print(mode, "k=4 mean accepted length", k4["mean_accepted_length"],
              "first-draft acceptance", k4["first_draft_acceptance"])


if __name__ == "__main__":
    main()
