#!/usr/bin/env bash
# Continue the demo drafter alone on the GPU machine, then measure it there in the runtime:
# train (the committed target and draft model unchanged), export the pair, put its assistant
# into a copy of src/speculant/demo, and bench chained decoding on the realistic ~1B widening.
#   bash recipes/demo_pair/continue_drafter.sh OUT SECONDS GREEDY_FRAC LR   (carry .demo_pair_prev;
#   its making: recipes/demo_pair/README.md, "Continuing the drafter alone")
set -u
out=${1:?OUT}; seconds=${2:-200}; frac=${3:-0.75}; lr=${4:-7e-4}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
python3 recipes/demo_pair/train.py --out /tmp/demo_pair --resume-from .demo_pair_prev --pack "$out" \
  --drafter-init /tmp/demo_pair/drafter_init.safetensors --drafter-seconds "$seconds" \
  --draft-seconds 1 --drafter-lr "$lr" --drafter-greedy-frac "$frac" --drafter-greedy-pool 12288 \
  --deadline-seconds 0 2>&1 | tee "$out/train.out" | grep -v "drafter step" | tail -12
python3 recipes/demo_pair/export_package.py /tmp/demo_pair --pair /tmp/pair --draft /tmp/pair_draft | tail -1
rm -rf /tmp/demo_new && cp -r src/speculant/demo /tmp/demo_new && cp /tmp/pair/assistant/model.onnx /tmp/demo_new/assistant/
python3 -m speculant convert /tmp/demo_new /tmp/d16n --dtype float16 --cache static | tail -1
python3 -m speculant scale-target /tmp/d16n /tmp/real1b_new --shape realistic-1b --check-tokens 0 | tail -1
timeout 150 python3 -m speculant bench /tmp/real1b_new --device cuda --prompts docs/benchmarks/val8-prompts.json \
  --proposer chained --new-tokens 64 --warmup 1 --repeats 3 --k 4 --k auto --out /tmp/b/real1b-new > /tmp/bn.log 2>&1
sed -n 10,16p /tmp/b/real1b-new/bench.md; cp /tmp/b/real1b-new/bench.md "$out/bench-real1b-new.md"
