#!/usr/bin/env bash
# The scale demo (not in CI): a GPT-2-style model of >= 3.0B parameters trained on this machine's
# CPU at ZeRO-3, one rank, bf16, activation checkpointing, with the fp32 master weights, exp_avg,
# exp_avg_sq, the fp32 gradients AND the bf16 parameters on NVMe (offload_optimizer and
# offload_param both nvme): a model whose optimizer states alone are twice the RAM.
# It checks the free disk at the NVMe path first (and refuses, saying how much it needs), builds
# zoe-gpt and zoe-estimate (Release, own build dir), measures the path's sequential O_DIRECT
# write/read bound with dd, trains with --step-report and prints: parameters, NVMe bytes per
# step measured (/proc/self/io) against the formula, host memory peak (VmHWM) and pinned staging,
# construction time and GB/s against the dd bound, step time, step time over max(compute alone,
# NVMe I/O alone), and zoe-estimate's prediction for the same configuration next to the
# engine's memory report (device buffers against the allocated peak, torch's
# max_memory_allocated; the reserved peak beside it). docs/performance.md "The scale demo" records runs and explains the method.
# Usage: scripts/scale-demo.sh [extra zoe-gpt flags]   (they override the defaults below)
# Env: ZOE_BUILD_DIR (default build-scale), ZOE_GPT_DATA (default data/gpt), ZOE_DATA_SOURCE (as
#      scripts/run-main.sh), ZOE_SCALE_NVME (the NVMe directory; default /work/zoe-scale-nvme if
#      /work exists, else $TMPDIR/zoe-scale-nvme; the run's files are removed at the end),
#      ZOE_SCALE_LAYERS (32) ZOE_SCALE_WIDTH (2816) ZOE_SCALE_HEADS (22) ZOE_SCALE_CONTEXT (256)
#      ZOE_SCALE_STEPS (5) ZOE_SCALE_BATCH (1) ZOE_SCALE_LR (2e-6, constant: Adam's first steps move
#      every weight by ~lr, coherently across a 2816-wide residual stream and 64 residual
#      branches; 3e-5 took the 32-layer model's loss from 11.19 to 14.67 in one step),
#      ZOE_SCALE_MIN_PARAMS (3.0e9: refuse a smaller model unless set lower, for a trial run),
#      ZOE_SCALE_UPDATE_IN_BACKWARD (1: zoe.update_in_backward; 0: the update starts at step()),
#      ZOE_SCALE_STATE_DTYPE (fp32, or bf16: zoe.optimizer_state_dtype, exp_avg / exp_avg_sq in bf16),
#      ZOE_SCALE_SPLIT_MASTER (0; 1: zoe.split_master_weights, masters as low halves + a bit on NVMe),
#      ZOE_SCALE_HOST_BUDGET (0: zoe.host_memory_budget in bytes, e.g. 2 per parameter keeps the
#      bf16 shards in host memory),
#      ZOE_SCALE_PARAM_BUFFERS (4: offload_param.buffer_count, the pinned read buffers of the
#      parameter shards; with the update in backward and split masters, the reads kept for the
#      updates share them).
set -euo pipefail
cd "$(dirname "$0")/.."
L=${ZOE_SCALE_LAYERS:-32} C=${ZOE_SCALE_WIDTH:-2816} H=${ZOE_SCALE_HEADS:-22} T=${ZOE_SCALE_CONTEXT:-256}
STEPS=${ZOE_SCALE_STEPS:-5} B=${ZOE_SCALE_BATCH:-1} LR=${ZOE_SCALE_LR:-2e-6} V=50257
default_nvme=${TMPDIR:-/tmp}/zoe-scale-nvme
[[ -d /work ]] && default_nvme=/work/zoe-scale-nvme
nvme=${ZOE_SCALE_NVME:-$default_nvme}
build=${ZOE_BUILD_DIR:-build-scale}
data=${ZOE_GPT_DATA:-data/gpt}

# --- 1. The model's size and the disk it needs (before anything else) ----------------------------
# Psi = V*C + T*C + L*(12 C^2 + 13 C) + 2C (GPT-2, wte tied to the head, as HF counts).
psi=$(( V*C + T*C + L*(12*C*C + 13*C) + 2*C ))
min_params=$(python3 -c "print(int(float('${ZOE_SCALE_MIN_PARAMS:-3.0e9}')))")
if (( psi < min_params )); then
  echo "scale-demo: $psi parameters (layers $L, width $C) < ZOE_SCALE_MIN_PARAMS=$min_params; refusing" >&2
  exit 2
