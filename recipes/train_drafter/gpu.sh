#!/usr/bin/env bash
# On the GPU machine (python3 3.12 with PyTorch), from the repository root. Phases:
#
#   bash recipes/train_drafter/gpu.sh receive .train-drafter/cN   # one staged chunk (stage.sh);
#        the last one installs every wheel into /tmp/site
#   bash recipes/train_drafter/gpu.sh restore .train-drafter/resume-aa [...]   # carried parts
#        (checkpoint.tar.part-*, one or more a call) gathered in /tmp/train-drafter-parts
#   bash recipes/train_drafter/gpu.sh train "$OUT" [MINUTES] [-- train-drafter options]
#        one training call (default 8 minutes): the first makes the corpus and starts the
#        drafter in /tmp/train-drafter, every later call on the same warm machine resumes it
#        (--resume is added when a checkpoint is there); on a fresh machine the parts
#        gathered by `restore` are the checkpoint, and its corpus where they hold one (else
#        the corpus is made again). $OUT receives: drafter.npz, drafter_config.json,
#        drafter_report.json, loss_curves.png, train_log.jsonl and the checkpoint with the
#        corpus as checkpoint.tar.part-aa, -ab, -ac (each at most ~16 MiB, so each can be
#        carried back beside the tree).
#        TARGET (default smollm2) names another package; WORK (default /tmp/train-drafter)
#        another folder.
set -uo pipefail
phase=${1:?phase: receive, restore or train}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
work=${WORK:-/tmp/train-drafter}
parts=/tmp/train-drafter-parts

receive() {
  local chunk=${1:?the chunk folder}
  mkdir -p /tmp/train-drafter-stage && cp "$chunk"/part.* /tmp/train-drafter-stage/ || exit 1
  local have want
  have=$(ls /tmp/train-drafter-stage/part.* | wc -l)
  want=$(cat "$chunk/TOTAL_PARTS")
  echo "parts present: $have of $want"
  if [ "$have" -ge "$want" ]; then
    rm -rf /tmp/train-drafter-wheels && mkdir -p /tmp/train-drafter-wheels
    cat /tmp/train-drafter-stage/part.* | tar -xf - -C /tmp/train-drafter-wheels || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
      /tmp/train-drafter-wheels/*.whl || exit 1
    ls /tmp/train-drafter-wheels
    python3 -c "import torch, gguf, pydantic; from speculant_tools.builtin import smollm2_gguf; \
print('torch', torch.__version__, torch.cuda.get_device_name(), smollm2_gguf())"
  fi
}

train() {
  local out=${1:?OUT} minutes=${2:-8}
  shift; [ $# -gt 0 ] && shift
  [ "${1:-}" = "--" ] && shift
  mkdir -p "$out" "$work"
  if [ ! -f "$work/checkpoint/drafter.pt" ] && ls "$parts"/checkpoint.tar.part-* \
      >/dev/null 2>&1; then
    cat "$parts"/checkpoint.tar.part-* | tar -xf - -C "$work" || exit 1
    echo "resuming from the carried checkpoint ($(ls "$parts" | wc -l) parts$( \
      [ -d "$work/corpus" ] && echo ', with its corpus'))"
  fi
  local resume=()
  [ -f "$work/checkpoint/drafter.pt" ] && resume=(--resume)
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
  python3 -m speculant train-drafter "${TARGET:-smollm2}" "$work" --device cuda --minutes "$minutes" \
    --no-write-package "${resume[@]}" "$@"
  local status=$?
  for f in drafter.npz drafter_config.json drafter_report.json loss_curves.png train_log.jsonl; do
    [ -f "$work/$f" ] && cp "$work/$f" "$out/"
  done
  if [ -f "$work/checkpoint/drafter.pt" ]; then
    # the checkpoint and the corpus in at most three parts ($OUT holds at most 8 files of
    # 16 MiB); the corpus stays behind where the three would not hold it
    local keep=(checkpoint) bytes
    [ -f "$work/corpus/state.json" ] && keep+=(corpus)
    bytes=$(du -cb "${keep[@]/#/$work/}" | tail -1 | cut -f1)
    if [ "$bytes" -gt $(( 3 * 15 * 1024 * 1024 )) ]; then keep=(checkpoint); fi
    bytes=$(du -cb "${keep[@]/#/$work/}" | tail -1 | cut -f1)
    tar -cf - -C "$work" "${keep[@]}" | split -b $(( bytes / 3 + 1048576 )) - \
      "$out/checkpoint.tar.part-"
    echo "carried back: ${keep[*]}"
  fi
  ls -la "$out"
  [ -f "$work/drafter_report.json" ] && python3 -c "import json; r = json.load(open('$work/drafter_report.json')); \
print(json.dumps({k: r[k] for k in ('validation_loss', 'mean_accepted_length_k4', \
'first_draft_acceptance_k4', 'training', 'corpus', 'timings')}, indent=1))"
  return $status
}

case "$phase" in
  receive) receive "${2:-}" ;;
  restore) shift; mkdir -p "$parts" && for folder in "${@:?the folders of carried parts}"; do
             cp "$folder"/checkpoint.tar.part-* "$parts"/ || exit 1; done; ls -la "$parts" ;;
  train) shift; train "$@" ;;
  *) echo "unknown phase $phase (receive, restore or train)" >&2; exit 2 ;;
esac
