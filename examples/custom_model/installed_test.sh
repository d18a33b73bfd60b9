#!/usr/bin/env bash
# CI's check that sshsdp works as an installed package: installs the build tree into a
# temporary prefix, configures and builds this example as its own project against it
# (find_package(sshsdp)), and runs on 2 and 3 ranks the check against a one-rank reference
# (exits non-zero on a mismatch) and the front-door program.
# Usage: installed_test.sh BUILD_DIR MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
build=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/lib/cmake/sshsdp/sshsdpConfig.cmake"
test -f "$tmp/prefix/include/sshsdp/engine/engine.h"
test -f "$tmp/prefix/include/sshsdp/sshsdp.h"
test -x "$tmp/prefix/bin/sshsdp"
cmake -S "$here" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/build" -j 2 >/dev/null
for np in 2 3; do
  "$@" -np "$np" "$tmp/build/bigram_mlp_check" "$tmp/ckpt$np"
  test -f "$tmp/ckpt$np/adamw/latest" && test -f "$tmp/ckpt$np/muon/latest"
  "$@" -np "$np" "$tmp/build/bigram_mlp" "$tmp/front$np" | tail -2
  test -f "$tmp/front$np/latest"
done
# The installed program reads what the example saved.
"$tmp/prefix/bin/sshsdp" ckpt inspect "$tmp/ckpt3/muon" >"$tmp/inspect.txt"
head -3 "$tmp/inspect.txt"
echo "installed package: OK"
