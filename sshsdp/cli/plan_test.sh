#!/usr/bin/env bash
# `sshsdp plan` (issue 18) as a user runs it: --help names its options; the plan of a 4-rank
# run on two simulated nodes, computed in one process, equals what that run measured on
# rank 0 — its per-step runtime and update bytes intra / inter node (--metrics) exactly and
# its accounted memory by category (the final "memory per rank" line, 0.01 MiB rounding);
# --config is read and --dump-config writes one; Muon's split units and the owner map are printed; bad layouts and what
# the plan does not model are refused by name; an MXFP8 Muon run is planned as it runs, and a
# device's refusals (--backend cuda) are the plan's. engine_plan_test checks every rank of many
# more layouts against the engine's counters.
# Usage: plan_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=testing/check.sh
. "$here/testing/check.sh"

"$bin" plan --help >"$tmp/help" 2>&1 && grep -q -- "--world-size" "$tmp/help" &&
  grep -q -- "--json" "$tmp/help" && grep -q -- "--sw" "$tmp/help"
check "plan --help names its options" $?

run=(--model tiny --sw 2 --sg 2 --so 4 --ranks-per-node 2 --microbatches 2 --batch-size 2
  --seq-len 32)
"$bin" plan -n 4 "${run[@]}" --json >"$tmp/plan.json" 2>"$tmp/plan.err"
check "plan --json runs in one process" $?
"${mpirun[@]}" -np 4 "$bin" train "${run[@]}" --steps 2 --gemm-peak 10 --log-every 2 \
  --metrics "$tmp/m.jsonl" >"$tmp/train.out" 2>&1
check "the planned run trains" $?
python3 - "$tmp/plan.json" "$tmp/m.jsonl" "$tmp/train.out" <<'PY'
import json, re, sys
plan = json.load(open(sys.argv[1]))
r0 = plan["ranks"][0]
assert len(plan["ranks"]) == 4, len(plan["ranks"])
last = [json.loads(l) for l in open(sys.argv[2]) if l.strip()][-1]
want = {"runtime_comm_intra_bytes": r0["runtime_comm"]["intra_node_bytes"],
        "runtime_comm_inter_bytes": r0["runtime_comm"]["inter_node_bytes"],
        "update_comm_intra_bytes": r0["update_comm"]["intra_node_bytes"],
        "update_comm_inter_bytes": r0["update_comm"]["inter_node_bytes"]}
for k, v in want.items():
    assert last[k] == v, f"{k}: run measured {last[k]}, plan says {v}"
assert want["runtime_comm_inter_bytes"] == 0 and want["update_comm_inter_bytes"] > 0, want
line = [l for l in open(sys.argv[3]) if l.startswith("memory per rank (accounted, rank 0)")][0]
measured = {k: float(v) for k, v in re.findall(r" (\w+) ([0-9.]+) MiB;", line)}
measured.pop("activations", None)
planned = {k: v / 1048576 for k, v in r0["memory_bytes"].items()}
assert set(measured) == set(planned), (measured, planned)
for k in planned:
    assert abs(measured[k] - planned[k]) <= 0.006, (k, measured[k], planned[k])
printed = [l for l in open(sys.argv[3]) if l.startswith("planned (sshsdp plan, rank 0)")][0]
assert dict(re.findall(r" (\w+) ([0-9.]+) MiB;", printed)) == {
    k: f"{measured[k]:.2f}" for k in measured}, (printed, line)
print("plan = run:", want, {k: round(v, 3) for k, v in planned.items()})
PY
check "plan equals the run's rank-0 bytes and accounted memory; train prints the plan" $?

# An MXFP8 Muon run is planned as it runs — the plan's memory is what train accounts — and what
# a device would refuse is refused by the plan.
brun=(--model tiny --microbatches 2 --batch-size 2 --seq-len 32 --weight-dtype mxfp8
  --optimizer muon)
"$bin" plan -n 2 "${brun[@]}" --json >"$tmp/bplan.json" 2>"$tmp/plan.err" &&
  "${mpirun[@]}" -np 2 "$bin" train "${brun[@]}" --steps 2 --gemm-peak 10 --log-every 2 \
    >"$tmp/btrain.out" 2>&1
