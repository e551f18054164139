#!/usr/bin/env bash
# Install speculant into two fresh virtual environments, one per ONNX Runtime flavour, and
# show that each ends up with exactly one of onnxruntime / onnxruntime-gpu.
#   scripts/check_flavours.sh [WORKDIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
for flavour in cpu cuda; do
  python3 -m venv "$work/$flavour"
  "$work/$flavour/bin/pip" install --quiet --disable-pip-version-check "$repo[$flavour]"
  echo "== speculant[$flavour]"
  "$work/$flavour/bin/pip" list --format=freeze 2>/dev/null | grep -iE '^(onnxruntime|onnxruntime-gpu|cupy-cuda13x)==' || true
done
echo "== a CPU-only run of the cpu flavour"
"$work/cpu/bin/speculant" generate --max-new-tokens 8 >/dev/null
echo "== the cuda flavour on a machine without a GPU refuses with a typed error:"
"$work/cuda/bin/speculant" generate --device cuda --max-new-tokens 8 || echo "exit status $?"
