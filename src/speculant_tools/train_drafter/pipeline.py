"""``train_drafter(package, out, options)``: the whole run, one deadline, resumable.

Stages: the target (``source.read_source`` -> ``llama.TorchLlama``) -> the corpus
(``corpus.load_corpus``, else ``corpus.make_corpus`` within ``data_share`` of the budget) ->
training (``training.train`` until the deadline less ``reserve_seconds``, from
``OUT/checkpoint`` with ``resume``) -> the validation loss -> the export (``export``:
float16 drafter files) -> acceptance of the exported weights on the held-out greedy streams
(``acceptance.measure_acceptance``) -> ``OUT/package`` -> ``loss_curves.png`` ->
``drafter_report.json`` (written last).

OUT holds: ``target/`` (tokenizer.json, tokenizer_config.json), ``corpus/``,
``checkpoint/drafter.pt``, ``train_log.jsonl`` (appended across calls), ``drafter.npz``,
``drafter_config.json``, ``package/``, ``loss_curves.png``, ``drafter_report.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from speculant.text.chat import ChatTemplate
from speculant.text.tokenizer import Tokenizer
from speculant_tools.export.package import tokenizer_facts
from speculant_tools.train_drafter import export
from speculant_tools.train_drafter.acceptance import measure_acceptance
from speculant_tools.train_drafter.corpus import grow_corpus, load_corpus, make_corpus
from speculant_tools.train_drafter.drafter import ChainedDrafter, seed_layers
from speculant_tools.train_drafter.llama import TorchLlama
from speculant_tools.train_drafter.magpie import ChatPrompts
from speculant_tools.train_drafter.objective import Objective
from speculant_tools.train_drafter.options import TrainOptions
from speculant_tools.train_drafter.source import (
    TargetSource,
    TrainDrafterError,
    read_source,
    write_tokenizer_files,
)
from speculant_tools.train_drafter.training import (
    TrainingState,
    checkpoint_shape,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    train,
    validate,
)

REPORT = "drafter_report.json"
CHECKPOINT = Path("checkpoint") / "drafter.pt"


def train_drafter(package: str | Path, out: str | Path,
                  options: TrainOptions | None = None, console: Console | None = None
                  ) -> dict:
    """Train a chained drafter for ``package`` into ``out``; returns the report.
    ``options`` None: :class:`TrainOptions`' defaults."""
    options = (options or TrainOptions()).checked()
    started = time.time()
    deadline = started + options.minutes * 60
    out = Path(out)
    checkpoint_path = out / CHECKPOINT
    _check_resume(checkpoint_path, options.resume)
    device = _device(options.device)
    torch.manual_seed(options.seed)
    console = console or Console(stderr=True)
    timings: dict[str, float] = {}

    source = read_source(package)
    out.mkdir(parents=True, exist_ok=True)
    chat, stop_ids = _chat(source, out)
    config = source.config
    head_rows = options.draft_vocab_size if 0 < options.draft_vocab_size < config.vocab_size \
        else config.vocab_size
    exact = TorchLlama(config, source.weights).to(device)
    data_target = copy.deepcopy(exact).to(torch.bfloat16) if device.type == "cuda" else exact
    timings["load"] = round(time.time() - started, 2)

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task("corpus", total=1.0, note="")

        def show(stage: str, done: float, total: float, note: str = "") -> None:
            bar.update(task, description=stage, completed=done / max(total, 1e-9), note=note)

        stage_started = time.time()
        fingerprint = _fingerprint(source)
        corpus = load_corpus(out / "corpus", fingerprint)
        data_deadline = started + options.data_share * options.minutes * 60

        def data_progress(stage: str, done: int, total: int) -> None:
            show(stage, done, total, f"{done}/{total}")

        if corpus is None:
            corpus = make_corpus(out / "corpus", fingerprint, chat, data_target, exact,
                                 stop_ids, options, data_deadline, data_progress)
        elif options.grow_corpus:
            corpus = grow_corpus(out / "corpus", corpus, fingerprint, chat, data_target,
                                 stop_ids, options, data_deadline, data_progress)
        timings["corpus"] = round(time.time() - stage_started, 2)

        width = options.drafter_intermediate_size or config.intermediate_size
        layers = seed_layers(options.features, config.num_hidden_layers)
        if options.resume:
            width, layers = _resumed_shape(checkpoint_path, layers, options.features)
        drafter = ChainedDrafter(config, width, layers).to(device)
        drafter.init_from_target(exact, torch.Generator().manual_seed(options.seed))
        optimizer = make_optimizer(drafter, options.lr)
        state = (load_checkpoint(checkpoint_path, drafter, optimizer) if options.resume
                 else TrainingState())
        objective = Objective(head_rows=head_rows, unroll=options.unroll,
                              step_decay=options.step_decay,
                              bootstrap_weight=options.bootstrap_weight,
                              teacher_forcing_weight=options.teacher_forcing_weight)
        log_file = (out / "train_log.jsonl").open("a", encoding="utf-8")

        def log(record: dict) -> None:
            log_file.write(json.dumps({"t": round(time.time() - started, 2), **record}) + "\n")
            log_file.flush()

        stage_started = time.time()
        steps_before = state.steps
        state = train(
            data_target, drafter, optimizer, corpus.train, state, objective,
            seconds=max(deadline - time.time() - options.reserve_seconds, 1.0),
            max_steps=options.max_steps, batch_size=options.batch_size, lr=options.lr,
            warmup_steps=options.warmup_steps, seed=options.seed,
            validation=corpus.held_out, validate_every=options.validate_every,
            checkpoint=lambda: save_checkpoint(checkpoint_path, drafter, optimizer, state),
            checkpoint_seconds=options.checkpoint_seconds, log=log,
            progress=lambda fraction, r: show(
                "training", fraction, 1.0,
                f"step {r['step']} loss {r['loss']:.3f} draft-1 agree "
                f"{(r['step_agree'][1:] or [0.0])[0]:.2f}"))
        timings["training"] = round(time.time() - stage_started, 2)

        show("validation and export", 0, 1)
        stage_started = time.time()
        validation = validate(data_target, drafter, corpus.held_out, objective,
                              options.batch_size)
        log({"kind": "val", "step": state.steps, **validation})
        log_file.close()
        notes = {"training": {**asdict(state), "objective": asdict(objective),
                              "options": options.as_dict()},
                 "validation": validation}
        half = export.drafter_files(out, drafter.export_arrays(), source, head_rows, notes,
                                    drafter.seed_feature_layers)
        drafter.load_arrays(half)  # measure what ships: the float16 weights
        drafter.eval()
        evaluation = corpus.held_out[:options.num_eval]
        acceptance = measure_acceptance(exact, drafter, evaluation, options.eval_tokens,
                                        head_rows)
        timings["evaluation"] = round(time.time() - stage_started, 2)
        if options.write_package:
            show("writing the pair package", 0, 1)
            stage_started = time.time()
            export.write_pair(out / "package", source, half, head_rows,
                              drafter.seed_feature_layers)
            timings["package"] = round(time.time() - stage_started, 2)
        has_plot = export.plot_losses(out / "train_log.jsonl", out / "loss_curves.png")
        show("done", 1, 1)

    k4 = acceptance["4"]
    report = {
        "target": source.name, "device": _device_name(device),
        "validation_loss": validation["val_loss"],
        "mean_accepted_length_k4": k4["mean_accepted_length"],
        "first_draft_acceptance_k4": k4["first_draft_acceptance"],
        "acceptance": acceptance, "validation": validation,
        "training": {**asdict(state), "steps_this_call": state.steps - steps_before},
        "corpus": corpus.stats, "draft_vocab_size": head_rows,
        "drafter_intermediate_size": drafter.intermediate_size,
        "features": options.features,  # the carry seed: last or eagle3
        "seed_feature_layers": list(drafter.stream_layers) or None,
        "files": {"package": str(out / "package") if options.write_package else None,
                  "loss_curves": str(out / "loss_curves.png") if has_plot else None},
        "timings": {**timings, "total": round(time.time() - started, 2)},
        "options": options.as_dict(),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    (out / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _check_resume(checkpoint_path: Path, resume: bool) -> None:
    if resume and not checkpoint_path.is_file():
        raise TrainDrafterError("--resume continues a checkpoint, and there is none",
                                file=str(checkpoint_path), path="--resume",
                                remedy="run once without --resume")
    if not resume and checkpoint_path.is_file():
        raise TrainDrafterError("the output folder already holds a trained drafter",
                                file=str(checkpoint_path), path="--resume",
                                remedy="pass --resume to continue it, or name a new folder")


def _resumed_shape(checkpoint_path: Path, layers: tuple[int, ...] | None, features: str
                   ) -> tuple[int, tuple[int, ...] | None]:
    """The checkpoint's MLP width and seed layers; a seed other than ``--features`` asks
    for is refused (the checkpoint's weights are of its own seed)."""
    width, saved = checkpoint_shape(checkpoint_path)
    if saved != layers:
        raise TrainDrafterError("the checkpoint was trained with another --features",
                                file=str(checkpoint_path), path="--features", value=features,
                                expected="eagle3" if saved else "last",
                                remedy="resume with the checkpoint's --features, or train "
                                       "into a new folder")
    return width, saved


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainDrafterError("no CUDA device is visible to PyTorch", path="--device",
                                value=name, expected="a CUDA build of torch and a GPU",
                                remedy="pass --device cpu (a small run), or run it where a "
                                       "GPU is")
    return torch.device(name)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _chat(source: TargetSource, out: Path) -> tuple[ChatPrompts, set[int]]:
    """The chat prompts and the answers' stop ids: the EOS and every end-of-turn text of the
    template that is one token (as ``speculant chat`` stops)."""
    template_source = source.chat_template  # refuses a target without one
    tokenizer_path = write_tokenizer_files(source, out / "target")
    tokenizer = Tokenizer.from_file(tokenizer_path)
    config = source.tokenizer_config
    template = ChatTemplate(template_source, _token_text(config.get("bos_token")),
                            _token_text(config.get("eos_token")),
                            str(tokenizer_path.with_name("tokenizer_config.json")))
    stop_ids = {tokenizer_facts(tokenizer_path, source.eos_id).eos_id}
    for ending in template.end_of_turn_texts():
        ids = tokenizer.encode(ending, add_special_tokens=False)
        if len(ids) == 1:
            stop_ids.add(ids[0])
    return ChatPrompts(template, tokenizer), stop_ids


def _token_text(value: object) -> str:
    """``bos_token``/``eos_token`` as Hugging Face stores it: a string or ``{"content"}``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _fingerprint(source: TargetSource) -> str:
    digest = hashlib.sha256(source.config.to_json().encode())
    digest.update(source.tokenizer_json.encode())
    digest.update(source.weights["model.norm.weight"].tobytes())
    return digest.hexdigest()[:16]
