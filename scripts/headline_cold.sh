#!/usr/bin/env bash
# The README's headline command, cold: one new process per run, greedy and k=auto, alternating
# between trees, ROUNDS rounds. Each tree is a checkout whose src/ is put first on PYTHONPATH
# (`git worktree add /tmp/base <commit>`); every tree runs in this checkout's .venv, with the
# built-in smollm2 already imported into the user cache. One line per run: round, mode, tree,
# the command's own "tok/s, admission to last token, load excluded", its rounds by width.
# usage: scripts/headline_cold.sh ROUNDS TREE [TREE ...] > runs.txt
set -euo pipefail
rounds=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
prompt="Explain speculative decoding in one sentence."
for round in $(seq 1 "$rounds"); do
  for mode in greedy auto; do
    for tree in "$@"; do
      flags=(--chat --prompt "$prompt" --stats)
      [ "$mode" = auto ] && flags+=(--speculative)
      out=$(PYTHONPATH="$tree/src" "$here/.venv/bin/speculant" generate "${flags[@]}" 2>&1)
      rate=$(grep -o '([0-9.]* tok/s' <<<"$out" | tr -d '(')
      widths=$(grep -o 'rounds by width:.*' <<<"$out" || true)
      echo "$round $mode $(basename "$tree") $rate | $widths"
    done
  done
done
