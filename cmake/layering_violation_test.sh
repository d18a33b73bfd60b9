#!/usr/bin/env bash
# The layering check must fail, naming the file and what the layer may use, when a layer's
# source includes a layer above it (cmake/sshsdp_layering.cmake on a tree with one violation).
# Usage: layering_violation_test.sh CMAKE REPO
set -u
cmake=$1
repo=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/sshsdp/models" "$tmp/sshsdp/engine"
printf '#include "sshsdp/params/model.h"\n' >"$tmp/sshsdp/models/ok.h"
printf '#include "sshsdp/engine/engine.h"\n' >"$tmp/sshsdp/models/bad.h"
"$cmake" -DSSHSDP_SOURCE_DIR="$tmp" -P "$repo/cmake/sshsdp_layering.cmake" >"$tmp/out" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q 'sshsdp/models/bad.h' "$tmp/out" &&
  grep -q "layer 'models' may use only" "$tmp/out" && ! grep -q 'ok.h' "$tmp/out"; then
  echo "ok: the violation is refused by name"
  exit 0
fi
echo "FAIL (rc=$rc):"
cat "$tmp/out"
exit 1
