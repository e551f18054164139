"""The training loop: AdamW on :func:`objective.chained_loss`, a time budget, checkpoints.

    state = load_checkpoint(path, drafter, optimizer)        # or TrainingState()
    state = train(target, drafter, optimizer, corpus.train, state, ...)
    save_checkpoint(path, drafter, optimizer, state)

The checkpoint (``OUT/checkpoint/drafter.pt``) holds the drafter's float32 weights (and its
shape: MLP width, seed layers), the
optimizer's state (its two moments in bfloat16, which halves the file: ~32 MB for SmolLM2's
drafter; loading casts them back to float32) and the :class:`TrainingState` (steps, answer
tokens and seconds so far), so a resumed run continues the same optimization. The learning
rate warms up over the first ``warmup_steps`` steps of the whole training, then follows a
cosine from ``lr`` to ``lr / 10`` over this call's training budget (a resumed call starts
its own cosine). Batches: examples drawn in a seeded order that depends on the step reached,
16 batches at a time sorted by length (little padding).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speculant_tools.train_drafter.drafter import ChainedDrafter
from speculant_tools.train_drafter.llama import TorchLlama
from speculant_tools.train_drafter.objective import Batch, Objective, chained_loss

Log = Callable[[dict], None]
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's, kept in bfloat16 in the checkpoint


@dataclass
class TrainingState:
    steps: int = 0
    answer_tokens: int = 0  # answer positions seen, summed over steps
    seconds: float = 0.0  # training seconds, summed over calls
    calls: int = 0  # training calls that ran (a resume adds one)


def make_optimizer(drafter: ChainedDrafter, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)


def save_checkpoint(path: Path, drafter: ChainedDrafter, optimizer: torch.optim.Optimizer,
                    state: TrainingState) -> None:
    """Written beside and renamed into place: a killed run leaves the last whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".partial")
    optimizer_state = optimizer.state_dict()
    optimizer_state["state"] = {
        index: {name: value.to(torch.bfloat16) if name in MOMENTS else value
                for name, value in entry.items()}
        for index, entry in optimizer_state["state"].items()}
    torch.save({"drafter": drafter.state_dict(), "optimizer": optimizer_state,
                "state": asdict(state),
                "intermediate_size": drafter.intermediate_size,
                "seed_feature_layers": drafter.seed_feature_layers}, scratch)
    scratch.replace(path)


def load_checkpoint(path: Path, drafter: ChainedDrafter,
                    optimizer: torch.optim.Optimizer) -> TrainingState:
    saved = torch.load(path, map_location=drafter.norm.device, weights_only=True)
    drafter.load_state_dict(saved["drafter"])
    optimizer.load_state_dict(saved["optimizer"])
    return TrainingState(**saved["state"])


def checkpoint_shape(path: Path) -> tuple[int, tuple[int, ...] | None]:
    """The drafter MLP width and seed layers (None: the ``last`` seed) a checkpoint was saved
    with."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    layers = saved.get("seed_feature_layers")
    return int(saved["intermediate_size"]), tuple(layers) if layers is not None else None


def batches(examples: list[dict], batch_size: int, seed: int) -> Iterator[list[dict]]:
    """Endless batches of ``batch_size`` examples (fewer examples: all of them)."""
    size = min(batch_size, len(examples))
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        pool = 16 * size
        for start in range(0, len(order) - size + 1, pool):
            chunk = sorted(order[start:start + pool], key=lambda i: len(examples[i]["ids"]))
            groups = [chunk[i:i + size] for i in range(0, len(chunk), size)]
            for g in torch.randperm(len(groups), generator=generator).tolist():
                if len(groups[g]) == size:
                    yield [examples[i] for i in groups[g]]


def lr_at(step: int, progress: float, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def autocast(device: torch.device):
    """bfloat16 autocast on CUDA; nothing on the CPU (float32 throughout)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                          enabled=device.type == "cuda")


@torch.no_grad()
def validate(target: TorchLlama, drafter: ChainedDrafter, streams: list[dict],
             objective: Objective, batch_size: int) -> dict:
    """The loss on held-out streams: the weighted loss and the per-step KL and agreement,
    each the mean over batches."""
    device = target.embed.device
    was_training = drafter.training
    drafter.eval()
    losses, kls, agrees = [], [], []
    for start in range(0, len(streams), batch_size):
        batch = Batch.of(streams[start:start + batch_size], device)
        with autocast(device):
            parts = chained_loss(target, drafter, batch, objective)
        losses.append(float(parts.loss))
        kls.append(parts.step_kl)
        agrees.append(parts.step_agree)
    drafter.train(was_training)
    steps = min(len(k) for k in kls)
    return {"val_loss": sum(losses) / len(losses),
            "val_step_kl": [sum(k[j] for k in kls) / len(kls) for j in range(steps)],
            "val_step_agree": [sum(a[j] for a in agrees) / len(agrees) for j in range(steps)]}


def train(target: TorchLlama, drafter: ChainedDrafter, optimizer: torch.optim.Optimizer,
          examples: list[dict], state: TrainingState, objective: Objective, *, seconds: float,
          max_steps: int, batch_size: int, lr: float, warmup_steps: int, seed: int,
          validation: list[dict], validate_every: int, checkpoint: Callable[[], None],
          checkpoint_seconds: float, log: Log, progress: Callable[[float, dict], None]
          ) -> TrainingState:
    """Train ``drafter`` in place for ``seconds`` (and at most ``max_steps`` steps when > 0),
    continuing ``state``; ``checkpoint()`` every ``checkpoint_seconds`` and at the end."""
    device = target.embed.device
    drafter.train()
    stream = batches(examples, batch_size, seed + state.steps)
    start = last_checkpoint = counted_until = time.time()
    first_step = state.steps
    state.calls += 1
    while True:
        elapsed = time.time() - start
        done_steps = state.steps - first_step
        fraction = done_steps / max_steps if max_steps else 0.0
        fraction = max(fraction, elapsed / seconds if seconds > 0 else 1.0)
        if fraction >= 1.0:
            break
        batch = Batch.of(next(stream), device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.steps, fraction, lr, warmup_steps)
        with autocast(device):
            parts = chained_loss(target, drafter, batch, objective)
        optimizer.zero_grad(set_to_none=True)
        parts.loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0))
        optimizer.step()
        state.steps += 1
        state.answer_tokens += batch.num_answer_tokens
        record = {"kind": "train", "step": state.steps, "loss": float(parts.loss.detach()),
                  "step_kl": parts.step_kl, "step_agree": parts.step_agree,
                  "teacher_forced_kl": parts.teacher_forced_kl, "grad_norm": grad_norm,
                  "lr": optimizer.param_groups[0]["lr"], "answer_tokens": state.answer_tokens,
                  "train_seconds": round(state.seconds + time.time() - counted_until, 2)}
        if state.steps % 10 == 0 or done_steps == 0:
            log(record)
        if validation and state.steps % validate_every == 0:
            log({"kind": "val", "step": state.steps,
                 **validate(target, drafter, validation, objective, batch_size)})
        progress(fraction, record)
        if time.time() - last_checkpoint >= checkpoint_seconds:
            now = time.time()
            state.seconds, counted_until = state.seconds + now - counted_until, now
            checkpoint()
            last_checkpoint = time.time()
    state.seconds += time.time() - counted_until
    checkpoint()
    return state
