#!/bin/bash
for i in 1 2; do for tree in base new; do
  src=/work/main/src; [ $tree = base ] && src=/tmp/base/src
  PYTHONPATH=$src /work/main/.venv/bin/python -m speculant bench smollm2 --chat --prompts /work/main/docs/benchmarks/2026-12-02-cpu-smollm2/prompts.json --proposer chained --k auto --threads 2 --new-tokens 64 --warmup 1 --repeats 3 --out /tmp/absmol-$tree-$i > /tmp/absmol-$tree-$i.log 2>&1
  grep -E "^\| (greedy|chained)" /tmp/absmol-$tree-$i/bench.md | awk -v t=$tree -v i=$i '{print t, i, $0}' | cut -d'|' -f1-5,9-12
done; done
