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
finish_checks() {
  echo "$pass passed, $fails failed"
  [ "$fails" -eq 0 ]
}
