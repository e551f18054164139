"""Repeat the trainer's acceptance figure with speculant itself, on the exported weights.

    uv run --extra cpu --with gguf python recipes/smollm2_drafter/runtime_check.py \
        GGUF TOKENIZER_JSON PACKAGE_DIR OUT_JSON [--k 4] [--limit 0]

Writes a float32 chained pair package (``speculant_tools.export.write_pair_package``: the GGUF's
dequantized target and ``speculant_tools/builtin/smollm2/drafter.npz`` with the settings of
``drafter_config.json``, the embedding taken from the target), then decodes every prompt of
``results/eval_set.json`` with ``engine.generate(prompt_ids, speculative=True, k=K)`` and
reports: whether the tokens equal the trainer's float32 greedy stream, and the round trace
summarized as the trainer summarizes it (``mean_accepted_length``, ``first_draft_acceptance``,
``acceptance_by_position``), beside the trainer's figure from ``results/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import gguf_target  # noqa: E402

NPZ = REPO / "src" / "speculant_tools" / "builtin" / "smollm2" / "drafter.npz"


def summarize(pairs: list[tuple[int, int]], k: int) -> dict:
    """As ``pairlib.summarize`` (the trainer's)."""
    rounds = [(kr, a) for kr, a in pairs if kr > 0]
    proposed = [sum(1 for kr, _ in rounds if kr > i) for i in range(k)]
    accepted = [sum(1 for kr, a in rounds if kr > i and a - 1 > i) for i in range(k)]
    return {"rounds": len(rounds),
            "mean_accepted_length": sum(a for _, a in rounds) / len(rounds),
            "first_draft_acceptance": sum(a >= 2 for _, a in rounds) / len(rounds),
            "acceptance_by_position": [a / p if p else None
                                       for a, p in zip(accepted, proposed, strict=True)]}


def build(gguf: str, tokenizer_json: str, root: Path) -> Path:
    """The pair as the built-in import writes it: ``drafter_config.json``'s settings read by
    ``read_drafter`` (``draft_vocab_size`` included: a subset vocabulary where present)."""
    import dataclasses

    from speculant_tools.export import LlamaConfig, write_pair_package
    from speculant_tools.importers import read_drafter

    if (root / "inference_metadata.yaml").exists():
        return root
    target, hf_config = gguf_target.gguf_state_dict(gguf)
    config = LlamaConfig.from_hf(hf_config)
    drafter = read_drafter(NPZ.parent, config)
    config = dataclasses.replace(config, drafter_intermediate_size=drafter.intermediate_size,
                                 draft_vocab_size=drafter.vocab_size)
    weights = {k: v.astype(np.float32) for k, v in drafter.weights.items()}
    return write_pair_package(root, target, config, weights, tokenizer_json, dtype="float32",
                              scale=drafter.scale, max_proposal_width=drafter.max_proposal_width,
                              eos_id=hf_config["eos_token_id"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("tokenizer_json")
    p.add_argument("package", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--limit", type=int, default=0)
    args = p.parse_args()
    import speculant

    started = time.time()
    build(args.gguf, args.tokenizer_json, args.package)
    engine = speculant.load(args.package, "cpu")
    data = json.loads((HERE / "results" / "eval_set.json").read_text())
    items = data["prompts"][:args.limit or None]
    pairs, equal = [], 0
    for item in items:
        run = engine.generate(item["prompt_ids"], data["max_new_tokens"], speculative=True,
                              k=args.k)
        equal += list(run.token_ids) == item["greedy_ids"]
        pairs += run.stats.trace
    trainer = json.loads((HERE / "results" / "summary.json").read_text())["acceptance"]
    report = {"k": args.k, "prompts": len(items), "tokens_equal_trainer_greedy": equal,
              "runtime": summarize(pairs, args.k),
              "trainer (all 64 prompts)": trainer[str(args.k)],
              "seconds": round(time.time() - started, 1)}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
