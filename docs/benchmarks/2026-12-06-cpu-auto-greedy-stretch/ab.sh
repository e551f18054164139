#!/bin/bash
# usage: ab.sh PKG OUTPREFIX ROUNDS [extra bench args]
pkg=$1; out=$2; n=$3; shift 3
for i in $(seq $n); do
  for tree in base new; do
    src=/work/main/src; [ $tree = base ] && src=/tmp/base/src
    PYTHONPATH=$src /work/main/.venv/bin/python -m speculant bench $pkg --proposer chained --k auto --new-tokens 64 --warmup 1 --repeats 3 --out $out-$tree-$i "$@" 2>&1 | grep -E "^\| (greedy|chained)" | awk -v t=$tree -v i=$i '{print t, i, $0}' | cut -c1-120
  done
done
