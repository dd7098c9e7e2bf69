#!/bin/sh
# Starts two_process_worker as 2 processes, as a user's launcher would (torchrun-style
# variables), rank 1 first so it has to wait for rank 0's rendezvous store. Passes when
# both exit 0.
set -u
worker=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZOE_DEVICE=host
RANK=1 LOCAL_RANK=1 timeout $((60 * ${ZOE_TEST_TIMEOUT_SCALE:-1})) "$worker" >"$dir/1" 2>&1 &
pid1=$!
sleep 0.3
RANK=0 LOCAL_RANK=0 timeout $((60 * ${ZOE_TEST_TIMEOUT_SCALE:-1})) "$worker" >"$dir/0" 2>&1 &
pid0=$!
wait $pid0; rc0=$?
wait $pid1; rc1=$?
echo "--- rank 0 (exit $rc0)"; cat "$dir/0"
echo "--- rank 1 (exit $rc1)"; cat "$dir/1"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
