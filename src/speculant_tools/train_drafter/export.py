"""What a run leaves in OUT: the drafter as the built-in ships it, the pair as a package, the
loss plot.

* ``drafter.npz`` (float16, keys exactly ``speculant_tools.export.drafter_shapes``, the shared
  table not included) and ``drafter_config.json`` (the keys
  ``speculant_tools.importers.read_drafter`` reads: ``scale``, ``max_proposal_width``,
  ``drafter_intermediate_size``, ``draft_vocab_size``, ``seed_feature_layers`` (``--features
  eagle3``: its projection ``drafter.seed_fusion.*`` is among the weights); then the trainer's
  notes): the two files
  ``src/speculant_tools/builtin/smollm2/`` holds.
* ``package/``: the target and that drafter written by ``write_checkpoint`` (float32, the
  static caches ``speculant import`` writes), which ``speculant generate OUT/package
  --speculative`` runs as it is; the drafter's weights are the float16 ones, widened back.
* ``loss_curves.png``: the training loss and the per-step agreement against steps, the
  validation loss as dots (matplotlib; skipped, and said so, where it is absent).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np

from speculant_tools.importers import Checkpoint, Drafter, write_checkpoint
from speculant_tools.train_drafter.errors import TrainDrafterError
from speculant_tools.train_drafter.source import TargetSource

MAX_PROPOSAL_WIDTH = 8


def drafter_files(out: Path, arrays: dict[str, np.ndarray], source: TargetSource,
                  head_rows: int, notes: dict,
                  seed_feature_layers: tuple[int, ...] | None = None
                  ) -> dict[str, np.ndarray]:
    """Write ``drafter.npz`` and ``drafter_config.json``; returns the float16 arrays.
    ``seed_feature_layers``: EAGLE-3's fused seed (its projection is in ``arrays``)."""
    half = {}
    for name, array in arrays.items():
        with np.errstate(over="ignore"):
            half[name] = array.astype(np.float16)
        if not np.isfinite(half[name]).all():
            raise TrainDrafterError("a drafter weight does not fit float16", path=name,
                                    remedy="train again with a lower --lr")
    np.savez_compressed(out / "drafter.npz", **half)
    config = source.config
    settings = {
        "format": "speculant chained drafter weights (speculant_tools.export.drafter_shapes)",
        "dtype": "float16",
        "scale": math.sqrt(config.hidden_size),
        "max_proposal_width": MAX_PROPOSAL_WIDTH,
        "drafter_intermediate_size": int(half["drafter.layer.mlp.up_proj.weight"].shape[0]),
        **({"draft_vocab_size": head_rows} if head_rows < config.vocab_size else {}),
        **({"seed_feature_layers": list(seed_feature_layers)} if seed_feature_layers else {}),
        "target": {"source": source.name, "config": json.loads(config.to_json())},
        "architecture": {
            "inputs_embeds": "concat(E[token] * scale, carry)",
            "borrowed_cache": f"the target's last layer ({config.num_hidden_layers - 1})",
            "carry_seed": "the target's hidden state after its final norm"
            if not seed_feature_layers else
            f"EAGLE-3's fused seed: norm(fc(concat(the residual streams entering layers "
            f"{list(seed_feature_layers)}, each normed))) ({config.num_hidden_layers}: the "
            "last layer's output), in the target's graph (fused_hidden_states)",
            "lm_head": f"the target's tied table, its first {head_rows} rows (not stored)",
        },
        "weights": {k: list(v.shape) for k, v in half.items()},
        **notes,
    }
    (out / "drafter_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return half


def write_pair(folder: Path, source: TargetSource, half: dict[str, np.ndarray],
               head_rows: int, seed_feature_layers: tuple[int, ...] | None = None) -> Path:
    """The pair package in ``folder`` (replaced where it exists); with
    ``seed_feature_layers`` the seed projection goes into the target's graph."""
    if folder.exists():
        shutil.rmtree(folder)
    checkpoint = Checkpoint(config=source.config, weights=source.weights,
                            tokenizer_json=source.tokenizer_json,
                            tokenizer_config=source.tokenizer_config, eos_id=source.eos_id,
                            source=source.name)
    drafter = Drafter(weights={k: v.astype(np.float32) for k, v in half.items()},
                      scale=math.sqrt(source.config.hidden_size),
                      max_proposal_width=MAX_PROPOSAL_WIDTH,
                      intermediate_size=int(half["drafter.layer.mlp.up_proj.weight"].shape[0]),
                      vocab_size=head_rows if head_rows < source.config.vocab_size else None,
                      seed_feature_layers=seed_feature_layers)
    return write_checkpoint(checkpoint, folder, dtype="float32", drafter=drafter,
                            cache="static")


def plot_losses(log_path: Path, png: Path) -> bool:
    """``loss_curves.png`` from ``train_log.jsonl``; False where matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train, val = [], []
    for line in log_path.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "train":
            train.append(record)
        elif record.get("kind") == "val":
            val.append(record)
    figure, (loss_axes, agree_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    marker = "." if len(train) < 20 else None  # a short run: its few points visible
    loss_axes.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, marker=marker,
                   label="training loss (weighted KL)")
    loss_axes.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o",
                   label="validation loss (held-out requests)")
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("loss")
    loss_axes.set_yscale("log")
    loss_axes.legend()
    steps = max((len(r["step_agree"]) for r in train), default=0)
    for j in range(steps):
        rows = [r for r in train if len(r["step_agree"]) > j]
        label = "bootstrap" if j == 0 else f"draft {j}"
        agree_axes.plot([r["step"] for r in rows], [r["step_agree"][j] for r in rows], lw=1,
                        marker=marker, label=label)
    agree_axes.set_xlabel("step")
    agree_axes.set_ylabel("argmax agreement with the target (training batch)")
    agree_axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)
    return True
