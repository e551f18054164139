#!/usr/bin/env bash
# The demo pair and the ~1B cost-scaled target on the GPU machine, in one call.
# Prerequisite: onnxruntime-gpu (+ extras) staged into /tmp/site (../shared/gpu/README.md).
#   bash scripts/gpu_demo_pair.sh OUT_DIR
# Writes to OUT_DIR (at most 8 files): gate.txt, proposers.txt, and one tarball per bench run.
set -u
out=${1:?OUT_DIR}
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
py=python3
stage() { echo "== $1 ($(date +%T))"; }

stage "evidence gate on CUDA: the committed float32 pair" | tee -a "$out/gate.txt"
SPECULANT_EVIDENCE_DEVICE=cuda SPECULANT_REQUIRE_EVIDENCE=1 timeout 120 $py -m pytest -q \
  -p no:cacheprovider -m "not smollm2" tests/evidence/test_demo_pair.py 2>&1 | tail -5 | tee -a "$out/gate.txt"
stage "evidence gate on CUDA: the float16 variant from speculant convert" | tee -a "$out/gate.txt"
$py -m speculant convert src/speculant/demo /tmp/demo16 --dtype float16 2>&1 | tail -1 | tee -a "$out/gate.txt"
cp src/speculant/demo/val_prompts.json /tmp/demo16/
SPECULANT_EVIDENCE_PAIR=/tmp/demo16 SPECULANT_EVIDENCE_DEVICE=cuda SPECULANT_REQUIRE_EVIDENCE=1 \
  timeout 120 $py -m pytest -q -p no:cacheprovider -m "not smollm2" tests/evidence/test_demo_pair.py 2>&1 | tail -5 \
  | tee -a "$out/gate.txt"

stage "three proposers on CUDA, demo pair" | tee -a "$out/proposers.txt"
for args in "--speculative --k 4" "--draft src/speculant/demo_draft --k 4" "--proposer lookup --k 4" \
            "--speculative --k 4 --temperature 0.8 --seed 3"; do
  echo "-- generate --device cuda $args" >> "$out/proposers.txt"
  timeout 60 $py -m speculant generate --device cuda --prompt "import os" --max-new-tokens 64 \
    $args --stats >> "$out/proposers.txt" 2>&1
done

stage "bench: demo pair on CUDA, with anchors"
timeout 200 $py -m speculant bench src/speculant/demo --device cuda --draft src/speculant/demo_draft \
  --prompts docs/benchmarks/val8-prompts.json --warmup 1 --repeats 3 --new-tokens 64 \
  --anchors hf,genai --out /tmp/b/cuda-demo-pair > /tmp/b-demo.log 2>&1
tail -3 /tmp/b-demo.log; cp /tmp/b-demo.log /tmp/b/cuda-demo-pair/ 2>/dev/null
tar -cf "$out/cuda-demo-pair.tar" -C /tmp/b cuda-demo-pair 2>/dev/null

stage "scale-target 1B"
timeout 300 $py -m speculant scale-target src/speculant/demo /tmp/scaled/demo-1b --params 1B 2>&1 | tail -3
stage "bench: ~1B cost-scaled target on CUDA"
timeout 400 $py -m speculant bench /tmp/scaled/demo-1b --device cuda --draft src/speculant/demo_draft \
  --prompts docs/benchmarks/val8-prompts.json --warmup 1 --repeats 3 --new-tokens 64 \
  --out /tmp/b/cuda-1b > /tmp/b-1b.log 2>&1
tail -3 /tmp/b-1b.log; cp /tmp/b-1b.log /tmp/b/cuda-1b/ 2>/dev/null
tar -cf "$out/cuda-1b.tar" -C /tmp/b cuda-1b 2>/dev/null
stage done
