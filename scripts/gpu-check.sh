#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (the device tool's lent H200): build zoe with
# CUDA, run the GPU-labelled tests (CUDA device, kernels, the device Adam kernel against the
# host device bit for bit) and the benches, and write everything under $OUT (default
# ./gpu-out). Run it after the CPU build and tests pass; it installs nothing (the device
# machine reaches no package mirror), so it stops with a clear message if a tool is missing.
# Exit status: 0 when the build and every GPU test passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
build=${ZOE_BUILD_DIR:-build-gpu}
log() { echo "[gpu-check] $*" | tee -a "$OUT/summary.txt"; }

for tool in cmake ninja nvcc nvidia-smi; do
  command -v "$tool" >/dev/null || { log "missing tool: $tool"; exit 2; }
done
{ nvidia-smi; nvcc --version; nproc; } >"$OUT/machine.txt" 2>&1
log "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"

start=$(date +%s)
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_CUDA=ON -DZOE_BUILD_EXAMPLES=OFF \
    >"$OUT/configure.log" 2>&1; then
  log "configure failed (see configure.log)"; tail -30 "$OUT/configure.log"; exit 1
fi
if ! cmake --build "$build" -j"$(nproc)" >"$OUT/build.log" 2>&1; then
  log "build failed (see build.log)"; grep -m20 -E "error|FAILED" "$OUT/build.log"; exit 1
fi
log "build: $(( $(date +%s) - start )) s"

status=0
# -V: every test's own output lands in the log, so a GoogleTest skip (no usable GPU) shows.
# The GPU tests: CUDA device, kernels, the GPT trainer's CudaOps (tests/gpt, built from
# gpt_core.cmake even with the examples off).
ctest --test-dir "$build" -L gpu -V --timeout 300 >"$OUT/ctest-gpu.log" 2>&1 || status=1
grep -E "tests passed|Passed|Failed|SKIPPED|Skipped" "$OUT/ctest-gpu.log" | tee -a "$OUT/summary.txt"
# A skipped GPU test on a GPU machine is a failure of this check.
if grep -q "Skipped\|SKIPPED" "$OUT/ctest-gpu.log"; then log "a GPU test skipped on a GPU machine"; status=1; fi

# Benches: each prints its ratio against a bound measured in the same run (--json lines).
for b in adam/zoe-adam-bench zero/zoe-zero-bench; do
  [[ -x "$build/bench/$b" ]] || continue
  timeout 120 "$build/bench/$b" --json >"$OUT/$(basename "$b").jsonl" 2>"$OUT/$(basename "$b").err" ||
    log "bench $b failed"
done
log "done in $(( $(date +%s) - start )) s, status $status"
exit $status
