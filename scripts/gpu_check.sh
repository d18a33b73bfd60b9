#!/usr/bin/env bash
# The one prepared device check of the CUDA backend (issue 19), for a machine with an NVIDIA
# GPU. What exists today is the device layer (sshsdp/device): every backend op checked
# against its CPU op on the GPU. Training GPT on the GPU is not built yet; this script says so
# instead of pretending.
#
#   scripts/gpu_check.sh prepare   # here (the build machine, no GPU needed): build the CUDA
#                                  # backend test in build-gpu/ and bundle it with the shared
#                                  # libraries a bare GPU image lacks (oneDNN, OpenMPI, fmt) into
#                                  # gpu-bundle/ (git-ignored; ~45 MB)
#   scripts/gpu_check.sh           # on the GPU machine (device tool: carry gpu-bundle):
#                                  # nvidia-smi, then the op-by-op test on cuda:0; exit 0 only
#                                  # if it ran and passed (a skip is a failure here)
#
# Where the GPU machine has the whole toolchain (OpenMPI, oneDNN, GTest, fmt, nvcc), plain
# `scripts/gpu_check.sh build` builds there with -DSSHSDP_CUDA=ON and runs ctest -L gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
bundle=gpu-bundle
case "$mode" in
  prepare)
    # Its own build directory: -DSSHSDP_CUDA=ON is not left in build/'s cache.
    BUILD_DIR=build-gpu BUILD_TARGETS=device_backend_test scripts/build.sh -DSSHSDP_CUDA=ON
    rm -rf "$bundle" && mkdir -p "$bundle/lib"
    cp build-gpu/sshsdp/device/device_backend_test "$bundle/"
    # Every shared library outside the C library and CUDA's own (the GPU image has those).
    ldd "$bundle/device_backend_test" | awk '/=> \//{print $3}' |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|/cuda/|libcu' |
      xargs -r -I{} cp -L {} "$bundle/lib/"
    ldd --version | head -1 >"$bundle/built-with-glibc"
    du -sh "$bundle"
    ;;
  build)
    BUILD_DIR=build-gpu scripts/build.sh -DSSHSDP_CUDA=ON
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    ctest --test-dir build-gpu -L gpu --output-on-failure
    build-gpu/sshsdp/device/device_backend_test --backend=cuda  # exit 77 (skip) is a failure
    ;;
  run)
    [ -x "$bundle/device_backend_test" ] || {
      echo "gpu_check.sh: no $bundle/ (run 'scripts/gpu_check.sh prepare' first and carry it)" >&2
      exit 2
    }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    echo "bundle built with: $(cat "$bundle/built-with-glibc"); here: $(ldd --version | head -1)"
    # cudart / cuBLAS 13: the toolkit's, or the nvidia-* wheels next to PyTorch.
    site=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
    cuda_libs=$(find /usr/local /usr/lib /opt ${site:+"$site"} -name 'libcublas.so.13*' \
      2>/dev/null | head -1 | xargs -r dirname)
    rt_libs=$(find /usr/local /usr/lib /opt ${site:+"$site"} -name 'libcudart.so.13*' \
      2>/dev/null | head -1 | xargs -r dirname)
    export LD_LIBRARY_PATH="$PWD/$bundle/lib:${cuda_libs}:${rt_libs}:${LD_LIBRARY_PATH:-}"
    if ldd "$bundle/device_backend_test" | grep 'not found'; then
      echo "gpu_check.sh: shared libraries missing on this machine (above)" >&2
      exit 1
    fi
    rc=0
    "$bundle/device_backend_test" --backend=cuda || rc=$?
    [ $rc -eq 77 ] && echo "gpu_check.sh: the CUDA test skipped on a GPU machine: a failure" >&2
    echo "GPT training on the GPU (model kernels, NCCL, engine parity on cuda): not built yet"
    exit $((rc == 0 ? 0 : 1))
    ;;
  *)
    echo "usage: scripts/gpu_check.sh [prepare|run|build]" >&2
    exit 2
    ;;
esac
