"""Where a float16 target may break a greedy tie differently from pass to pass.

    speculant export-hf src/speculant/demo /tmp/hf
    python scripts/near_ties.py /tmp/hf src/speculant/demo/val_prompts.json [--tokens 64] [--show 5]
        [--at PROMPT:TOKEN]

Decodes each prompt greedily in float32 with ``transformers`` (the checkpoint ``export-hf``
writes) and reports, per prompt, the smallest gap between the top two logits along its greedy
path, in float16 steps at the top logit's magnitude (``numpy.spacing``). A gap under one step
can round either way in float16, so a 1-wide greedy pass and a wider verify pass, which run
different GEMM kernels, may pick different tokens there; a gap of several steps cannot flip.
``--at 12:5`` prints the two logits at that prompt's new token 5 (the place a bench's
``prompts_differing_from_greedy`` names). Needs torch and transformers (a throwaway venv, as in
``recipes/demo_pair/README.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaForCausalLM


def top_two(scores: torch.Tensor) -> tuple[list[int], list[float]]:
    top = torch.topk(scores, 2)
    return top.indices.tolist(), top.values.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--show", type=int, default=5, help="the prompts with the smallest gaps")
    parser.add_argument("--at", default=None, help="PROMPT:TOKEN, the two logits there")
    args = parser.parse_args()
    model = LlamaForCausalLM.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    data = json.loads(args.prompts.read_text())
    items = data["prompts"] if isinstance(data, dict) else data
    prompts = [item["prompt"] if isinstance(item, dict) else item for item in items]
    at = tuple(int(x) for x in args.at.split(":")) if args.at else None
    rows = []
    with torch.no_grad():
        for index, prompt in enumerate(prompts):
            out = model.generate(torch.tensor([prompt]), max_new_tokens=args.tokens,
                                 do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=0,
                                 eos_token_id=None)  # EOS masked, as the bench decodes
            gaps = []
            for token, scores in enumerate(out.scores):
                ids, values = top_two(scores[0])
                steps = (values[0] - values[1]) / float(np.spacing(np.float16(values[0])))
                gaps.append((steps, token, values[0] - values[1]))
                if at == (index, token):
                    print(f"prompt {index}, new token {token}: {ids[0]} at {values[0]:.4f}, "
                          f"{ids[1]} at {values[1]:.4f} ({steps:.2f} float16 steps)")
            rows.append((index, *min(gaps)))
    rows.sort(key=lambda row: row[1])
    for index, steps, token, gap in rows[:args.show]:
        print(f"prompt {index}: smallest top-2 gap {gap:.5f} at new token {token} "
              f"= {steps:.2f} float16 steps")


if __name__ == "__main__":
    main()
