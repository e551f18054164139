#!/usr/bin/env bash
# The resume folder of "Continuing the drafter alone" (README.md), made from the committed
# packages where it runs (the GPU machine: nothing to carry): the target and the drafter written
# back by `speculant export-hf`, the draft model, the tokenizer and the recorded corpus.
#   bash recipes/demo_pair/resume_from_committed.sh [DIR]     (default .demo_pair_prev)
# Then: bash recipes/demo_pair/continue_drafter.sh OUT TAG SECONDS [train.py options...]
set -euo pipefail
dest=${1:-.demo_pair_prev}
work=$(mktemp -d)
python3 -m speculant export-hf src/speculant/demo "$work/pair" > /dev/null
python3 -m speculant export-hf src/speculant/demo_draft "$work/draft" > /dev/null
mkdir -p "$work/rest" "$dest"
cp "$work/pair/config.json" "$work/rest/target_config.json"
cp "$work/pair/drafter.safetensors" "$work/rest/drafter_init.safetensors"
cp "$work/pair/tokenizer.json" "$work/rest/"
cp "$work/draft/model.safetensors" "$work/rest/draft.safetensors"
cp "$work/draft/config.json" "$work/rest/draft_config.json"
cp recipes/demo_pair/results/corpus.json "$work/rest/"
echo '{"stages_done": ["data", "target", "draft"], "eos_id": 0}' > "$work/rest/summary.json"
# train.py's unpack takes plain member names only
(cd "$work/rest" && tar -cf rest.tar target_config.json drafter_init.safetensors tokenizer.json \
  draft.safetensors draft_config.json corpus.json summary.json)
cp "$work/rest/rest.tar" "$dest/"
cp "$work/pair/model.safetensors" "$dest/target.safetensors"
rm -rf "$work"
echo "wrote $dest (target.safetensors, rest.tar)"
