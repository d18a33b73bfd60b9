#!/usr/bin/env bash
# --trace (issue 18): the Chrome trace of a 2-rank `sshsdp train` parses, has a row per rank
# with compute and communication threads, every span nests inside its step, and rank 0's
# collective spans carry exactly the bytes and all-gathers its counters report
# (testing/check_trace.py); `sshsdp bench --trace` has a row per configuration and rank with
# one step each; scripts/plot_trace.py renders both; bad --trace-steps are refused by name.
# Usage: trace_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=testing/check.sh
. "$here/testing/check.sh"
plot=$here/../../scripts/plot_trace.py

"${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 4 --microbatches 2 --batch-size 2 \
  --seq-len 32 --gemm-peak 10 --log-every 4 --trace "$tmp/trace.json" --trace-steps 2:3 \
  --metrics "$tmp/m.jsonl" >"$tmp/train.out" 2>&1
check "train --trace runs" $?
grep -q "wrote $tmp/trace.json (steps 2-3" "$tmp/train.out"
check "train reports the trace" $?
python3 "$here/testing/check_trace.py" "$tmp/trace.json" "$tmp/m.jsonl" 2 2 3
check "spans nest in steps; collective bytes equal the counters" $?
# The direct comm path: the same checks (its collectives are one-sided transfers).
"${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 2 --microbatches 2 --batch-size 2 \
  --seq-len 32 --gemm-peak 10 --comm-path direct --trace "$tmp/direct.json" \
  --metrics "$tmp/d.jsonl" >"$tmp/direct.out" 2>&1 &&
  python3 "$here/testing/check_trace.py" "$tmp/direct.json" "$tmp/d.jsonl" 2 1 2
check "direct path trace equals its counters" $?
"${mpirun[@]}" -np 2 "$bin" train --model tiny --steps 2 --batch-size 2 --seq-len 32 \
  --gemm-peak 10 >"$tmp/plain.out" 2>&1 && ! grep -q 'wrote .*trace' "$tmp/plain.out"
check "no --trace: no trace" $?

"${mpirun[@]}" -np 2 "$bin" bench --model tiny --batch-size 2 --seq-len 32 --steps 2 \
  --warmup 1 --presets sshsdp,fsdp2 --gemm-peak 10 --trace "$tmp/bench.json" \
  >"$tmp/bench.out" 2>&1
check "bench --trace runs" $?
python3 - "$tmp/bench.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
rows = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
want = {0: "sshsdp rank 0", 1: "sshsdp rank 1", 2: "fsdp2 rank 0", 3: "fsdp2 rank 1"}
steps = sorted(e["pid"] for e in ev if e["ph"] == "X" and e["name"] == "step")
copies = [e for e in ev if e["ph"] == "X" and "copy" in e["name"]]
ok = rows == want and steps == [0, 1, 2, 3] and copies and all(e["pid"] >= 2 for e in copies)
print("bench rows", rows, "step spans", steps, "copy spans", len(copies))
sys.exit(0 if ok else 1)
PY
check "bench: a row per configuration and rank, one step each, copies only in fsdp2" $?

if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$plot" "$tmp/trace.json" "$tmp/trace.png" --step 3 >/dev/null &&
    [ -s "$tmp/trace.png" ] &&
    /usr/bin/python3 "$plot" "$tmp/bench.json" "$tmp/bench.png" --align-each >/dev/null &&
    [ -s "$tmp/bench.png" ]
  check "plot_trace.py renders both" $?
  /usr/bin/python3 "$plot" "$tmp/trace.json" "$tmp/x.png" --step 9 >/dev/null 2>"$tmp/err"
  [ $? -ne 0 ] && grep -q "no step 9" "$tmp/err"
  check "plot_trace.py names a missing step" $?
fi

expect_error "--trace-steps 0:2 refused" "--trace-steps must be A:B" \
  "${mpirun[@]}" -np 1 "$bin" train --model tiny --steps 1 --trace "$tmp/x.json" \
  --trace-steps 0:2
expect_error "--trace-steps 3:2 refused" "--trace-steps must be A:B" \
  "${mpirun[@]}" -np 1 "$bin" train --model tiny --steps 1 --trace-steps 3:2
expect_error "--trace-steps 3-5 refused" "--trace-steps must be A:B" \
  "${mpirun[@]}" -np 1 "$bin" train --model tiny --steps 1 --trace-steps 3-5
expect_error "--trace into a missing directory refused" "does not exist" \
  "${mpirun[@]}" -np 1 "$bin" train --model tiny --steps 1 --trace "$tmp/no/such/t.json"
finish_checks
