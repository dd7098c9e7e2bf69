#!/usr/bin/env bash
# Prepares, on the build machine, what scripts/gpu-check.sh runs on a GPU machine whose image
# has CUDA, CMake and ninja but none of zoe's Debian packages (the device tool's H200: no Eigen,
# oneDNN, GTest, TBB, Gloo, ... and no package mirror): the GPU tests and zoe-gpt built with
# CUDA for sm_80 and sm_90, without -march=native (that machine has another CPU); the shared
# libraries they load beyond glibc's and CUDA's (the GPU machine brings its own cuBLAS, CUDA
# runtime and NCCL); and the trainer's data. Writes out/gpu-bundle.tar.xz; carry `out` to the
# GPU machine and run scripts/gpu-check.sh there, which uses the bundle when it finds it.
# Usage: scripts/gpu-bundle.sh   (ZOE_GPT_DATA: the data dir, default data/gpt, fetched if absent)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${ZOE_BUILD_DIR:-build-gpu-bundle}
data=${ZOE_GPT_DATA:-data/gpt}

scripts/setup.sh >/dev/null
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZOE_CUDA=ON -DZOE_GPT_NATIVE=OFF \
  -DZOE_BUILD_BENCH=OFF >/dev/null
bins=(tests/device/test_cuda_device tests/gpt/test_gpt_cuda examples/gpt/zoe-gpt bench/offload/zoe-offload-bench)
cmake --build "$build" -j"$(nproc)" --target test_cuda_device test_gpt_cuda zoe-gpt zoe-offload-bench
[[ -d "$data/gutenberg" ]] || scripts/fetch-data.sh "$data"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b="$stage/gpu-bundle"
mkdir -p "$b/bin" "$b/lib" "$b/data"
for f in "${bins[@]}"; do cp "$build/$f" "$b/bin/"; done
# Every library ldd resolves, except glibc's (the GPU machine's is as new or newer) and CUDA's.
for f in "$b"/bin/*; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | ld-linux*) ;;
      libcuda.so* | libcudart* | libcublas* | libnccl*) ;;
      *) cp -L "$lib" "$b/lib/" ;;
    esac
  done
cp -r "$data/encoder.json" "$data/vocab.bpe" "$data/gutenberg" "$b/data/"
[[ -d "$data/tokens" ]] && cp -r "$data/tokens" "$b/data/"
git rev-parse --short HEAD >"$b/commit" 2>/dev/null || true

mkdir -p out
tar -C "$stage" -cJf out/gpu-bundle.tar.xz gpu-bundle
echo "gpu-bundle: out/gpu-bundle.tar.xz, $(du -h out/gpu-bundle.tar.xz | cut -f1) ($(ls "$b/lib" | wc -l) libraries)"
