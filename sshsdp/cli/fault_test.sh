#!/usr/bin/env bash
# A stuck or failing rank ends the whole job, promptly and naming the cause:
#   * watchdog: one rank of four is stopped (SIGSTOP) mid-training; within --comm-timeout
#     plus a few seconds a waiting rank prints which operation, group and peer ranks it
#     waited for, and the job exits non-zero;
#   * a rank-local exception inside a step (--fault RANK:STEP), on the collective and on the
#     direct comm path, ends the job within seconds (the direct path used to hang in
#     ~Engine's drain and MPI_Win_free) with the error named on that rank;
#   * SIGTERM (as Slurm sends it to every task before preemption) finishes the step, writes a
#     checkpoint that verifies, and exits 143; sent to one rank only, every rank stops after
#     the same step; a second signal ends the process at once; SIGUSR1 sent to mpirun (which
#     forwards it, where it kills the ranks on a SIGTERM) does the same, exiting 138;
#   * a second job on a --ckpt-dir in use is refused naming the holder; after a roll-back
#     into the same --ckpt-dir, "latest" is the last completed save, not the highest step.
# Usage: fault_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"
trap 'pkill -9 -f "$tmp/marker" 2>/dev/null; rm -rf "$tmp"' EXIT  # runs left behind, too

# --- watchdog: SIGSTOP one rank of four -------------------------------------------------
timeout=4
"${mpirun[@]}" -np 4 "$bin" train --model tiny --steps 100000 --log-every 1 \
  --comm-timeout $timeout --metrics "$tmp/marker" >"$tmp/stop.out" 2>"$tmp/stop.err" &
mp=$!
for _ in $(seq 1 120); do grep -q "step     3/" "$tmp/stop.out" && break; sleep 0.25; done
ranks=$(pgrep -P "$mp" | sort -n)
victim=$(echo "$ranks" | sed -n 3p)
start=$(date +%s)
if [ -n "$victim" ]; then kill -STOP "$victim"; fi
while kill -0 "$mp" 2>/dev/null && [ $(($(date +%s) - start)) -lt 60 ]; do sleep 0.25; done
elapsed=$(($(date +%s) - start))
if kill -0 "$mp" 2>/dev/null; then
  kill -9 "$mp" $ranks 2>/dev/null
  rc=124
else
  wait "$mp"
  rc=$?
fi
echo "  stopped pid ${victim:-none} of [$(echo $ranks)]; job ended after ${elapsed} s, exit $rc"
sed 's/^/  | /' "$tmp/stop.err" | grep "sshsdp:" | head -3
[ -n "$victim" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -le $((timeout + 10)) ] &&
  grep -q "watchdog: waited [0-9.]* s (--comm-timeout $timeout s) in .* on .* for " "$tmp/stop.err"
check "a stopped rank ends the job within --comm-timeout + 10 s, naming the wait" $?

# --- a rank-local exception inside a step, both comm paths ------------------------------
for path in collective direct; do
  start=$(date +%s)
  timeout 60 "${mpirun[@]}" -np 4 "$bin" train --model tiny --sw 2 --sg 2 --so 4 \
    --ranks-per-node 2 --steps 5 --fault 1:3 --comm-path $path >/dev/null 2>"$tmp/fault.err"
  rc=$?
  elapsed=$(($(date +%s) - start))
  echo "  $path: exit $rc after ${elapsed} s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -le 30 ] &&
    grep -q "sshsdp: rank 1: --fault 1:3: injected failure on rank 1 in step 3" "$tmp/fault.err"
  check "an exception on rank 1 mid-step ends the job promptly ($path path)" $?
done

