#!/bin/sh
# The launch tests must run, not skip, on a machine set up by scripts/setup.sh: every Debian
# package their SKIP lines name ("apt-get install PKG") is in setup.sh's unconditional list.
# Usage: check_setup_packages.sh SETUP_SH LAUNCH_SCRIPT
set -u
setup=$1 launch=$2
# setup.sh's `packages=( ... )` block, comments removed, one name a line.
listed=$(sed -n '/^packages=(/,/^)/p' "$setup" | sed 's/#.*//; s/packages=(//; s/)//' | tr -s ' \t' '\n\n' | sed '/^$/d')
needed=$(sed -n 's/.*apt-get install \([a-z0-9.+-]*\).*/\1/p' "$launch" | sort -u)
[ -n "$needed" ] || { echo "no 'apt-get install PKG' in $launch: nothing checked"; exit 1; }
fail=0
for p in $needed; do
  if printf '%s\n' "$listed" | grep -qx "$p"; then
    echo "ok: $p is in scripts/setup.sh's packages"
  else
    echo "FAIL: $launch skips without '$p', which scripts/setup.sh does not install"
    fail=1
  fi
done
exit $fail
