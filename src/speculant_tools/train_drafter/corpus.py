"""The training corpus, made once from the target and kept in ``OUT/corpus/``.

    corpus = load_corpus(folder, fingerprint) or make_corpus(...)  # resumed runs reuse it
    corpus.train          # [{"ids": prompt + answer, "prompt_len", "is_sampled"}]
    corpus.held_out       # the same, the target's exact (float32) greedy answers

Stages: requests (Magpie: the user-turn opener of a category cue, sampled at temperature 1,
top-p 0.95; ``magpie.clean_requests`` then ``magpie.split_by_request``), the held-out greedy
streams (float32, ``eval_tokens`` long: the evaluation and the validation loss), then the
training answers: one greedy answer to every training request, then ``sampled_passes``
sampled ones (temperature 0.7, top-p 0.95) while the data budget lasts. A resumed call
whose corpus stopped short (its budget ended first) goes on answering within its own data
budget (:func:`grow_corpus`).

On disk: ``requests.jsonl`` (text, category, held_out), ``train.npz`` and ``held_out.npz``
(``tokens`` uint32 flat, ``offsets``, ``prompt_lens``, ``is_sampled``) and ``state.json``
(written last: the corpus is complete; the target's fingerprint, the counts, the seconds).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speculant_tools.train_drafter.errors import TrainDrafterError
from speculant_tools.train_drafter.generate import GREEDY, Sampling, generate_batch
from speculant_tools.train_drafter.llama import TorchLlama
from speculant_tools.train_drafter.magpie import (
    CATEGORIES,
    ChatPrompts,
    Request,
    clean_requests,
    split_by_request,
)
from speculant_tools.train_drafter.options import TrainOptions

REQUEST_SAMPLING = Sampling(temperature=1.0, top_p=0.95)
ANSWER_SAMPLING = Sampling(temperature=0.7, top_p=0.95)
# progress(stage, done, total) and log(record): the pipeline's bar and train_log.jsonl
Progress = Callable[[str, int, int], None]


@dataclass
class Corpus:
    requests: list[Request]
    train: list[dict]  # {"ids", "prompt_len", "is_sampled"}
    held_out: list[dict]  # greedy streams of held-out requests, in request order
    stats: dict

    @property
    def num_answer_tokens(self) -> int:
        return sum(len(e["ids"]) - e["prompt_len"] for e in self.train)


def make_corpus(folder: Path, fingerprint: str, chat: ChatPrompts, data_target: TorchLlama,
                exact_target: TorchLlama, stop_ids: set[int], options: TrainOptions,
                deadline: float, progress: Progress) -> Corpus:
    """Generate the corpus into ``folder`` (see the module docstring) before ``deadline``."""
    started = time.time()
    device = data_target.embed.device
    generator = torch.Generator(device=device).manual_seed(options.seed)
    raw = sample_requests(chat, data_target, options, generator, deadline, progress)
    requests = split_by_request(clean_requests(raw, options.min_request_chars),
                                options.held_out_fraction)
    held = [r for r in requests if r.is_held_out]
    trained = [r for r in requests if not r.is_held_out]
    if not held or not trained:
        raise TrainDrafterError("too few distinct requests for a training and a held-out "
                                "split", path="--num-requests", value=len(requests),
                                expected="at least 2 distinct requests after deduplication",
                                remedy="sample more requests (--num-requests), or keep "
                                       "unfinished ones (--keep-unfinished-requests)")
    seconds_requests = time.time() - started
    held_out = answer(exact_target, chat, held, options.eval_tokens, stop_ids, GREEDY,
                      generator, min(options.generation_batch, 64), float("inf"),
                      lambda done, total: progress("held-out greedy streams", done, total))
    train = answer_missing(data_target, chat, trained, [], stop_ids, options, generator,
                           deadline, progress)
    if not train:
        raise TrainDrafterError("no training answer was made within the data budget",
                                path="--minutes", value=options.minutes,
                                remedy="give the run more minutes (or a larger --data-share)")
    stats = {"raw_requests": len(raw), "requests": len(requests), "train_requests":
             len(trained), "held_out_requests": len(held), "train_examples": len(train),
             "sampled_examples": sum(e["is_sampled"] for e in train),
             "by_category": {c: sum(r.category == c for r in requests) for c in CATEGORIES},
             "seconds_requests": round(seconds_requests, 2),
             "seconds": round(time.time() - started, 2)}
    corpus = Corpus(requests, train, held_out, stats)
    corpus.stats["answer_tokens"] = corpus.num_answer_tokens
    save_corpus(folder, corpus, fingerprint)
    return corpus


def grow_corpus(folder: Path, corpus: Corpus, fingerprint: str, chat: ChatPrompts,
                data_target: TorchLlama, stop_ids: set[int], options: TrainOptions,
                deadline: float, progress: Progress) -> Corpus:
    """A resumed call goes on where an earlier call's data budget ended
    (:func:`answer_missing`), before ``deadline``; saved again where anything was added.
    The requests and the held-out streams never change, so the split and the evaluation
    stay the same."""
    started = time.time()
    trained = [r for r in corpus.requests if not r.is_held_out]
    generator = torch.Generator(device=data_target.embed.device).manual_seed(
        options.seed + len(corpus.train))
    added = answer_missing(data_target, chat, trained, corpus.train, stop_ids, options,
                           generator, deadline, progress)
    if not added:
        return corpus
    train = corpus.train + added
    stats = {**corpus.stats, "train_examples": len(train),
             "sampled_examples": sum(e["is_sampled"] for e in train),
             "seconds": round(corpus.stats.get("seconds", 0.0) + time.time() - started, 2)}
    grown = Corpus(corpus.requests, train, corpus.held_out, stats)
    grown.stats["answer_tokens"] = grown.num_answer_tokens
    save_corpus(folder, grown, fingerprint)
    return grown


def answer_missing(target: TorchLlama, chat: ChatPrompts, trained: list[Request],
                   have: list[dict], stop_ids: set[int], options: TrainOptions,
                   generator: torch.Generator, deadline: float, progress: Progress
                   ) -> list[dict]:
    """The answers ``have`` lacks, before ``deadline``: the greedy answer of every training
    request without one, then each sampled pass to the requests it has not reached."""
    prompts = [tuple(chat.answer_prompt(r.text)) for r in trained] if have else None
    greedy = {tuple(e["ids"][:e["prompt_len"]]) for e in have if not e["is_sampled"]}
    sampled: dict[tuple[int, ...], int] = {}
    for e in have:
        if e["is_sampled"]:
            key = tuple(e["ids"][:e["prompt_len"]])
            sampled[key] = sampled.get(key, 0) + 1
    more = " (more)" if have else ""

    def lacking(done: Callable[[tuple[int, ...]], bool]) -> list[Request]:
        return trained if prompts is None else [
            r for r, p in zip(trained, prompts, strict=True) if not done(p)]

    added = answer(target, chat, lacking(greedy.__contains__), options.answer_tokens,
                   stop_ids, GREEDY, generator, options.generation_batch, deadline,
                   lambda done, total: progress("greedy answers" + more, done, total))
    for index in range(options.sampled_passes):
        if time.time() >= deadline:
            break
        added += answer(target, chat, lacking(lambda p, i=index: sampled.get(p, 0) > i),
                        options.answer_tokens, stop_ids, ANSWER_SAMPLING, generator,
                        options.generation_batch, deadline,
                        lambda done, total, i=index: progress(
                            f"sampled answers, pass {i + 1}{more}", done, total))
    return added


def sample_requests(chat: ChatPrompts, target: TorchLlama, options: TrainOptions,
                    generator: torch.Generator, deadline: float, progress: Progress
                    ) -> list[Request]:
    """``num_requests`` raw requests, the categories in turn, each row's cue drawn."""
    choose = random.Random(options.seed)
    steered = chat.accepts_system_messages()
    names = list(CATEGORIES) if steered else ["any"]
    requests: list[Request] = []
    made = 0
    while made < options.num_requests and time.time() < deadline:
        rows = min(options.generation_batch, options.num_requests - made)
        categories = [names[(made + i) % len(names)] for i in range(rows)]
        openers = [chat.user_turn_opener(choose.choice(CATEGORIES[c]) if steered else None)
                   for c in categories]
        generated = generate_batch(target, openers, max_new_tokens=options.request_tokens,
                                   stop_ids=chat.special_ids, sampling=REQUEST_SAMPLING,
                                   generator=generator)
        for category, ids in zip(categories, generated, strict=True):
            text, is_finished = chat.request_text(ids)
            if is_finished or options.keep_unfinished_requests:
                requests.append(Request(text, category))
        made += rows
        progress("user requests (Magpie)", made, options.num_requests)
    return requests


