#!/usr/bin/env bash
# The main job: set up, build the GPT trainer (Release), fetch and verify the data, and train a
# 7.2M-parameter GPT-2 (4 layers, width 128, context 64) on 18 public-domain books with ZeRO-3
# over 2 ranks (threads), bf16 compute parameters and gradients (fp32 master weights and states),
# optimizer states on NVMe under a temp dir, a checkpoint every 200 steps
# and at the end. Extra arguments go to zoe-gpt after the defaults below and override them
# (see build-main/examples/gpt/zoe-gpt --help).
# Env: ZOE_BUILD_DIR (default build-main), ZOE_GPT_DATA (default data/gpt),
#      ZOE_DATA_SOURCE (a local copy for scripts/fetch-data.sh --from, instead of npm),
#      ZOE_GPT_CHECKPOINT (keep checkpoints there instead of the temp dir; continue a run with
#      ZOE_GPT_CHECKPOINT=DIR scripts/run-main.sh --resume),
#      ZOE_CUDA (default OFF: the trainer computes on the CPU, so the job skips the CUDA code).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
build=${ZOE_BUILD_DIR:-build-main}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_TESTS=OFF \
  -DZOE_BUILD_BENCH=OFF -DZOE_CUDA="${ZOE_CUDA:-OFF}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target zoe-gpt
data=${ZOE_GPT_DATA:-data/gpt}
if [[ -n "${ZOE_DATA_SOURCE:-}" ]]; then
  scripts/fetch-data.sh --from "$ZOE_DATA_SOURCE" "$data"
else
  scripts/fetch-data.sh "$data"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zoe-gpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nvme"
echo "build + data: $(( $(date +%s) - start )) s"
"$build"/examples/gpt/zoe-gpt --data-dir "$data" --nvme-path "$tmp/nvme" \
  --checkpoint-dir "${ZOE_GPT_CHECKPOINT:-$tmp/checkpoint}" --checkpoint-interval 200 \
  --layers 4 --heads 4 --width 128 --context 64 --batch 16 --micro-batches 1 --steps 450 \
  --lr 3e-3 --warmup 20 --zero-stage 3 --offload-optimizer nvme --world-size 2 --precision bf16 \
  --head-chunk 1024 --eval-interval 100 --eval-batches 16 --metrics "$build/gpt-metrics.csv" "$@"
echo "metrics per step: $build/gpt-metrics.csv"
[[ -z "${ZOE_GPT_CHECKPOINT:-}" ]] &&
  echo "(the checkpoint was in a temp dir, removed now; ZOE_GPT_CHECKPOINT=DIR keeps it)"
echo "main job wall time (build, data, training): $(( $(date +%s) - start )) s"
