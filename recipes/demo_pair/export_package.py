"""Turn a training output folder into the committed demo packages.

    python recipes/demo_pair/export_package.py TRAIN_DIR [--pair src/speculant/demo]
        [--draft src/speculant/demo_draft]

Writes the chained pair (target + cacheless drafter, float32) and the separate draft model as
speculant packages with `speculant_tools.export`, and copies the fixed validation prompts beside the
pair. Needs `safetensors` (pip install safetensors) to read the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

from safetensors.numpy import load_file

from speculant_tools.export import LlamaConfig, write_decoder_package, write_pair_package


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("train_dir", type=Path)
    parser.add_argument("--pair", type=Path, default=Path("src/speculant/demo"))
    parser.add_argument("--draft", type=Path, default=Path("src/speculant/demo_draft"))
    args = parser.parse_args()
    src = args.train_dir
    summary = json.loads((src / "summary.json").read_text())
    eos_id = summary.get("eos_id", summary.get("contract", {}).get("eos_id"))
    for root in (args.pair, args.draft):
        if root.exists():
            shutil.rmtree(root)
    target = load_file(str(src / "target.safetensors"))
    drafter = load_file(str(src / "drafter.safetensors"))
    config = LlamaConfig.from_hf(json.loads((src / "target_config.json").read_text()))
    config = dataclasses.replace(  # the drafter's MLP may be wider than the target's
        config, drafter_intermediate_size=drafter["drafter.layer.mlp.up_proj.weight"].shape[0])
    write_pair_package(args.pair, target, config, drafter, src / "tokenizer.json",
                       dtype="float32", eos_id=eos_id, max_proposal_width=8)
    shutil.copy(src / "val_prompts.json", args.pair / "val_prompts.json")
    draft = load_file(str(src / "draft.safetensors"))
    write_decoder_package(args.draft, draft, json.loads((src / "draft_config.json").read_text()),
                          src / "tokenizer.json", dtype="float32", eos_id=eos_id)
    total = sum(f.stat().st_size for root in (args.pair, args.draft) for f in root.rglob("*")
                if f.is_file())
    print(f"wrote {args.pair} and {args.draft}: {total / 1e6:.2f} MB together")


if __name__ == "__main__":
    main()
