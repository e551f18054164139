"""The ``speculant train-drafter`` command (registered by ``speculant_tools.cli``); its
defaults are :class:`TrainOptions`' own. PyTorch is imported only when the command runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from speculant.cli import fail, stderr
from speculant.errors import SpeculantError
from speculant_tools.train_drafter.errors import TrainDrafterError
from speculant_tools.train_drafter.options import TrainOptions

DEFAULTS = TrainOptions()


def train_drafter_command(
    package: Annotated[str, typer.Argument(help="The target: the built-in smollm2, a Llama "
                                                "GGUF, a Hugging Face checkpoint folder, or a "
                                                "package written by speculant import.")],
    out: Annotated[Path, typer.Argument(help="Folder for the corpus, the checkpoint, the "
                                             "report, the plot and the pair package "
                                             "(OUT/package).")],
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = DEFAULTS.device,
    minutes: Annotated[float, typer.Option(help="This call's wall-clock budget, export "
                                                "included.")] = DEFAULTS.minutes,
    resume: Annotated[bool, typer.Option(help="Continue OUT's checkpoint (OUT's corpus is "
                                              "always reused).")] = DEFAULTS.resume,
    num_requests: Annotated[int, typer.Option(help="User requests sampled from the chat "
                                                   "template's user turn.")]
    = DEFAULTS.num_requests,
    request_tokens: Annotated[int, typer.Option(help="The longest request.")]
    = DEFAULTS.request_tokens,
    keep_unfinished_requests: Annotated[bool, typer.Option(
        help="Keep requests cut off at --request-tokens.")] = DEFAULTS.keep_unfinished_requests,
    held_out_fraction: Annotated[float, typer.Option(help="Requests held out (with their "
                                                          "answers).")]
    = DEFAULTS.held_out_fraction,
    answer_tokens: Annotated[int, typer.Option(help="The longest training answer.")]
    = DEFAULTS.answer_tokens,
    sampled_passes: Annotated[int, typer.Option(help="Sampled answers to every request, "
                                                     "after the greedy one.")]
    = DEFAULTS.sampled_passes,
    generation_batch: Annotated[int, typer.Option(help="Prompts decoded at once.")]
    = DEFAULTS.generation_batch,
    data_share: Annotated[float, typer.Option(help="Share of --minutes the corpus may take.")]
    = DEFAULTS.data_share,
    grow_corpus: Annotated[bool, typer.Option(
        help="With --resume: answer the training requests an earlier call's data budget left "
             "(within --data-share).")] = DEFAULTS.grow_corpus,
    num_eval: Annotated[int, typer.Option(help="Held-out requests that measure acceptance.")]
    = DEFAULTS.num_eval,
    eval_tokens: Annotated[int, typer.Option(help="Tokens of each held-out greedy stream.")]
    = DEFAULTS.eval_tokens,
    draft_vocab_size: Annotated[int, typer.Option(help="The drafter scores ids below N "
                                                       "(0: all).")]
    = DEFAULTS.draft_vocab_size,
    drafter_intermediate_size: Annotated[int, typer.Option(help="The drafter's MLP width "
                                                                "(0: the target's).")]
    = DEFAULTS.drafter_intermediate_size,
    features: Annotated[str, typer.Option(help="The drafter's carry seed: last (the target's "
                                               "final hidden state) or eagle3 (its low, middle "
                                               "and high layers fused; the projection goes "
                                               "into the target's graph).")]
    = DEFAULTS.features,
    unroll: Annotated[int, typer.Option(help="Chained steps trained: the bootstrap and "
                                             "unroll - 1 drafts.")] = DEFAULTS.unroll,
    teacher_forcing_weight: Annotated[float, typer.Option(help="Weight of the teacher-forced "
                                                               "step (0: none).")]
    = DEFAULTS.teacher_forcing_weight,
    batch_size: Annotated[int, typer.Option(help="Sequences a training step.")]
    = DEFAULTS.batch_size,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = DEFAULTS.lr,
    max_steps: Annotated[int, typer.Option(help="At most this many steps in this call "
                                                "(0: the budget decides).")]
    = DEFAULTS.max_steps,
    validate_every: Annotated[int, typer.Option(help="Steps between validation losses.")]
    = DEFAULTS.validate_every,
    reserve_seconds: Annotated[float, typer.Option(help="Seconds kept after training for the "
                                                        "evaluation and the export.")]
    = DEFAULTS.reserve_seconds,
    write_package: Annotated[bool, typer.Option(help="Write the pair as OUT/package.")]
    = DEFAULTS.write_package,
    seed: Annotated[int, typer.Option(help="Seed of the sampling and the initialization.")]
    = DEFAULTS.seed,
) -> None:
    """Train a chained drafter for a Llama target on requests it writes itself; write the
    pair as OUT/package (needs the train extra: PyTorch)."""
    from speculant_tools.train_drafter import train_drafter

    options = TrainOptions(
        device=device, minutes=minutes, resume=resume, seed=seed, num_requests=num_requests,
        request_tokens=request_tokens, keep_unfinished_requests=keep_unfinished_requests,
        held_out_fraction=held_out_fraction, answer_tokens=answer_tokens,
        sampled_passes=sampled_passes, generation_batch=generation_batch,
        data_share=data_share, grow_corpus=grow_corpus, num_eval=num_eval,
        eval_tokens=eval_tokens,
        draft_vocab_size=draft_vocab_size, drafter_intermediate_size=drafter_intermediate_size,
        features=features, unroll=unroll, teacher_forcing_weight=teacher_forcing_weight,
        batch_size=batch_size,
        lr=lr, max_steps=max_steps, validate_every=validate_every,
        reserve_seconds=reserve_seconds, write_package=write_package)
    try:
        if importlib.util.find_spec("torch") is None:
            raise TrainDrafterError("PyTorch is not installed", path="torch",
                                    remedy="pip install 'speculant[train]' (on a machine "
                                           "without a GPU, torch's CPU build first)")
        report = train_drafter(package, out, options, console=stderr)
    except SpeculantError as error:
        fail(error)
        return
    summary = {key: report[key] for key in ("validation_loss", "mean_accepted_length_k4",
                                            "first_draft_acceptance_k4")}
    summary["steps"] = report["training"]["steps"]
    stderr.print(escape(f"wrote {out} ({json.dumps(summary)})"), highlight=False)
