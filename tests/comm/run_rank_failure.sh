#!/bin/sh
# Two processes (torchrun-style variables) of rank_failure_worker in mode $2; one rank fails
# (see the worker). Passes when the other rank's error is a RankFailedError naming the failed
# rank and its cause, no more than 5 s (wall clock) after the failed rank's own error, although
# the collective timeout is 300 s.
#   crc:  rank 1 fails (CRC32C of its swap file) and stays alive; rank 0 must report it.
#   init: rank 0 fails (its initializer) and exits at once; rank 1 must report it.
set -u
worker=$1
mode=$2
dir=$(mktemp -d)
pid0= pid1=
cleanup() {
  for p in $pid0 $pid1; do kill "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZOE_DEVICE=host ZOE_TEST_DIR=$dir
RANK=0 LOCAL_RANK=0 timeout $((100 * ${ZOE_TEST_TIMEOUT_SCALE:-1})) "$worker" "$mode" >"$dir/0" 2>&1 &
pid0=$!
RANK=1 LOCAL_RANK=1 timeout $((100 * ${ZOE_TEST_TIMEOUT_SCALE:-1})) "$worker" "$mode" >"$dir/1" 2>&1 &
pid1=$!
if [ "$mode" = crc ]; then failed=1 peer=0 peer_pid=$pid0 failed_pid=$pid1; else failed=0 peer=1 peer_pid=$pid1 failed_pid=$pid0; fi
wait "$peer_pid"; rc_peer=$?
# The failed rank has printed its error by now (the peer's error follows from it).
kill "$failed_pid" 2>/dev/null
wait "$failed_pid"
echo "--- rank 0"; cat "$dir/0"
echo "--- rank 1"; cat "$dir/1"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc_peer" -eq 3 ] || fail "rank $peer exited $rc_peer (expected 3: an error)"
grep -q "^failed_rank=$failed\$" "$dir/$peer" || fail "rank $peer's error is not a RankFailedError naming rank $failed"
if [ "$mode" = crc ]; then
  cause="tensor 'optim.sg0'.*failed its CRC32C check"
else
  cause="injected initializer failure on rank 0"
fi
grep -q "^error_at_ms=.*on rank $peer: rank $failed failed: .*$cause" "$dir/$peer" ||
  fail "rank $peer's error does not name rank $failed and its cause"
grep -q "^error_at_ms=.*$cause" "$dir/$failed" || fail "rank $failed did not fail with its cause"
t_failed=$(sed -n 's/^error_at_ms=\([0-9]*\) .*/\1/p' "$dir/$failed")
t_peer=$(sed -n 's/^error_at_ms=\([0-9]*\) .*/\1/p' "$dir/$peer")
delay=$((t_peer - t_failed))
echo "rank $peer failed $delay ms after rank $failed"
[ "$delay" -lt 5000 ] || fail "rank $peer took $delay ms (limit 5000) to learn of rank $failed's failure"
echo PASS