# --- SIGTERM -----------------------------------------------------------------------------
# start_run DIR NP [MODEL ARGS]: a long run writing checkpoints to DIR; sets $mp once step 3
# was logged.
start_run() {
  local dir=$1 np=$2
  shift 2
  # Emptied before the launch: the wait below must not see the previous run's step lines (the
  # background job's own redirection may truncate the file only after the first grep).
  : >"$tmp/sig.out"
  # shellcheck disable=SC2068
  "${mpirun[@]}" -np "$np" "$bin" train ${@:---model tiny} --steps 100000 --log-every 1 \
    --ckpt-dir "$dir" --metrics "$tmp/marker" >"$tmp/sig.out" 2>"$tmp/sig.err" &
  mp=$!
  for _ in $(seq 1 120); do grep -q "step     3/" "$tmp/sig.out" && break; sleep 0.25; done
}
finish_run() {  # waits for $mp (at most 60 s); sets rc
  local t0
  t0=$(date +%s)
  while kill -0 "$mp" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 60 ]; do sleep 0.25; done
  if kill -0 "$mp" 2>/dev/null; then kill -9 "$mp"; rc=124; else wait "$mp"; rc=$?; fi
}
start_run "$tmp/ck_all" 4
kill -TERM $(pgrep -P "$mp")
finish_run
saved=$(ls "$tmp/ck_all" 2>/dev/null | grep -c '^step_')
echo "  SIGTERM to every rank: exit $rc, $saved checkpoint(s)"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$saved" -eq 1 ] &&
  grep -q "sshsdp: Terminated received: stopped after step [0-9]*, checkpoint saved in $tmp/ck_all; exiting with 143" "$tmp/sig.err" &&
  "$bin" ckpt inspect "$tmp/ck_all" >/dev/null 2>&1
check "SIGTERM finishes the step, saves a checkpoint that verifies, exits 143" $?
# mpirun forwards SIGUSR1 to every rank (a SIGTERM to mpirun kills them instead).
start_run "$tmp/ck_usr1" 2
kill -USR1 "$mp"
finish_run
saved=$(ls "$tmp/ck_usr1" 2>/dev/null | grep -c '^step_')
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$saved" -eq 1 ] &&
  grep -q "stopped after step [0-9]*, checkpoint saved in $tmp/ck_usr1; exiting with 138" \
    "$tmp/sig.err" && "$bin" ckpt inspect "$tmp/ck_usr1" >/dev/null 2>&1
check "SIGUSR1 to mpirun (forwarded to every rank) saves a checkpoint that verifies, exits 138" $?
start_run "$tmp/ck_one" 4
kill -TERM "$(pgrep -P "$mp" | sort -n | sed -n 2p)"
finish_run
saved=$(ls "$tmp/ck_one" 2>/dev/null | grep -c '^step_')
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$saved" -eq 1 ] && "$bin" ckpt inspect "$tmp/ck_one" >/dev/null 2>&1
check "SIGTERM to one rank stops every rank after the same step (one verified checkpoint)" $?
# Step 5 lasts 3 s more on rank 0 (--fault 0:5:sleep): both signals arrive inside it.
start_run "$tmp/ck_twice" 2 --model tiny --fault 0:5:sleep
for _ in $(seq 1 120); do grep -q "step     4/" "$tmp/sig.out" && break; sleep 0.1; done
ranks=$(pgrep -P "$mp")
kill -TERM $ranks
sleep 0.5
kill -TERM $ranks
finish_run
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -q "checkpoint saved" "$tmp/sig.err"
check "a second signal ends the run at once (no checkpoint)" $?

# --- one job per --ckpt-dir; "latest" is the last completed save ------------------------
start_run "$tmp/ck_lock" 2
expect_error "a second job on the same --ckpt-dir is refused, naming the holder" \
  "checkpoint directory is in use by another job (pid " \
  "${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 2 --save-every 1 --ckpt-dir "$tmp/ck_lock"
kill -TERM $(pgrep -P "$mp")
finish_run
"${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 20 --save-every 10 --ckpt-dir "$tmp/ck_roll" \
  >/dev/null 2>&1 &&
  "${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 15 --save-every 5 --ckpt-dir "$tmp/ck_roll" \
    --resume "$tmp/ck_roll/step_00000010" >/dev/null 2>&1 &&
  "$bin" ckpt inspect "$tmp/ck_roll" | grep -q "^checkpoint $tmp/ck_roll/step_00000015 "
check "after a roll-back into the same --ckpt-dir, latest is the last save (15), not step 20" $?
"${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 5 --save-every 5 --ckpt-dir "$tmp/ck_m" \
  --metrics "$tmp/m.jsonl" >/dev/null 2>&1 &&
  "${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 8 --resume "$tmp/ck_m" \
    --metrics "$tmp/m.jsonl" >/dev/null 2>&1 &&
  [ "$(wc -l <"$tmp/m.jsonl")" -eq 8 ] && [ "$(tail -1 "$tmp/m.jsonl" | sed 's/.*"step":\([0-9]*\).*/\1/')" -eq 8 ]
check "a resumed run appends to its --metrics file (5 + 3 lines)" $?

expect_error "a negative --comm-timeout is refused" "--comm-timeout must be a number of seconds >= 0" \
  "${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 1 --comm-timeout -1

finish_checks
