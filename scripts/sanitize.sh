#!/usr/bin/env bash
# Builds the project with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan and runs
# every test there (MPI tests included). Not part of CI (about 20 minutes on 2 cores); run it
# before landing changes to memory-layout or communication code.
#
#   scripts/sanitize.sh                 # everything
#   scripts/sanitize.sh -R 'engine|comm'   # extra arguments go to ctest
# GCC's -Wmaybe-uninitialized misfires under the sanitizers' instrumentation (std::regex's
# std::function in cli/train.cc, GCC 12): a warning there, not an error.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$ROOT/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -Wno-error=maybe-uninitialized" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build "$ROOT/build-asan" -j "$(nproc)"
# OpenMPI's own allocations are not ours to report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
cd "$ROOT/build-asan"
ctest --output-on-failure --timeout 600 "$@"