fi
# On NVMe at most: fp32 master + exp_avg + exp_avg_sq (12 B) + bf16 gradient (2 B) + bf16
# parameters (2 B) per element, rounded up to 18 Psi (ZeRO-Infinity's fp32 gradient), plus each tensor's 4 KiB extent rounding: headroom 5% + 2 GiB. The dd
# test file (4 GiB) is removed before the run.
states=$(( 18*psi ))
dd_bytes=$(( 4 << 30 ))
need=$(( states + states/20 + (2 << 30) ))
mkdir -p "$nvme"
avail=$(df --output=avail -B1 "$nvme" | tail -1 | tr -d ' ')
gb() { python3 -c "print(f'{$1/1e9:.2f} GB')"; }
echo "scale-demo: model $psi parameters (layers $L, heads $H, width $C, context $T, vocab $V)"
echo "scale-demo: NVMe path $nvme needs $(gb $need) free ($(gb $states) of states at most: 12 B fp32 master+exp_avg+exp_avg_sq, up to 4 B gradient, 2 B bf16 parameter per element; + 5% + 2 GB headroom); available $(gb $avail)"
if (( avail < need )); then
  echo "scale-demo: refusing: $(gb $avail) free at $nvme, need $(gb $need). Free disk, point ZOE_SCALE_NVME elsewhere, or lower ZOE_SCALE_LAYERS." >&2
  exit 2
fi

# --- 2. Build and data ----------------------------------------------------------------------------
start=$(date +%s)
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_BUILD_TESTS=OFF -DZOE_BUILD_BENCH=OFF \
  -DZOE_CUDA="${ZOE_CUDA:-OFF}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target zoe-gpt zoe-estimate
if [[ -n "${ZOE_DATA_SOURCE:-}" ]]; then
  scripts/fetch-data.sh --from "$ZOE_DATA_SOURCE" "$data"
else
  scripts/fetch-data.sh "$data"
fi
echo "scale-demo: build + data $(( $(date +%s) - start )) s"

