#!/bin/sh
# Runs 2-rank jobs under a real launcher, the way README.md's launch lines do, and checks them:
# two_process_worker (every collective against direct math) and engine_launch_worker (a ZeRO-3
# training run whose losses and final parameters must equal, bit for bit, the same run with
# the ranks as threads of one process).
#   torchrun             torchrun's default static rendezvous: the agent serves the store on
#                        MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), zoe is its client
#   torchrun-standalone  torchrun --standalone: rank 0 serves zoe's store on MASTER_PORT
#   mpirun               Open MPI's mpirun -np 2 with no MASTER_ADDR/MASTER_PORT
# Exits 77 (ctest: skipped) with the reason when the launcher is not installed.
# Usage: run_under_launcher.sh torchrun|torchrun-standalone|mpirun TWO_PROCESS_WORKER ENGINE_WORKER
set -u
mode=$1 worker=$2 engine=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export ZOE_DEVICE=host
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK TORCHELASTIC_USE_AGENT_STORE

case $mode in
torchrun | torchrun-standalone)
  # torchrun is a Python entry point; find it and the interpreter that has torch.
  if command -v torchrun >/dev/null 2>&1; then
    python=$(head -n 1 "$(command -v torchrun)" | sed 's/^#! *//; s/ .*//')
    launch="torchrun"
  elif /usr/bin/python3 -c 'import torch.distributed.run' >/dev/null 2>&1; then
    python=/usr/bin/python3
    launch="/usr/bin/python3 -m torch.distributed.run"
  else
    echo "SKIP: no torchrun (Debian: apt-get install python3-torch)"
    exit 77
  fi
  version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo unknown)
  echo "launcher: $launch (torch $version, $python)"
  # torch 1.13 on Python 3.11 (Debian 12) cannot parse --redirects/--tee's default "0"
  # (pytorch issue #92319, fixed in 2.0): a mapping for a local rank that does not exist
  # leaves every rank at "no redirect", which is the default.
  if "$python" -c 'import sys; from torch.distributed.elastic.multiprocessing.api import Std; sys.exit(Std.from_str("0") is None)' 2>/dev/null; then
    fix=""
  else
    fix="--redirects 9:0 --tee 9:0"
    echo "(this torchrun needs $fix: torch < 2.0 on Python >= 3.11)"
  fi
  if [ "$mode" = torchrun ]; then
    port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    where="--master_port $port"
  else
    where="--standalone"
  fi
  # Underscore spellings: torch 1.x knows only these; 2.x accepts them too.
  run() { $launch --nproc_per_node 2 $where $fix --no_python "$@"; }
  ;;
mpirun)
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: no mpirun (Debian: apt-get install openmpi-bin)"
    exit 77
  fi
  if ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    echo "SKIP: mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -n 1)); zoe reads OMPI_COMM_WORLD_*"
    exit 77
  fi
  echo "launcher: $(mpirun --version | head -n 1)"
  root=""
  [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
  # --oversubscribe: a CI machine may have fewer than 2 cores (slots).
  run() { mpirun $root --oversubscribe -np 2 "$@"; }
  ;;
*)
  echo "unknown launcher '$mode'"
  exit 2
  ;;
esac

fail=0
echo "--- collectives: two_process_worker"
run "$worker" >"$dir/collectives" 2>&1 || fail=1
cat "$dir/collectives"
echo "--- engine: ZeRO-3, 20 steps"
run "$engine" launcher "$dir/launcher.bin" >"$dir/engine" 2>&1 || fail=1
cat "$dir/engine"
"$engine" threads "$dir/threads.bin" || fail=1
if [ $fail -eq 0 ]; then
  if cmp "$dir/launcher.bin" "$dir/threads.bin"; then
    echo "launcher run == threads run, bit for bit ($(wc -c <"$dir/threads.bin") bytes of losses and parameters)"
  else
    echo "FAIL: the launcher's run differs from the threads' run"
    fail=1
  fi
fi
[ $fail -eq 0 ] && [ "$(grep -c 'all collectives match' "$dir/collectives")" = 2 ] || {
  echo "FAIL"
  exit 1
}
echo "PASS ($mode)"
