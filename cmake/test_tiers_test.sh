#!/usr/bin/env bash
# Every ctest entry has a tier (unit, mpi, e2e or gpu), each tier has entries, and --fast's
# selection leaves out every slow one (cmake/sshsdp_testing.cmake).
# Usage: test_tiers_test.sh CTEST BUILD_DIR
set -u
ctest=$1
build=$2
count() { "$ctest" --test-dir "$build" -N "$@" | sed -n 's/^Total Tests: //p'; }
rc=0
untiered=$(count -LE 'unit|mpi|e2e|gpu')
[ "$untiered" = 0 ] || {
  echo "FAIL: $untiered tests without a tier:"
  "$ctest" --test-dir "$build" -N -LE 'unit|mpi|e2e|gpu' | grep 'Test *#'
  rc=1
}
for tier in unit mpi e2e slow; do
  n=$(count -L "^$tier\$")
  [ "${n:-0}" -gt 0 ] || { echo "FAIL: no test labelled $tier"; rc=1; }
done
all=$(count)
fast=$(count -LE 'slow|gpu')
slow=$(count -L '^slow$')
gpu=$(count -L '^gpu$')
[ "$fast" -eq $((all - slow - gpu)) ] || { echo "FAIL: --fast runs $fast of $all"; rc=1; }
[ $rc -eq 0 ] && echo "ok: $all tests, $fast in --fast"
exit $rc