run=$(mktemp -d "$nvme/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
log=$build/scale-demo.log

# --- 3. The path's sequential O_DIRECT bound (dd, 16 MiB blocks) ----------------------------------
dd_rate() { # dd's summary line -> bytes/s
  python3 -c "import re,sys; l=sys.stdin.read().strip().splitlines()[-1]; b=int(l.split()[0]); s=float(re.search(r', ([0-9.]+) s,', l).group(1)); print(b/s)"
}
write_bw=$(dd if=/dev/zero of="$run/dd.bin" bs=16M count=$(( dd_bytes >> 24 )) oflag=direct conv=fsync 2>&1 | dd_rate)
read_bw=$(dd if="$run/dd.bin" of=/dev/null bs=16M iflag=direct 2>&1 | dd_rate)
rm -f "$run/dd.bin"
echo "scale-demo: dd bound at $nvme: write $(gb $write_bw)/s, read $(gb $read_bw)/s (O_DIRECT, 16 MiB blocks, $(gb $dd_bytes))"

# --- 4. The engine's configuration (zoe-gpt and zoe-estimate read the same file) -----------------
# offload_param.buffer_size must hold the largest module's shard: the embeddings (wte + wpe).
# zoe.update_in_backward (ZOE_SCALE_UPDATE_IN_BACKWARD, default 1): each block's CPU update
# (NVMe reads, AdamW, writes: 26 of the step's 30 bytes per parameter) starts as soon as its
# gradient is reduced, overlapping the rest of backward too, and the gradients wait in a few host
# buffers instead of going to NVMe (34 bytes per parameter with the update at step(); 38 with
# ZeRO-Infinity's fp32 gradient); exact, and it needs gradient_clipping 0 (a clip needs every
# gradient's norm first). ZOE_SCALE_STATE_DTYPE=bf16 stores exp_avg / exp_avg_sq in bf16 (22 bytes).
UIB=true
[[ "${ZOE_SCALE_UPDATE_IN_BACKWARD:-1}" == 0 ]] && UIB=false
SDT=${ZOE_SCALE_STATE_DTYPE:-fp32}
SPLIT=false
[[ "${ZOE_SCALE_SPLIT_MASTER:-0}" == 1 ]] && SPLIT=true
BUDGET=${ZOE_SCALE_HOST_BUDGET:-0}
buffer_size=$(( V*C + T*C + 4096 ))
cfg=$run/ds_config.json
cat >"$cfg" <<EOF
{
  "train_micro_batch_size_per_gpu": $B,
  "gradient_accumulation_steps": 1,
  "bf16": {"enabled": true},
  "gradient_clipping": 0,
  "zoe": {"update_in_backward": $UIB, "optimizer_state_dtype": "$SDT", "split_master_weights": $SPLIT,
          "host_memory_budget": $BUDGET},
  "zero_optimization": {
    "stage": 3,
    "reduce_bucket_size": 0,
    "offload_optimizer": {"device": "nvme", "nvme_path": "$run", "buffer_count": 4},
    "offload_param": {"device": "nvme", "nvme_path": "$run", "buffer_count": ${ZOE_SCALE_PARAM_BUFFERS:-4}, "buffer_size": $buffer_size}
  }
}
EOF
echo "scale-demo: zoe-estimate for this configuration:"
"$build"/tools/zoe-estimate/zoe-estimate --gpt "$L,$C,$V,$T" --world-size 1 --gpus-per-node 1 \
  --host-memory "$(free -b | awk '/^Mem:/ {print $2}')B" --gpu-memory 1TB --nvme "${avail}B" \
  --micro-batch "$B" --config "$cfg" --json >"$build/scale-estimate.json"
python3 - "$build/scale-estimate.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["config"]
def f(x): return f"{x/2**30:.2f} GiB"
print(f"  model states: nvme {f(e['model_states']['nvme'])}, host {f(e['model_states']['host'])}, device {f(e['model_states']['device'])}; "
      f"buffers: host {f(e['buffers']['host'])}, device {f(e['buffers']['device'])}")
EOF

# --- 5. The run ----------------------------------------------------------------------------------
echo "scale-demo: training (log: $log)"
t0=$(date +%s)
"$build"/examples/gpt/zoe-gpt --config "$cfg" --data-dir "$data" --nvme-path "$run" \
  --layers "$L" --heads "$H" --width "$C" --context "$T" --batch "$B" --micro-batches 1 \
  --steps "$STEPS" --warmup 1 --lr "$LR" --min-lr-ratio 1 --zero-stage 3 --world-size 1 \
  --offload-optimizer nvme --offload-param nvme --activation-checkpointing --precision bf16 \
  --eval-interval 0 --eval-batches 1 --sample-length 0 --log-every 1 --step-report \
  --metrics "$build/scale-metrics.csv" "$@" 2>&1 | tee "$log"
echo "scale-demo: zoe-gpt wall time $(( $(date +%s) - t0 )) s"

# --- 6. The figures ----------------------------------------------------------------------------
python3 - "$log" "$build/scale-estimate.json" "$psi" "$write_bw" "$read_bw" "$build/scale-metrics.csv" "$(nproc)" "$UIB" "$SDT" "$SPLIT" "$BUDGET" <<'EOF'
import csv, json, re, sys
log, est, psi, wbw, rbw, metrics, cores = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
uib, sdt, split, budget = sys.argv[8], sys.argv[9], sys.argv[10], int(sys.argv[11])
text = open(log).read()
steps = [tuple(map(float, m)) for m in re.findall(
    r"step-report: step \d+: ([0-9.]+) s; trainer compute ([0-9.]+) s, in engine calls ([0-9.]+) s; NVMe read ([0-9.]+) GB, written ([0-9.]+) GB", text)]
con = re.search(r"construction \(first begin_forward\) ([0-9.]+) s, ([0-9.]+) GB written \([0-9.]+ GB/s\), of which ([0-9.]+) s", text)
mem = re.search(r"VmHWM ([0-9.]+) GiB.*pinned staging ([0-9.]+) GiB; host buffers ([0-9.]+) GiB.*device buffers ([0-9.]+) GiB.*device allocated peak ([0-9.]+) GiB, reserved peak ([0-9.]+) GiB", text)
states = re.search(r"model states: host ([0-9.]+) MiB, nvme ([0-9.]+) MiB", text)
e = json.load(open(est))["config"]
losses = [float(r["loss"]) for r in csv.DictReader(open(metrics))]
# Step k's record runs from its start to step k+1's: the update of step k-1 (which overlaps step
# k's forward) and step k's forward and backward. The first also holds the construction, the
# last also waits for its own update (synchronize), so the step time is the mean of the others.
steady = steps[1:-1] if len(steps) > 2 else steps[-1:]
n = len(steady)
wall = sum(s[0] for s in steady) / n
compute = sum(s[1] for s in steady) / n
# Per step over the whole run: the steps' records cover every byte from the first step's start
# to the last update's end, construction's writes included (taken out).
read = sum(s[3] for s in steps) * 1e9 / len(steps)
written = (sum(s[4] for s in steps) * 1e9 - float(con.group(2)) * 1e9) / len(steps)
# The formula, zoe-estimate's for this configuration (RankEstimate::nvme_traffic): the step reads
# every sub-group's master+exp_avg+exp_avg_sq (12 B, 8 with bf16 states) and, unless it waited in
# host memory, its bf16 gradient (2 B), and writes the states back and the new bf16 parameters
# (2 B); backward writes the gradient unless it waits in host memory; forward and backward
# (recompute inside its scope) each read the bf16 parameters (2 B + 2 B) unless a shard is still in
# a staging buffer.
f_read, f_write = e["nvme_read_bytes_per_step"], e["nvme_written_bytes_per_step"]
io_alone = read / rbw + written / wbw
GB = 1e9
print("\n==== scale-demo summary ====")
print(f"parameters: {psi:,} ({psi/1e9:.3f} B)")
print(f"loss per step: {' '.join(f'{x:.3f}' for x in losses)} (ln V = 10.825)")
print(f"mode: zoe.update_in_backward {uib}, zoe.optimizer_state_dtype {sdt}, zoe.split_master_weights {split}, "
      f"zoe.host_memory_budget {budget/2**30:.2f} GiB ({budget/psi:.2f} B per parameter)")
print(f"NVMe bytes per step (/proc/self/io, mean of {len(steps)} steps): read {read/GB:.2f} GB, written {written/GB:.2f} GB; "
      f"formula read {f_read/GB:.2f} GB, written {f_write/GB:.2f} GB; measured/formula {read/f_read:.3f} / {written/f_write:.3f}")
print(f"NVMe bytes per parameter per step: read {read/psi:.3f}, written {written/psi:.3f}, moved {(read+written)/psi:.3f} "
      f"(formula {f_read/psi:.2f} + {f_write/psi:.2f} = {(f_read+f_write)/psi:.2f}; ZeRO-Infinity's: 20 + 18 = 38)")
print(f"host memory: VmHWM {mem.group(1)} GiB (goal <= 8 GiB); pinned staging {mem.group(2)} GiB; "
      f"device buffers of the host device (in host memory): allocated peak {mem.group(5)} GiB, "
      f"reserved peak {mem.group(6)} GiB (with its block cache)")
print(f"construction: {con.group(1)} s for {con.group(2)} GB written = {float(con.group(2))/float(con.group(1)):.3f} GB/s "
      f"vs dd write bound {wbw/GB:.3f} GB/s ({float(con.group(2))/float(con.group(1))/(wbw/GB):.2f} of it); "
      f"{con.group(3)} s of it computing GPT-2's initial values (Box-Muller in double, {float(con.group(3))*1e9/psi:.1f} ns per element)")
print(f"step time (mean of steps 2-{len(steps)-1}): {wall:.1f} s; trainer compute {compute:.1f} s; "
      f"NVMe I/O alone (bytes / dd bound) {io_alone:.1f} s")
print(f"step / max(compute alone, NVMe I/O alone) = {wall:.1f} / {max(compute, io_alone):.1f} = {wall/max(compute, io_alone):.3f} (goal <= 1.15)")
print(f"zoe-estimate vs measured: nvme model states {e['model_states']['nvme']/2**30:.2f} GiB vs {float(states.group(2))/1024:.2f} GiB; "
      f"host buffers {e['buffers']['host']/2**30:.2f} GiB vs {mem.group(3)} GiB (pinned {mem.group(2)} GiB); "
      f"device buffers {(e['model_states']['device'] + e['buffers']['device'])/2**30:.3f} GiB vs allocated peak {mem.group(5)} GiB "
      f"(ratio {(e['model_states']['device'] + e['buffers']['device'])/2**30/float(mem.group(5)):.3f}; reserved peak {mem.group(6)} GiB, block cache included)")
print(f"machine: {cores} cores shared with other processes (load average now: {open('/proc/loadavg').read().split()[0]})")
EOF
