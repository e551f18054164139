#!/usr/bin/env bash
# Continue the demo drafter alone on the GPU machine and build what the runtime benches: train
# (the committed target and draft model unchanged), export the pair, and widen it to the
# realistic ~1B float16 static pair with the int4 drafter.
#   bash recipes/demo_pair/continue_drafter.sh OUT TAG SECONDS [train.py options...]
# run recipes/demo_pair/resume_from_committed.sh first (it writes .demo_pair_prev from the committed
# packages where it runs). Leaves /tmp/pair_TAG (the float32 pair) and /tmp/real1b_TAG; returns OUT/TAG/
# {rest.tar, train.out, model.onnx} (rest.tar: the training folder less the target).
# Bench afterwards: speculant bench /tmp/real1b_TAG --device cuda --proposer chained ...
set -u
out=${1:?OUT}; tag=${2:?TAG}; seconds=${3:?SECONDS}; shift 3
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$out/$tag"
python3 recipes/demo_pair/train.py --out "/tmp/demo_pair_$tag" --resume-from .demo_pair_prev \
  --pack "/tmp/pack_$tag" --drafter-init "/tmp/demo_pair_$tag/drafter_init.safetensors" \
  --drafter-seconds "$seconds" --draft-seconds 1 --deadline-seconds 0 "$@" \
  > "$out/$tag/train.out" 2>&1
cp "/tmp/pack_$tag/rest.tar" "$out/$tag/"
python3 recipes/demo_pair/export_package.py "/tmp/demo_pair_$tag" --pair "/tmp/pair_$tag" \
  --draft "/tmp/pair_draft_$tag" | tail -1
cp "/tmp/pair_$tag/assistant/model.onnx" "$out/$tag/"
python3 -m speculant convert "/tmp/pair_$tag" "/tmp/d16_$tag" --dtype float16 --cache static | tail -1
python3 -m speculant scale-target "/tmp/d16_$tag" "/tmp/real1b_$tag" --shape realistic-1b \
  --check-tokens 0 --quantize-drafter int4 | tail -2
grep -v "drafter step" "$out/$tag/train.out" | tail -9
