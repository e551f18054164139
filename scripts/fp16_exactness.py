"""Is speculative output equal to greedy on the real model on CUDA? Per prompt, in float16
and float32 (H200 runs, issue 13):

    python3 scripts/fp16_exactness.py PROMPTS.json OUT.json

PROMPTS.json: token-id lists (docs/benchmarks/smollm2-chat8-prompts.json). For each dtype the
built-in pair (static caches, the committed drafter) is written by scripts/smollm2_pair.py's
code; per prompt, 128 greedy tokens, then chained and prompt lookup at k = 4: whether they
are equal, and where they first differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import speculant

prompts = json.loads(Path(sys.argv[1]).read_text())
report: dict = {}
for dtype in ("float16", "float32"):
    root = Path(f"/tmp/smol-{dtype}")
    if not root.exists():
        subprocess.run([sys.executable, "scripts/smollm2_pair.py", str(root), "--dtype", dtype],
                       check=True)
    engine = speculant.load(root, "cuda", use_tf32=False)
    rows = []
    for prompt in prompts:
        greedy = engine.generate(prompt, 128, stop_on_eos=False).token_ids
        row = {}
        for proposer in ("chained", "prompt_lookup"):
            got = engine.generate(prompt, 128, stop_on_eos=False, proposer=proposer,
                                  k=4).token_ids
            first = next((i for i, (a, b) in enumerate(zip(got, greedy, strict=False))
                          if a != b), None)
            row[proposer] = {"equal": got == greedy, "first_difference": first}
        rows.append(row)
    report[dtype] = {"prompts": rows, "equal": {
        p: sum(r[p]["equal"] for r in rows) for p in ("chained", "prompt_lookup")}}
    print(dtype, report[dtype]["equal"], flush=True)
Path(sys.argv[2]).write_text(json.dumps(report, indent=1))
