#!/usr/bin/env bash
# The one command that runs every test: set-up, build, then ctest (unit tests and
# multi-rank tests launched through mpirun).
# Usage: scripts/test.sh [ctest args, e.g. -R comm]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 "$@"