def answer(target: TorchLlama, chat: ChatPrompts, requests: list[Request], max_new_tokens: int,
           stop_ids: set[int], sampling: Sampling, generator: torch.Generator, batch_size: int,
           deadline: float, progress: Callable[[int, int], None]) -> list[dict]:
    """The target's answer to each request (prompts of similar length batched together),
    until ``deadline``; answers shorter than two tokens are dropped."""
    prompts = [chat.answer_prompt(r.text) for r in requests]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    examples: dict[int, dict] = {}
    for start in range(0, len(order), batch_size):
        if time.time() >= deadline:
            break
        group = order[start:start + batch_size]
        rows = generate_batch(target, [prompts[i] for i in group],
                              max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                              sampling=sampling, generator=generator)
        for i, row in zip(group, rows, strict=True):
            if len(row) >= 2:
                examples[i] = {"ids": prompts[i] + row, "prompt_len": len(prompts[i]),
                               "is_sampled": not sampling.is_greedy}
        progress(min(start + batch_size, len(order)), len(order))
    return [examples[i] for i in sorted(examples)]


# -- on disk ------------------------------------------------------------------------------
def _save_examples(path: Path, examples: list[dict]) -> None:
    lengths = np.array([len(e["ids"]) for e in examples], np.int64)
    tokens = np.fromiter((t for e in examples for t in e["ids"]), np.uint32,
                         count=int(lengths.sum()))
    np.savez_compressed(path, tokens=tokens, offsets=np.concatenate([[0], np.cumsum(lengths)]),
                        prompt_lens=np.array([e["prompt_len"] for e in examples], np.int64),
                        is_sampled=np.array([e["is_sampled"] for e in examples], bool))


