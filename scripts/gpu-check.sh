#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (e.g. an H200). Runs the
# GPU-labelled tests (CUDA device and kernels, the device Adam kernel against the host device
# bit for bit, the GPT trainer's CudaOps against its host twin KernelOps) and a short GPT
# training run on the GPU compared step by step with the same run on the CPU through the CUDA
# backend's host twin (`--host-ops kernels`). Writes these files under $OUT (default
# ./gpu-out): summary.txt, machine.txt, build.log, tests.log, gpt.log, gpt-losses.txt,
# bench.jsonl, overlap.jsonl (the update pipeline's overlap and transfer rates on the GPU),
# gpt-losses-*.txt (zoe.update_in_backward's run against the update at step(), and split master
# weights against fp32 masters with the states and parameters on NVMe, with the update at step()
# and in backward).
#
# Two ways to get the binaries, chosen by what is there:
#  - out/gpu-bundle.tar.xz (made here by scripts/gpu-bundle.sh, carried along): prebuilt
#    binaries, their libraries and the data. For GPU machines without zoe's Debian packages.
#  - otherwise it builds with CUDA from source (needs every package of scripts/setup.sh).
# It installs nothing. Exit status: 0 when every GPU test passed (none skipped), the GPU run's
# losses follow the CPU run's, and the overlap bench met its bounds (step + forward <= 1.10 x
# max(parts), >= 80% of the CPU step hidden); each failure is one line of summary.txt naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
build=${ZOE_BUILD_DIR:-build-gpu}
bundle=${ZOE_GPU_BUNDLE:-out/gpu-bundle.tar.xz}
log() { echo "[gpu-check] $*" | tee -a "$OUT/summary.txt"; }

command -v nvidia-smi >/dev/null || { log "missing tool: nvidia-smi"; exit 2; }
{ nvidia-smi; command -v nvcc && nvcc --version; nproc; } >"$OUT/machine.txt" 2>&1
log "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
start=$(date +%s)
status=0

