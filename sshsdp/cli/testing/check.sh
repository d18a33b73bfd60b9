# Shared helpers of the `sshsdp` program's shell tests (cli_test.sh, bench_test.sh,
# fault_test.sh): a temporary directory removed on exit, pass/fail counting, and the
# bad-input check. Source it after setting nothing; it sets $tmp, $pass and $fails.
#
#   . "$(dirname "$0")/testing/check.sh"
#   check "loss falls" $?                                  # NAME EXIT-CODE-OF-THE-CONDITION
#   expect_error "bad layout" "so=3 must divide" mpirun -np 2 sshsdp train --so 3
#   finish_checks                                          # prints "N passed, M failed"; exit code
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0
check() {
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "ok   $1"; else fails=$((fails + 1)); echo "FAIL $1"; fi
}
# expect_error NAME NEEDLE CMD...: must exit non-zero within 60 s, stderr containing NEEDLE
# (a fixed string); on failure the stderr is shown.
expect_error() {
  local name=$1 needle=$2
  shift 2
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF -- "$needle" "$tmp/err"; then
    echo "  rc=$rc; stderr:"
    sed 's/^/  | /' "$tmp/err" | head -20
    check "$name" 1
  else
    check "$name" 0
  fi
}
# same_training A.jsonl B.jsonl TOL [STEPS]: two runs' --metrics files agree — STEPS records
# each (default 4), loss and gradient norm within TOL relative (0: equal), the communicated
# bytes equal, and run A's loss falls. Exit code 0 or 1 (the assertion shown).
same_training() {
  python3 - "$1" "$2" "$3" "${4:-4}" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
tol, steps = float(sys.argv[3]), int(sys.argv[4])
assert len(a) == len(b) == steps, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= tol * abs(y[k]), (x["step"], k, x[k], y[k])
    for k in ("update_p2p_bytes", "runtime_comm_intra_bytes", "runtime_comm_inter_bytes",
              "update_comm_intra_bytes", "update_comm_inter_bytes"):
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
assert a[-1]["loss"] < a[0]["loss"], [x["loss"] for x in a]
PY
}
# resumed_like STRAIGHT.jsonl RESUMED.jsonl TOL: a run resumed at step 2 logged steps 3-4 only,
# with the uninterrupted run's losses (and, for TOL 0, gradient norms) within TOL relative.
resumed_like() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
tol = float(sys.argv[3])
keys = ("loss", "grad_norm") if tol == 0 else ("loss",)
want = {r["step"]: r for r in a}
got = {r["step"]: r for r in b}
assert sorted(got) == [3, 4], sorted(got)
for s in (3, 4):
    for k in keys:
        assert abs(got[s][k] - want[s][k]) <= tol * abs(want[s][k]), (s, k, got[s][k], want[s][k])
PY
}
finish_checks() {
  echo "$pass passed, $fails failed"
  [ "$fails" -eq 0 ]
}