def _load_examples(path: Path) -> list[dict]:
    with np.load(path) as data:
        tokens, offsets = data["tokens"].astype(np.int64), data["offsets"]
        prompt_lens, is_sampled = data["prompt_lens"], data["is_sampled"]
    return [{"ids": tokens[offsets[i]:offsets[i + 1]].tolist(),
             "prompt_len": int(prompt_lens[i]), "is_sampled": bool(is_sampled[i])}
            for i in range(len(prompt_lens))]


def save_corpus(folder: Path, corpus: Corpus, fingerprint: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "requests.jsonl").open("w", encoding="utf-8") as f:
        for r in corpus.requests:
            f.write(json.dumps({"text": r.text, "category": r.category,
                                "held_out": r.is_held_out}, ensure_ascii=False) + "\n")
    _save_examples(folder / "train.npz", corpus.train)
    _save_examples(folder / "held_out.npz", corpus.held_out)
    (folder / "state.json").write_text(json.dumps(
        {"complete": True, "fingerprint": fingerprint, "stats": corpus.stats}, indent=2) + "\n")


def load_corpus(folder: Path, fingerprint: str) -> Corpus | None:
    """The complete corpus in ``folder``, or None where none was finished. One made for
    another target is refused."""
    state_file = folder / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    if state.get("fingerprint") != fingerprint:
        raise TrainDrafterError("the corpus in the output folder was made for another target",
                                file=str(state_file), path="fingerprint",
                                value=state.get("fingerprint"), expected=fingerprint,
                                remedy="name a new output folder for this target")
    with (folder / "requests.jsonl").open(encoding="utf-8") as f:
        requests = [Request(d["text"], d["category"], d["held_out"])
                    for d in map(json.loads, f)]
    return Corpus(requests, _load_examples(folder / "train.npz"),
                  _load_examples(folder / "held_out.npz"), state["stats"])
