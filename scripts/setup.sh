#!/usr/bin/env bash
# Installs every Debian package sshsdp needs to build, test and run, and Intel MKL from PyPI
# into ~/.cache/sshsdp (scripts/install_mkl.py), idempotently.
# Usage: scripts/setup.sh        (as root, or with sudo available)
set -euo pipefail
PKGS=(
  g++ cmake make clang-format
  openmpi-bin libopenmpi-dev          # multi-process ranks (mpirun) and MPI headers
  libdnnl-dev                         # oneDNN: fp32/bf16 GEMMs (AMX where the CPU has it)
  libblis4-openmp                     # BLIS: the `blis` fp32 GEMM provider (loaded at run time)
  ocl-icd-opencl-dev                  # oneDNN's dnnl-config.cmake finds OpenCL (a Recommends)
  libgtest-dev libgmock-dev           # unit and multi-rank tests
  libcli11-dev nlohmann-json3-dev libfmt-dev   # CLI, JSON metrics/manifests, formatting
  pkg-config libpcre2-dev libicu-dev  # tokenizers: Unicode regexes (PCRE2), NFC (ICU)
  libtomlplusplus-dev                 # --config files: a real TOML parser (line and column)
  python3 python3-matplotlib          # scripts/plot_metrics.py (training curves, bench plots)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages already installed"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The `mkl` fp32 GEMM provider (sshsdp/kernels/gemm_provider.h), the default on Intel CPUs.
python3 "$(dirname "$0")/install_mkl.py"
