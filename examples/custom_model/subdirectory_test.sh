#!/usr/bin/env bash
# sshsdp inside a parent project (add_subdirectory): configures a parent that adds this
# checkout as a subdirectory — tests and benchmarks off there by default, so GTest is not
# looked for — builds the example against the sshsdp::sshsdp target and runs it on 2 ranks.
# The parent builds at -O0, as a unity build, without the CUDA backend: this checks the
# integration (and that the library builds as a unity build), not speed, and it compiles the
# whole library a second time (on 2 shared AMD EPYC cores: 170 s at -O2, 137 s at -O0, 103 s
# as an -O0 unity build).
# Usage: subdirectory_test.sh SOURCE_DIR MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
src=$(cd "$1" && pwd)
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/parent"
cat >"$tmp/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
add_subdirectory($src sshsdp)
add_executable(bigram_mlp_check $src/examples/custom_model/bigram_mlp_check.cc)
target_link_libraries(bigram_mlp_check PRIVATE sshsdp::sshsdp)
CMAKE
cmake -S "$tmp/parent" -B "$tmp/build" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0 \
  -DCMAKE_UNITY_BUILD=ON -DSSHSDP_CUDA=OFF >"$tmp/configure.log"
if grep -q "^GTest_DIR" "$tmp/build/CMakeCache.txt"; then
  echo "the parent's configure looked for GTest although sshsdp's tests are off" >&2
  exit 1
fi
cmake --build "$tmp/build" --target bigram_mlp_check -j 2 >/dev/null
"$@" -np 2 "$tmp/build/bigram_mlp_check" "$tmp/ckpt"
echo "add_subdirectory: OK"
