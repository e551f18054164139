#!/bin/bash
# alternate the v4 and v5 demo packages (float32, fused, static), same code (main's working tree)
for i in 1 2 3; do
  for v in v4 v5; do
    /work/main/.venv/bin/speculant bench /tmp/d32s_$v --prompts /tmp/d32s_$v/val_prompts.json --proposer chained --k 2 --k 4 --k auto --threads 2 --new-tokens 64 --warmup 1 --repeats 3 --out /tmp/abv5/$v-$i 2>&1 | grep -E "^\| (greedy|chained)" | awk -v t=$v -v i=$i '{print t, i, $0}' | cut -d'|' -f1-4,8-11
  done
done
