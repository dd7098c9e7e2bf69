#!/usr/bin/env bash
# The fresh-machine check, for maintainers (not part of CI: it downloads a few hundred MB and
# takes long). Builds a bare Debian 12 root (mmdebstrap --variant=apt bookworm), copies this
# checkout into it (tracked and untracked-not-ignored files: no build dirs, no data), and runs
# the README's two commands there as a new user would, as root in a chroot:
#   scripts/test.sh                                       (setup, build, the whole ctest suite)
#   ZOE_DATA_SOURCE=/data scripts/run-main.sh --steps 20  (a short main job)
# The main job takes the data from a local copy because npm inside a bare root may lack this
# machine's CA setup; without one it fetches with npm. Prints one line per command with PASS or
# FAIL and its wall time; each command's output is in LOGS/<name>.log. Exit status 0 only when
# every command passed. Needs root (mmdebstrap, chroot, mounts); installs mmdebstrap if missing.
#
# Usage: scripts/fresh-check.sh [--data DIR] [--logs DIR] [--keep] [--configure-only]
#   --data DIR  the trainer's data, as scripts/fetch-data.sh --from takes it (the two .tgz files
#               or an extracted copy); default $ZOE_FRESH_DATA, else /work/shared/data if present
#   --logs DIR  where the logs go (default: out/fresh-check under the checkout)
#   --keep      leave the root (unmounted) for inspection instead of removing it
#   --configure-only  the quick package check (minutes, not an hour): scripts/setup.sh and CMake's
#               configure in the bare root, instead of the two commands; it finds a package
#               missing from setup.sh's list, not a failing build or test
# Env: ZOE_FRESH_TMP (parent of the root, default /var/tmp), ZOE_FRESH_MIRROR (Debian mirror,
#      default mmdebstrap's: deb.debian.org with bookworm-updates and security).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
data=${ZOE_FRESH_DATA:-}
[[ -z "$data" && -d /work/shared/data ]] && data=/work/shared/data
logs=$repo/out/fresh-check
keep=0
configure_only=0
while (($#)); do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --logs) logs="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --configure-only) configure_only=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "fresh-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "fresh-check: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap, chroot and mounts); run it with sudo"
[[ -z "$data" || -d "$data" ]] || die "--data '$data' is not a directory"
command -v git >/dev/null || die "git not found (the checkout's file list comes from git ls-files)"
mkdir -p "$logs" || die "cannot create the log dir '$logs'"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log

failed=0
# run_step LOG LABEL COMMAND...: runs the command with its output in LOGS/LOG.log and prints
# PASS or FAIL, LABEL and the wall time (on failure also the log's last lines).
run_step() {
  local log=$logs/$1.log label=$2 t0=$SECONDS rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    printf 'fresh-check: PASS %-58s %5d s\n' "$label" $((SECONDS - t0))
  else
    printf 'fresh-check: FAIL %-58s %5d s  (exit %d, log %s)\n' "$label" $((SECONDS - t0)) "$rc" "$log"
    tail -n 25 "$log" | sed 's/^/    | /'
    failed=1
  fi
  return $rc
}

if ! command -v mmdebstrap >/dev/null; then
  run_step install-mmdebstrap "apt-get install mmdebstrap" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap' || exit 1
fi

root=$(mktemp -d "${ZOE_FRESH_TMP:-/var/tmp}/zoe-fresh.XXXXXX") || die "cannot create the root dir"

# Mount points under $root, from the kernel's table (deepest first). /proc/self/mounts escapes
# spaces as \040; mktemp's names have none.
mounts_under() { awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/self/mounts | sort -r; }

# The chroot's mounts live in a private mount namespace of each command (unshare below), so
# they vanish when it exits and never show here; this unmounts anything that still does (a
# mount of mmdebstrap's, say) and removes the root only when nothing under it is mounted.
# --one-file-system keeps rm out of any other file system even then.
cleanup() {
  local m left
  for m in $(mounts_under); do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  left=$(mounts_under)
  if [[ -n "$left" ]]; then
    echo "fresh-check: NOT removing $root: still mounted there: $left" >&2
    return
  fi
  if ((keep)); then
    echo "fresh-check: kept the root at $root (nothing mounted there)"
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bootstrap() {
  local mirror=()
  [[ -n "${ZOE_FRESH_MIRROR:-}" ]] && mirror=("$ZOE_FRESH_MIRROR")
  mmdebstrap --variant=apt bookworm "$root" "${mirror[@]+"${mirror[@]}"}" || return
  # What Debian's installer (and every cloud image) writes and a bare root lacks: without it
  # "localhost" does not resolve (tests/comm's rendezvous connects to it). The chroot shares
  # this machine's host name.
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
}

# The checkout as git sees it: tracked files still present plus untracked files not ignored.
copy_checkout() {
  mkdir -p "$root/root/zoe"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -C "$root/root/zoe" -xf -
}

copy_data() { mkdir -p "$root/data" && cp -rL "$data"/. "$root/data/"; }

# in_chroot COMMAND: runs the bash command in /root/zoe inside the root, with /proc, /dev and
# /sys mounted in a private mount namespace and a clean environment (a bare machine's root
# shell; nothing of this machine's such as ccache settings leaks in).
in_chroot() {
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"  # apt needs DNS
  unshare --mount --propagation private bash -euc '
    r=$1; shift
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      bash -c "cd /root/zoe && $1"
  ' in_chroot "$root" "$1"
}

echo "fresh-check: root $root, logs $logs"
run_step mmdebstrap "mmdebstrap --variant=apt bookworm" bootstrap || exit 1
run_step copy-checkout "copy the checkout ($(cd "$repo" && git rev-parse --short HEAD 2>/dev/null))" copy_checkout || exit 1
source_env=""
if [[ -n "$data" ]]; then
  run_step copy-data "copy the data ($data)" copy_data || exit 1
  source_env="ZOE_DATA_SOURCE=/data"
fi
if ((configure_only)); then
  run_step configure "scripts/setup.sh && cmake configure" in_chroot \
    "scripts/setup.sh && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release"
  if ((failed)); then echo "fresh-check: FAILED"; exit 1; fi
  echo "fresh-check: configure passed (packages complete; build and tests not run)"
  exit 0
fi
# test.sh's data tests read $ZOE_GPT_DATA (they skip without data).
run_step test "scripts/test.sh" in_chroot "${source_env:+ZOE_GPT_DATA=/data} scripts/test.sh"
run_step main "$source_env scripts/run-main.sh --steps 20" in_chroot \
  "$source_env scripts/run-main.sh --steps 20 --warmup 5 --eval-interval 10"
# ctest's summary, so the skipped tests show here.
grep -E "tests passed|tests failed|Not Run|Skipped|^The following tests" "$logs/test.log" 2>/dev/null | sed 's/^/    /'
if ((failed)); then echo "fresh-check: FAILED"; exit 1; fi
echo "fresh-check: all passed"
