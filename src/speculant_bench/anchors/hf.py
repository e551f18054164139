"""The Hugging Face transformers anchor: ``generate`` on the checkpoint `export_hf` writes.

Modes, all greedy (``do_sample=False``), in the checkpoint's dtype (float32 for a float32
package, float16 for one from ``speculant convert --dtype float16``), EOS never ending a decode
(``eos_token_id=None``, ``min_new_tokens = max_new_tokens = N``):

- ``greedy``: plain ``generate``;
- ``prompt_lookup k``: ``prompt_lookup_num_tokens=k``, ``max_matching_ngram_size=3`` (speculant's
  prompt lookup matches 3-, 2-, then 1-grams; transformers' default would stop at 2);
- ``assisted k``: ``assistant_model=`` the draft model's checkpoint, ``num_assistant_tokens=k``
  on a fixed schedule (``num_assistant_tokens_schedule="constant"``) and the confidence stop
  off (``assistant_confidence_threshold=0``), so every round drafts exactly k tokens as
  speculant's draft proposer does.

On the CPU ``torch.set_num_threads`` takes the bench's thread count. The first token's time is
when ``generate`` hands its first new token to a streamer (the first ``put`` is the prompt).
Target and draft passes are counted with forward pre-hooks, installed only for the untimed
counting pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from speculant_bench.anchors.base import AnchorDecode, AnchorRunner, AnchorSetup
from speculant_bench.runners import fixed_widths

PROMPT_LOOKUP_MAX_NGRAM = 3  # as speculant's prompt lookup: ngram_range (1, 3)


def generate_options(mode: str, k: int) -> dict:
    """The ``generate`` keywords of a mode, besides the ones every mode shares (and besides
    ``assistant_model``, which is an object)."""
    if mode == "greedy":
        return {}
    if mode == "prompt_lookup":
        return {"prompt_lookup_num_tokens": k,
                "max_matching_ngram_size": PROMPT_LOOKUP_MAX_NGRAM}
    if mode == "assisted":
        return {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    raise ValueError(f"unknown transformers anchor mode {mode!r}")


ASSISTANT_CONFIG_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule",
                         "assistant_confidence_threshold")


def torch_device(device: str) -> str:
    """speculant's ``cpu`` / ``cuda`` / ``cuda:N`` as a torch device string."""
    if device == "cpu" or device.startswith("cuda"):
        return "cuda:0" if device == "cuda" else device
    raise ValueError(f"unknown device {device!r}")


class _FirstToken:
    """A streamer that notes when ``generate`` hands out its first new token."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_at: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:  # the first put is the prompt
            self.first_at = time.perf_counter()

    def end(self) -> None:
        pass


@contextmanager
def _counting(module):
    """Count ``module``'s forward calls (a forward pre-hook, removed on exit)."""
    calls = [0]

    def count(*_args) -> None:
        calls[0] += 1
    handle = module.register_forward_pre_hook(count)
    try:
        yield calls
    finally:
        handle.remove()


def checkpoint_dtype(folder: Path) -> str:
    """The dtype `export_hf` wrote the checkpoint in (its config's ``torch_dtype``)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("torch_dtype") or config.get("dtype") or "float32"


def _load(transformers, torch, folder: Path, device: str):
    major = int(transformers.__version__.split(".")[0])
    dtype_key = "dtype" if major >= 5 else "torch_dtype"
    dtype = getattr(torch, checkpoint_dtype(folder))
    model = transformers.LlamaForCausalLM.from_pretrained(str(folder), **{dtype_key: dtype})
    model = model.to(device).eval()
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {dtype}:
        raise RuntimeError(f"{folder} loaded as {dtypes}, not {dtype}")
    return model


def prepare(setup: AnchorSetup, *, target_dir: Path, draft_dir: Path | None, device: str,
            threads: int | None, proposers: Sequence[str], ks: Sequence[int]) -> None:
    """Load the checkpoints and add the transformers runners to ``setup``."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    where = torch_device(device)
    if where == "cpu" and threads:
        torch.set_num_threads(threads)
    target = _load(transformers, torch, target_dir, where)
    assistant = _load(transformers, torch, draft_dir, where) if draft_dir else None
    setup.info["hf"] = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "device": where, "torch_threads": torch.get_num_threads() if where == "cpu" else None,
        "dtype": checkpoint_dtype(target_dir), "checkpoint": str(target_dir),
        "draft_checkpoint": str(draft_dir) if draft_dir else None,
        "shared": {"do_sample": False, "max_new_tokens": "N", "min_new_tokens": "N",
                   "eos_token_id": None, "pad_token_id": 0},
    }

    def decoder(mode: str, k: int):
        options = generate_options(mode, k)
        assistant_config = {key: options.pop(key) for key in ASSISTANT_CONFIG_KEYS
                            if key in options}
        extra = {"assistant_model": assistant} if mode == "assisted" else {}

        def decode(prompt: Sequence[int], n: int, count: bool = False) -> AnchorDecode:
            for key, value in assistant_config.items():  # read by generate from the assistant
                setattr(assistant.generation_config, key, value)
            streamer = _FirstToken()
            with ExitStack() as stack:
                counted = {name: stack.enter_context(_counting(model)) for name, model in
                           (("target_passes", target), ("draft_passes", assistant))
                           if count and (name == "target_passes" or extra)}
                started = time.perf_counter()
                ids = torch.tensor([list(prompt)], dtype=torch.long, device=where)
                with torch.inference_mode():
                    out = target.generate(ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                          eos_token_id=None, pad_token_id=0, streamer=streamer,
                                          **options, **extra)
                tokens = out[0, len(prompt):].tolist()
                total = time.perf_counter() - started
            counts = {name: calls[0] for name, calls in counted.items()}
            first = streamer.first_at if streamer.first_at is not None else started + total
            return AnchorDecode(tokens, total, first - started, counts)
        return decode

    modes = [("greedy", 0)]
    widths = fixed_widths(ks)  # transformers' candidate generators take a fixed width here
    if "prompt_lookup" in proposers:
        modes += [("prompt_lookup", k) for k in widths]
    if assistant is not None and "draft" in proposers:
        modes += [("assisted", k) for k in widths]
    for mode, k in modes:
        setup.runners.append(AnchorRunner("hf", mode, k, decoder(mode, k),
                                          generate_options(mode, k)))