if [[ -f "$bundle" ]]; then
  root=$(mktemp -d)
  tar -C "$root" -xJf "$bundle" || { log "cannot unpack $bundle"; exit 1; }
  bin=$root/gpu-bundle/bin
  gpt=$bin/zoe-gpt
  data=$root/gpu-bundle/data
  # CUDA's own libraries: the toolkit's, else those of the image's Python wheels (nvidia-*).
  wheels=$(python3 -c 'import importlib, os
dirs = []
for m in ("nvidia.cublas", "nvidia.cuda_runtime", "nvidia.nccl"):
    try:
        dirs += [os.path.join(p, "lib") for p in importlib.import_module(m).__path__]
    except Exception:
        pass
print(":".join(dirs))' 2>/dev/null)
  export LD_LIBRARY_PATH="$root/gpu-bundle/lib:/usr/local/cuda/lib64:${wheels}:${LD_LIBRARY_PATH:-}"
  log "binaries: bundle of commit $(cat "$root/gpu-bundle/commit" 2>/dev/null)"
  for f in "$bin"/*; do echo "== ldd $f"; ldd "$f"; done >>"$OUT/machine.txt" 2>&1
  for t in test_cuda_device test_gpt_cuda; do
    echo "===== $t" >>"$OUT/tests.log"
    timeout 300 "$bin/$t" >>"$OUT/tests.log" 2>&1 || { log "$t failed"; status=1; }
  done
else
  gpt=$build/examples/gpt/zoe-gpt
  data=${ZOE_GPT_DATA:-data/gpt}
  for tool in cmake ninja nvcc; do
    command -v "$tool" >/dev/null || { log "missing tool: $tool"; exit 2; }
  done
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_CUDA=ON -DZOE_GPT_NATIVE=OFF &&
         cmake --build "$build" -j"$(nproc)"; } >"$OUT/build.log" 2>&1; then
    log "configure or build failed (see build.log; without zoe's packages use scripts/gpu-bundle.sh)"
    grep -m20 -E "error|Could not find|FAILED" "$OUT/build.log"; exit 1
  fi
  log "build: $(( $(date +%s) - start )) s"
  # -V: every test's own output lands in the log, so a GoogleTest skip (no usable GPU) shows.
  ctest --test-dir "$build" -L gpu -V --timeout 300 >"$OUT/tests.log" 2>&1 || status=1
  # Each prints its ratio to a bound. The Adam bench measures every store kind, and its
  # default run is long: two sizes and few steps keep it within its limit here.
  for b in "adam/zoe-adam-bench --sizes 16 128 --steps 10" zero/zoe-zero-bench; do
    read -r -a cmd <<<"$b"
    [[ -x "$build/bench/${cmd[0]}" ]] && { timeout 180 "$build/bench/${cmd[0]}" "${cmd[@]:1}" --json >>"$OUT/bench.jsonl" 2>&1 || log "bench ${cmd[0]} failed (or ran past 180 s)"; }
  done
fi

# The update pipeline on the GPU (issue 15): zoe-offload-bench's overlap case on one CUDA rank
# (--launcher): step + next forward against max(parts), the fraction of the CPU step hidden
# behind the forward, and the H2D / D2H rates of pageable copies against pinned cudaMemcpyAsync.
offload_bench=$build/bench/offload/zoe-offload-bench
[[ -n "${bin:-}" && -x "$bin/zoe-offload-bench" ]] && offload_bench=$bin/zoe-offload-bench
if [[ -x "$offload_bench" ]]; then
  overlap_json=$OUT/overlap.jsonl
  if RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 \
     timeout 600 "$offload_bench" --json --launcher --cases overlap --overlap-psi 200 --modules 16 --steps 3 \
       --nvme-path "${TMPDIR:-/tmp}" >"$overlap_json" 2>>"$OUT/tests.log"; then
    if ! python3 - "$overlap_json" >>"$OUT/summary.txt" 2>&1 <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
bad = []
for r in rows:
    print(f"[gpu-check] overlap: {r['case']}: {r['value']:.3f} {r['unit']} (bound {r['bound']:.3f}, ratio {r['ratio']:.3f})")
    if r["case"].endswith("step+forward vs max") and r["ratio"] > 1.10:
        bad.append(f"{r['case']}: ratio {r['ratio']:.3f} > 1.10 (the CPU step is not hidden behind the next forward)")
    if r["case"].endswith("step hidden behind forward") and r["value"] < 0.8:
        bad.append(f"{r['case']}: only {100 * r['value']:.0f}% of the CPU step hidden (< 80%)")
if not rows:
    bad.append("the overlap bench printed no result")
for b in bad:
    print("[gpu-check] FAILED overlap: " + b)
sys.exit(1 if bad else 0)
PY
    then log "the overlap bench missed its bounds (see the 'FAILED overlap' lines above)"; status=1; fi
  else
    log "zoe-offload-bench --launcher failed or timed out (exit $?; its stderr is at the end of tests.log)"; status=1
  fi
else
  log "no zoe-offload-bench at $offload_bench: overlap check skipped"; status=1
fi
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests passed|tests failed" "$OUT/tests.log" | tee -a "$OUT/summary.txt"
# A skipped GPU test on a GPU machine is a failure of this check.
if grep -q "SKIPPED\|Skipped" "$OUT/tests.log"; then log "a GPU test skipped on a GPU machine"; status=1; fi

# The trainer on the GPU (one rank under launcher variables: CudaOps, device Adam, NCCL) against
# the same run on the CPU with the CUDA backend's math (KernelOps): the same fp32 model, data
# and steps, so the losses must agree closely (they differ only in summation order).
# Both in fp32 and in bf16 (--precision: 16-bit parameters and gradients in the engine, the
# trainer's math in fp32 on their exact values); bf16 with a looser bound (the 16-bit rounding
# of gradients summed in another order).
gpt_compare() {  # precision, relative bound
  local prec=$1 bound=$2
  local metrics_cuda metrics_host
  metrics_cuda=$(mktemp --suffix .csv)
  metrics_host=$(mktemp --suffix .csv)
  local args=(--data-dir "$data" --layers 4 --heads 4 --width 128 --context 64 --batch 16 --steps 30
        --warmup 5 --lr 3e-3 --zero-stage 3 --offload-optimizer none --head-precision fp32
        --precision "$prec" --eval-interval 0 --eval-batches 4 --sample-length 0 --log-every 10)
  echo "===== cuda, $prec" >>"$OUT/gpt.log"
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
    timeout 300 "$gpt" --launcher "${args[@]}" --metrics "$metrics_cuda" >>"$OUT/gpt.log" 2>&1 ||
    { log "zoe-gpt --precision $prec on the GPU failed (see gpt.log)"; status=1; }
  echo "===== host, --host-ops kernels, $prec" >>"$OUT/gpt.log"
  timeout 300 "$gpt" --world-size 1 --host-ops kernels "${args[@]}" \
    --metrics "$metrics_host" >>"$OUT/gpt.log" 2>&1 || { log "zoe-gpt --precision $prec on the host failed"; status=1; }
  grep -E "compute:|tokens/s" "$OUT/gpt.log" | tail -2 | tee -a "$OUT/summary.txt"
  if ! python3 - "$metrics_cuda" "$metrics_host" "$bound" >"$OUT/gpt-losses-$prec.txt" 2>&1 <<'EOF'
import csv, sys
cuda, host = ([float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
bound = float(sys.argv[3])
assert len(cuda) == len(host) == 30, (len(cuda), len(host))
worst = 0.0
for i, (c, h) in enumerate(zip(cuda, host)):
    worst = max(worst, abs(c - h) / h)
    print(f"step {i + 1}: cuda {c:.6f} host {h:.6f}")
print(f"largest relative difference {worst:.2e} (bound {bound:.0e})")
assert worst < bound, "the GPU run's losses left the CPU run's"
assert cuda[-1] < cuda[0] - 1.0, "the GPU run did not learn"
EOF
  then log "GPU and CPU losses disagree in $prec (see gpt-losses-$prec.txt)"; status=1; fi
  tail -1 "$OUT/gpt-losses-$prec.txt" | tee -a "$OUT/summary.txt"
}
# Two configurations that must train the GPU run to the same losses, to the last digit (exact
# modes: the update's math is the same), both runs' tokens/s reported:
#  - zoe.update_in_backward: the optimizer states in pinned host memory (offload_optimizer cpu,
#    every sub-group on the CPU optimizer), the update at step() against the update in backward;
#  - zoe.split_master_weights: stage 3 with the states and the bf16 parameter shards on NVMe
#    (under $TMPDIR), fp32 masters against masters split beside the shards.
# gpt_equal_losses NAME ZOE_KEY OFFLOAD_JSON (NVME stands for the run's directory) ZOE_GPT_FLAGS...
gpt_equal_losses() {
  local name=$1 key=$2 offload=$3
  shift 3
  local nvme m0 m1 cfg0 cfg1
  nvme=$(mktemp -d)
  m0=$(mktemp --suffix .csv); m1=$(mktemp --suffix .csv)
  cfg0=$(mktemp --suffix .json); cfg1=$(mktemp --suffix .json)
  local base='"gradient_clipping": 0, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, '"${offload//NVME/$nvme}"', "reduce_bucket_size": 0, "sub_group_size": 1000000}'
  # ZOE_EXTRA: more zoe keys, the same in both runs (e.g. '"update_in_backward": true, ').
  echo "{$base, \"zoe\": {${ZOE_EXTRA:-}\"$key\": false}}" >"$cfg0"
  echo "{$base, \"zoe\": {${ZOE_EXTRA:-}\"$key\": true}}" >"$cfg1"
  local args=(--data-dir "$data" --layers 8 --heads 8 --width 512 --context 128 --batch 8 --steps 20
        --warmup 5 --lr 1e-3 --zero-stage 3 --precision bf16 --nvme-path "$nvme" "$@"
        --eval-interval 0 --eval-batches 2 --sample-length 0 --log-every 5)
  local k cfg met
  for k in 0 1; do
    cfg=$cfg0; met=$m0
    [[ $k == 1 ]] && { cfg=$cfg1; met=$m1; }
    echo "===== cuda, bf16, $name: $key $k" >>"$OUT/gpt.log"
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 \
      timeout 300 "$gpt" --launcher --config "$cfg" "${args[@]}" --metrics "$met" >>"$OUT/gpt.log" 2>&1 ||
      { log "zoe-gpt on the GPU with $key $k failed (see gpt.log)"; status=1; }
    grep -E "tokens/s" "$OUT/gpt.log" | tail -1 | sed "s/^/$key $k: /" | tee -a "$OUT/summary.txt"
  done
  rm -rf "$nvme"
  if ! python3 - "$m0" "$m1" "$key" >"$OUT/gpt-losses-$name.txt" 2>&1 <<'EOF'
import csv, sys
a, b = ([float(r["loss"]) for r in csv.DictReader(open(p))] for p in sys.argv[1:3])
assert len(a) == len(b) == 20, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    print(f"step {i + 1}: {sys.argv[3]} false {x!r} true {y!r}")
assert a == b, f"{sys.argv[3]} changed the losses on the GPU"
print("losses equal at every step")
EOF
  then log "$key changed the GPU run's losses (see gpt-losses-$name.txt)"; status=1; fi
  tail -1 "$OUT/gpt-losses-$name.txt" | tee -a "$OUT/summary.txt"
}
if [[ -x "$gpt" && -d "$data/gutenberg" ]]; then
  gpt_compare fp32 2e-3
  gpt_compare bf16 2e-2
  gpt_equal_losses update-in-backward update_in_backward '"offload_optimizer": {"device": "cpu"}' \
    --offload-optimizer cpu
  gpt_equal_losses split-master split_master_weights \
    '"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}, "offload_param": {"device": "nvme", "nvme_path": "NVME"}, "stage3_param_persistence_threshold": 0' \
    --offload-optimizer nvme --offload-param nvme
  # Split masters with the update in backward: the updates take the shard reads of the step
  # (kept in the parameter tier's read buffers) instead of reading the shards again.
  ZOE_EXTRA='"update_in_backward": true, ' gpt_equal_losses split-master-in-backward split_master_weights \
    '"offload_optimizer": {"device": "nvme", "nvme_path": "NVME"}, "offload_param": {"device": "nvme", "nvme_path": "NVME"}, "stage3_param_persistence_threshold": 0' \
    --offload-optimizer nvme --offload-param nvme
else
  log "no zoe-gpt or no data at $data: trainer comparison skipped"; status=1
fi
# The libtorch adapter (examples/torch_llama) on the GPU needs a CUDA libtorch. Debian's
# libtorch-dev is CPU-only and the adapter computes on the host device only (it does not yet set
# torch's current stream from the engine's compute stream), so this step says why it is skipped.
torch_cuda=$(python3 -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo none)
llama=${build:-build}/examples/torch_llama/zoe-torch-llama
if [[ "$torch_cuda" == 1 && -x "$llama" && -d "$data/gutenberg" ]]; then
  echo "===== zoe-torch-llama" >>"$OUT/torch-llama.log"
  timeout 600 "$llama" --data-dir "$data" --steps 50 >>"$OUT/torch-llama.log" 2>&1 ||
    { log "zoe-torch-llama failed (see torch-llama.log)"; status=1; }
  tail -2 "$OUT/torch-llama.log" | tee -a "$OUT/summary.txt"
else
  log "zoe-torch-llama on the GPU skipped: libtorch with CUDA: $torch_cuda (Debian's libtorch is CPU-only), binary: $([[ -x $llama ]] && echo yes || echo no); the adapter runs on the host device only"
fi
log "done in $(( $(date +%s) - start )) s, status $status"
exit $status
