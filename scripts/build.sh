#!/usr/bin/env bash
# Configures and builds sshsdp (Release, warnings as errors) into build/.
# Usage: scripts/build.sh [extra cmake args]
#        BUILD_TARGETS="sshsdp" scripts/build.sh   (build only those targets; default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
# shellcheck disable=SC2086  # BUILD_TARGETS is a list of target names
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
