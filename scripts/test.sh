#!/usr/bin/env bash
# Sets up (Debian packages), builds zoe with its tests and runs the whole suite (ctest).
# Usage: scripts/test.sh [extra cmake args...]   Build dir: $ZOE_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${ZOE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
