#!/usr/bin/env bash
# The one command that runs every test: set-up, build, then ctest (unit tests and
# multi-rank tests launched through mpirun).
# Usage: scripts/test.sh [--fast] [ctest args, e.g. -R comm or -L unit]
#   --fast   leave out the tests labelled slow (and gpu): a developer's check in about a
#            minute of tests on 2 cores (tiers: cmake/sshsdp_testing.cmake)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [ "${1:-}" = "--fast" ]; then
  fast=(-LE "slow|gpu")
  shift
fi
scripts/setup.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 "${fast[@]}" "$@"