check "plan and train of an MXFP8 Muon run" $?
python3 - "$tmp/bplan.json" "$tmp/btrain.out" <<'PY'
import json, re, sys
r0 = json.load(open(sys.argv[1]))["ranks"][0]
line = [l for l in open(sys.argv[2]) if l.startswith("memory per rank (accounted, rank 0)")][0]
measured = {k: float(v) for k, v in re.findall(r" (\w+) ([0-9.]+) MiB;", line)}
measured.pop("activations", None)
planned = {k: v / 1048576 for k, v in r0["memory_bytes"].items()}
assert set(measured) == set(planned), (measured, planned)
for k in planned:
    assert abs(measured[k] - planned[k]) <= 0.006, (k, measured[k], planned[k])
assert "scales" in planned and "update_temporaries" in planned, planned
PY
check "plan of an MXFP8 Muon run equals the run's accounted memory" $?
expect_error "plan --backend cuda: a device's refusals" "set the scale layout to row_major" \
  "$bin" plan -n 2 --backend cuda --weight-dtype mxfp8 --scale-layout cublas_swizzle
expect_error "plan --backend cuda: what a device does not run" "pass --reduce fp32" \
  "$bin" plan -n 2 --backend cuda --reduce bf16sr
expect_error "plan --backend cuda: planned as --backend cpu" "plan --backend cuda as --backend cpu" \
  "$bin" plan -n 2 --backend cuda
expect_error "plan --backend host: named as --backend cpu" "--backend host is --backend cpu now" \
  "$bin" plan -n 2 --backend host

printf 'model = "tiny"\nsw = 2\nseq-len = 32\noptimizer = "muon"\n' >"$tmp/run.toml"
"$bin" plan -n 4 --config "$tmp/run.toml" >"$tmp/text" 2>&1 &&
  grep -q "sw=2 sg=2 so=4" "$tmp/text" && grep -q "structured update: .* Muon units, .* split" \
  "$tmp/text" && grep -q "split blocks.0.mlp.fc1" "$tmp/text" &&
  grep -q "ZeRO-1 owner map" "$tmp/text" && grep -q "group  1 chunk  1 .* rank 2 " "$tmp/text"
check "--config, Muon split units and the owner map" $?
"$bin" plan -n 16 --model tiny --ranks-per-node 4 --sw 2 --sg 4 --so 8 >"$tmp/many" 2>&1 &&
  grep -q "HSDP all-reduce \[hsdp: 2\]" "$tmp/many" && grep -q "  of it inter-node" "$tmp/many" &&
  grep -q "min *mean *max" "$tmp/many"
check "16 ranks, HSDP: min/mean/max columns and inter-node bytes" $?

expect_error "plan: missing world size" "--world-size is required" "$bin" plan --model tiny
expect_error "plan: zero ranks" "--world-size must be >= 1" "$bin" plan -n 0
expect_error "plan: bad layout" "sg=2 must divide so=3" "$bin" plan -n 3 --sw 2
expect_error "plan: direct path not modelled" "drop --comm-path direct" "$bin" plan -n 2 \
  --comm-path direct
expect_error "plan: the NCCL path not modelled, named as such" \
  "--comm-path nccl (NCCL on device buffers) is not planned: drop --comm-path nccl" \
  "$bin" plan -n 2 --model moe-tiny --comm-path nccl
# --dump-config writes the planned run's options as a file `train --config` reads: the same
# text train --dump-config writes for those options (plan's -n, --json, --rank-columns left out).
"$bin" plan -n 4 "${run[@]}" --lr 0.01 --json --dump-config >"$tmp/plan.toml" 2>&1 &&
  "$bin" train "${run[@]}" --lr 0.01 --dump-config >"$tmp/train.toml" 2>&1 &&
  cmp -s "$tmp/plan.toml" "$tmp/train.toml" && grep -q '^lr=0.01' "$tmp/plan.toml" &&
  "$bin" train --config "$tmp/plan.toml" --dump-config | cmp -s - "$tmp/train.toml"
check "plan --dump-config: the planned run's options, as train --config reads them" $?
expect_error "plan: bad dtype" "--weight-dtype must be bf16, fp32 or mxfp8" "$bin" plan -n 2 \
  --weight-dtype fp16
expect_error "plan: a resume is not read" "does not read checkpoints" "$bin" plan -n 2 \
  --resume "$tmp"
finish_checks
