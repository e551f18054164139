"""Loss curves of a SmolLM2 drafter training log as a PNG (matplotlib).

    python3 recipes/smollm2_drafter/plot_losses.py results/train_log.jsonl results/loss_curves.png

Two panels against training steps: the KL(target || drafter) of each unrolled chained step
(step 0 = the bootstrap), and the argmax agreement with the target of each step, teacher-forced
on the target's own continuations: lines on the training batch, dots joined by dashes on the
held-out validation batches (``kind: val`` records, where the log has them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(log_path: str, png_path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line]
    train = [r for r in rows if r.get("stage") == "drafter" and r.get("kind") == "train"]
    val = [r for r in rows if r.get("stage") == "drafter" and r.get("kind") == "val"]
    steps = [r["step"] for r in train]
    unroll = max(len(r["kl"]) for r in train)
    fig, (ax_kl, ax_agree) = plt.subplots(1, 2, figsize=(12, 4.5))
    for j in range(unroll):
        label = "step 0 (bootstrap)" if j == 0 else f"draft {j}"
        line, = ax_kl.plot(steps, [r["kl"][j] if j < len(r["kl"]) else None for r in train],
                           label=label, lw=1)
        ax_agree.plot(steps, [r["agree"][j] if j < len(r["agree"]) else None for r in train],
                      label=label, lw=1, color=line.get_color())
        if val:
            val_steps = [r["step"] for r in val]
            for ax, key in ((ax_kl, "val_kl"), (ax_agree, "val_agree")):
                ax.plot(val_steps, [r[key][j] if j < len(r[key]) else None for r in val],
                        "o--", ms=3, lw=0.8, color=line.get_color())
    ax_kl.set_yscale("log")
    ax_kl.set(xlabel="step", ylabel="KL(target || drafter), nats", title="chained KL per step")
    ax_agree.set(xlabel="step", ylabel="argmax agreement", ylim=(0, 1),
                 title="agreement with the target per step")
    for ax in (ax_kl, ax_agree):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
