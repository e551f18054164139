"""The target pass's cost by block width on the realistic ~1B (/tmp/real1b-q4) after greedy and
chained k=4 decodes of two prompts (so graph id 0 is the width-1 greedy plan's): the pass, its
invoke and the bench's bare ORT run, medians of 20.

    PYTHONPATH=/tmp/site:$PWD/src python3 scripts/width_curve.py
"""
import json
import statistics

import speculant
from speculant_bench.timing import verify_width_curve

engine = speculant.load("/tmp/real1b-q4", device="cuda")
prompts = json.load(open("docs/benchmarks/val8-prompts.json"))[:2]
for p in prompts:
    # greedy plans first: graph id 0 is width 1's
    engine.generate(p, max_new_tokens=64, stop_on_eos=False)
    engine.generate(p, max_new_tokens=64, stop_on_eos=False, proposer="chained", k=4)
for t in verify_width_curve(engine, prompts[0], widths=(1, 2, 5, 9), repeats=20):
    ms = {name: statistics.median(getattr(t, name)) * 1e3
          for name in ("pass_s", "invoke_s", "bare_s")}
    print(f"width {t.width}: pass {ms['pass_s']:.3f} ms, invoke {ms['invoke_s']:.3f} ms, "
          f"bare ORT run {ms['bare_s']:.3f} ms")
