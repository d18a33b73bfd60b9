#!/usr/bin/env bash
# Asserts that a job in which one rank fails ends promptly and non-zero, instead of hanging.
# Launches comm_failure_probe through mpirun under `timeout 60` with 3 ranks and checks:
#   * exit code non-zero (the failure is reported),
#   * exit code not 124 (timeout's code: the other ranks hung),
#   * in the throw modes, stderr names the failing rank ("sshsdp: rank 1:").
#
# Usage: expect_abort.sh MODE PROBE MPIRUN [MPIRUN_ARGS...]
#   (ctest passes MPIRUN and the flags of SSHSDP_MPIRUN from cmake/sshsdp_testing.cmake)
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 throw|kill|throw-comm-thread PROBE MPIRUN [MPIRUN_ARGS...]" >&2
  exit 2
fi
mode=$1
probe=$2
shift 2
err=$(mktemp)
trap 'rm -f "$err"' EXIT
start=$(date +%s)
timeout 60 "$@" -np 3 "$probe" "$mode" 2>"$err"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "expect_abort: mode=$mode exit=$rc after ${elapsed}s; stderr:"
sed 's/^/  | /' "$err"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job exited 0 although rank 1 failed" >&2
  exit 1
fi
if [ "$rc" -eq 124 ]; then
  echo "FAIL: the job hung (timeout after 60 s): a failing rank left the others waiting" >&2
  exit 1
fi
if [ "$mode" != kill ] && ! grep -q "sshsdp: rank 1:" "$err"; then
  echo "FAIL: stderr does not name the failing rank ('sshsdp: rank 1:')" >&2
  exit 1
fi
if grep -q "passed a collective it should not pass" "$err"; then
  echo "FAIL: a rank completed a collective without rank 1" >&2
  exit 1
fi
echo "PASS"
