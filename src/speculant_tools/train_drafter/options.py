"""Everything ``speculant train-drafter`` can be told, with the defaults it runs with.

The defaults are sized for a ~135M target on one GPU (an 8-minute call); a tiny CPU run sets
the counts down (``tests/train_drafter``). The CLI takes its defaults from this dataclass, so
the two never disagree. :meth:`TrainOptions.checked` refuses a value outside its range with a
:class:`~speculant_tools.train_drafter.source.TrainDrafterError` naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from speculant_tools.train_drafter.errors import TrainDrafterError

DEVICES = ("cpu", "cuda")
# What seeds the drafter's carry: the target's final hidden state, or EAGLE-3's fused low,
# middle and high residual streams (train_drafter.drafter.eagle3_layers)
FEATURES = ("last", "eagle3")


@dataclass(frozen=True)
class TrainOptions:
    device: str = "cuda"
    minutes: float = 8.0  # this call's wall-clock budget, loading and export included
    resume: bool = False  # continue from OUT/checkpoint (the corpus in OUT is always reused)
    seed: int = 1234
    # -- the corpus (made once, in the first call) ----------------------------------------
    num_requests: int = 24576  # user requests sampled (before deduplication)
    request_tokens: int = 96  # the longest request
    min_request_chars: int = 12  # shorter (normalized) requests are dropped
    keep_unfinished_requests: bool = False  # keep requests cut off by request_tokens
    held_out_fraction: float = 0.04  # of the requests, by request
    answer_tokens: int = 256  # the longest training answer
    sampled_passes: int = 2  # sampled answers to every training request, after the greedy ones
    generation_batch: int = 2048  # prompts decoded at once
    data_share: float = 0.5  # of the budget, at most, for the corpus
    grow_corpus: bool = True  # a resumed call answers what an earlier call's budget left
    num_eval: int = 64  # held-out requests whose greedy streams measure acceptance
    eval_tokens: int = 128  # the longest held-out greedy stream (the report's max_new_tokens)
    # -- the drafter and its training -----------------------------------------------------
    draft_vocab_size: int = 12288  # the drafter scores ids < N (0 or >= vocab: all of them)
    drafter_intermediate_size: int = 0  # the drafter's MLP width (0: the target's)
    features: str = "last"  # FEATURES: the carry seed
    unroll: int = 6  # chained steps trained: the bootstrap and unroll - 1 drafts
    step_decay: float = 0.8
    bootstrap_weight: float = 0.5
    teacher_forcing_weight: float = 0.2
    batch_size: int = 64  # sequences a step
    lr: float = 1e-3
    warmup_steps: int = 40
    max_steps: int = 0  # > 0: at most this many training steps in this call
    validate_every: int = 500  # steps between validation losses
    checkpoint_seconds: float = 120.0  # between checkpoints during training
    reserve_seconds: float = 45.0  # kept after training for the evaluation and the export
    write_package: bool = True  # OUT/package: the pair, float32, static caches

    def checked(self) -> TrainOptions:
        if self.device not in DEVICES:
            raise _bad("device", self.device, " or ".join(DEVICES))
        if self.features not in FEATURES:
            raise _bad("features", self.features, " or ".join(FEATURES))
        positive = ("minutes", "num_requests", "request_tokens", "answer_tokens",
                    "generation_batch", "num_eval", "eval_tokens", "unroll", "batch_size",
                    "lr", "validate_every", "checkpoint_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise _bad(name, getattr(self, name), "> 0")
        non_negative = ("min_request_chars", "sampled_passes", "draft_vocab_size",
                        "drafter_intermediate_size", "step_decay", "bootstrap_weight",
                        "teacher_forcing_weight", "warmup_steps", "max_steps",
                        "reserve_seconds")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise _bad(name, getattr(self, name), ">= 0")
        for name in ("held_out_fraction", "data_share"):
            if not 0 < getattr(self, name) < 1:
                raise _bad(name, getattr(self, name), "a fraction in (0, 1)")
        return self

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _bad(name: str, value: object, expected: str) -> TrainDrafterError:
    flag = "--" + name.replace("_", "-")
    return TrainDrafterError("an option is out of range", path=flag, value=value,
                             expected=expected, remedy=f"pass {flag} within {expected}")
