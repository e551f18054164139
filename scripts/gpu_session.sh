#!/usr/bin/env bash
# The CUDA evidence, profiles and benchmarks of one GPU session, one phase per device call.
# Prerequisite: onnxruntime-gpu, onnxruntime-genai-cuda, onnx-ir, pydantic, ruamel.yaml and
# pytest staged into /tmp/site (../shared/gpu/README.md; docs/benchmarks/README.md, "CUDA").
#
#   bash scripts/gpu_session.sh tests  "$OUT"   # CUDA tests + evidence gate + profiles (~5 min)
#   bash scripts/gpu_session.sh bench  "$OUT"   # ~1B float16 pair with both anchors (~8 min)
#   bash scripts/gpu_session.sh demo   "$OUT"   # demo pair in float16 with both anchors (~4 min)
#   bash scripts/gpu_session.sh kernels "$OUT"  # ORT's profiler on the ~1B targets (~3 min)
#
# Staging: each call carries the working tree plus one chunk, 64 MiB at most; chunks staged
# when the tree was smaller can stop fitting after commits ("the working tree is larger than
# 64 MiB"). Stage again, or re-split the wheel to the room left: 63 MiB - tree - 0.5 MiB, tree
# = the size of `git ls-files` plus untracked, unignored files.
#
# Phase `tests` also derives the ~1B cost-scaled pair and its float16 variant in the
# background (/tmp/scaled), which `bench` uses. Each phase writes at most 8 files to OUT.
set -u
phase=${1:?phase: tests, bench or demo}
out=${2:?OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
py=python3
prompts=docs/benchmarks/val8-prompts.json
stage() { echo "== $1 ($(date +%T))"; }

scaled() {  # the ~1B pair, its float16 variant and the float16 draft model (skips what exists)
  ([ -d /tmp/scaled/demo-1b ] || $py -m speculant scale-target src/speculant/demo \
      /tmp/scaled/demo-1b --params 1B) &&
  ([ -d /tmp/scaled/demo-1b-fp16 ] || $py -m speculant convert /tmp/scaled/demo-1b \
      /tmp/scaled/demo-1b-fp16 --dtype float16) &&
  ([ -d /tmp/draft16 ] || $py -m speculant convert src/speculant/demo_draft /tmp/draft16 \
      --dtype float16)
}

profile() {  # name package k [extra]: cProfile of one pass over the prompt set on CUDA
  $py scripts/profile_chained.py "$2" --prompts $prompts --device cuda --k "$3" \
    --new-tokens 64 --out "/tmp/profiles/$1.txt" > /dev/null 2>&1 || echo "profile $1 failed"
  head -2 "/tmp/profiles/$1.txt" 2>/dev/null
}

case $phase in
tests)
  stage "scale-target 1B + float16 variants (background)"
  (scaled > /tmp/scaled.log 2>&1; echo "exit $?" >> /tmp/scaled.log) &
  stage "CUDA tests (JUnit) and the chained fixture runs"
  timeout 420 $py scripts/cuda_evidence.py /tmp/evidence 2>&1 | tail -25
  cp /tmp/evidence/cuda-residency.json "$out/" 2>/dev/null
  stage "evidence gate on CUDA: the committed float32 pair"
  SPECULANT_EVIDENCE_DEVICE=cuda SPECULANT_REQUIRE_EVIDENCE=1 timeout 120 $py -m pytest -q \
    -p no:cacheprovider -m "not smollm2" tests/evidence/test_demo_pair.py 2>&1 | tail -3
  stage "evidence gate on CUDA: its float16 convert (the fused target)"
  [ -d /tmp/demo16 ] || $py -m speculant convert src/speculant/demo /tmp/demo16 --dtype float16
  cp src/speculant/demo/val_prompts.json /tmp/demo16/
  SPECULANT_EVIDENCE_PAIR=/tmp/demo16 SPECULANT_EVIDENCE_DEVICE=cuda SPECULANT_REQUIRE_EVIDENCE=1 \
    timeout 120 $py -m pytest -q -p no:cacheprovider -m "not smollm2" tests/evidence/test_demo_pair.py 2>&1 | tail -3
  stage "profiles: the demo pair (float32) on CUDA"
  mkdir -p /tmp/profiles
  profile demo-greedy src/speculant/demo 0
  profile demo-chained-k4 src/speculant/demo 4
  stage "waiting for the ~1B pair"
  wait
  tail -4 /tmp/scaled.log
  stage "profiles: the ~1B float16 pair on CUDA"
  profile 1b16-greedy /tmp/scaled/demo-1b-fp16 0
  profile 1b16-chained-k4 /tmp/scaled/demo-1b-fp16 4
  tar -cf "$out/profiles.tar" -C /tmp profiles
  stage done
  ;;
bench)
  scaled > /dev/null 2>&1 || { echo "the ~1B pair is missing and could not be made"; exit 1; }
  stage "bench: ~1B float16 pair on CUDA with both anchors"
  timeout 560 $py -m speculant bench /tmp/scaled/demo-1b-fp16 --device cuda --draft /tmp/draft16 \
    --prompts $prompts --anchors hf,genai --anchor-dir /tmp/anchors-1b16 --new-tokens 64 \
    --warmup 1 --repeats 3 --k 2 --k 4 --out /tmp/b/cuda-1b-fp16-anchors > /tmp/b-1b16.log 2>&1
  tail -45 /tmp/b-1b16.log; cp /tmp/b-1b16.log /tmp/b/cuda-1b-fp16-anchors/ 2>/dev/null
  tar -cf "$out/cuda-1b-fp16-anchors.tar" -C /tmp/b cuda-1b-fp16-anchors
  stage done
  ;;
demo)
  [ -d /tmp/demo16 ] || $py -m speculant convert src/speculant/demo /tmp/demo16 --dtype float16
  [ -d /tmp/draft16 ] || $py -m speculant convert src/speculant/demo_draft /tmp/draft16 \
    --dtype float16
  stage "bench: the demo pair in float16 on CUDA with both anchors"
  timeout 560 $py -m speculant bench /tmp/demo16 --device cuda --draft /tmp/draft16 \
    --prompts $prompts --anchors hf,genai --anchor-dir /tmp/anchors-demo16 --new-tokens 64 \
    --warmup 1 --repeats 5 --k 2 --k 4 --out /tmp/b/cuda-demo-fp16-anchors > /tmp/b-demo16.log 2>&1
  tail -45 /tmp/b-demo16.log; cp /tmp/b-demo16.log /tmp/b/cuda-demo-fp16-anchors/ 2>/dev/null
  tar -cf "$out/cuda-demo-fp16-anchors.tar" -C /tmp/b cuda-demo-fp16-anchors
  stage done
  ;;
kernels)
  scaled > /dev/null 2>&1 || { echo "the ~1B pair is missing and could not be made"; exit 1; }
  stage "ORT profiler: the ~1B target, float16 fused and float32 node by node"
  for spec in "demo-1b-fp16 1 fused-w1" "demo-1b-fp16 5 fused-w5" "demo-1b 1 fp32-explicit-w1"; do
    set -- $spec
    timeout 150 $py scripts/ort_profile.py /tmp/scaled/$1 --device cuda --width $2 --runs 20 \
      --out "$out/ort-profile-1b-$3.json" 2>&1 | grep -v "^\s*$" | head -14
  done
  stage done
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
