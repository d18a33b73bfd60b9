#!/usr/bin/env bash
# `sshsdp train --backend` as a user runs it (cli/train_backend.h):
#   * --help names the option and its choices;
#   * --backend host (the name of the CPU backend's run before there was one path) is refused
#     naming --backend cpu; an unknown backend, what a device does not run yet (bf16
#     reductions, MXFP8 scales its dequantization cannot read), --mx-gemm bf16 with MXFP8
#     experts and NCCL on host memory fail fast, by name, on every rank, before any
#     collective; --backend cuda without a usable GPU says so and names the cpu backend;
#   * --backend cpu is the default run, bit for bit; the engine hands its work off by backend
#     events (waits only for MXFP8's outer gather), and Muon per head moves split units;
#   * an MoE checkpoint resumed with a dense --model names the checkpoint; an MXFP8 run
#     (cuBLAS-swizzled scales by default) resumes bit for bit; --mx-gemm bf16 (row-major
#     scales) trains near the fp32 GEMMs' run and names its path, and its --dump-config file
#     runs as written.
# Usage: backend_cli_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

out=$("$bin" train --help 2>&1)
grep -q -- "--backend" <<<"$out" && grep -q "cuda:N" <<<"$out"
check "train --help names --backend and its choices" $?

tiny=(train --model tiny --layers 2 --d-model 32 --heads 4 --seq-len 16 --batch-size 2
  --microbatches 2)
expect_error "--backend host is refused, naming --backend cpu" \
  "--backend host is --backend cpu now, the default" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend host --steps 1
expect_error "an unknown backend is refused, naming the choices" \
  "--backend must be cpu, cuda or cuda:<ordinal>, got 'tpu'" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend tpu --steps 1
expect_error "--mx-gemm bf16 with MXFP8 experts is refused by name" \
  "--model moe-tiny: --mx-gemm bf16 runs the dense presets only" \
  "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --weight-dtype mxfp8 --mx-gemm bf16 --steps 1
expect_error "MXFP8 on a device with scales it cannot read is refused by name" \
  "set the scale layout to row_major (--scale-layout row_major" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cuda --weight-dtype mxfp8 \
  --scale-layout cublas_swizzle --steps 1
expect_error "bf16 reductions on a device are refused by name" "pass --reduce fp32" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cuda --reduce bf16sr --steps 1
expect_error "--comm-path nccl on the CPU backend (host memory) is refused by name" \
  "--comm-path nccl moves device buffers" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --comm-path nccl --steps 1
expect_error "--ranks-per-node that does not divide the world is named with its fix" \
  "--ranks-per-node 3 must be a positive divisor of the world size 2 (nodes hold equal numbers of ranks), or 0" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --ranks-per-node 3 --steps 1
out=$(timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --no-overlap-outer --steps 1 2>&1)
grep -q "note: --no-overlap-outer ignored: sw = sg = so = the world size leaves no outer phase" \
  <<<"$out"
check "--no-overlap-outer without an outer phase is named as ignored" $?
out=$(timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --no-overlap-outer --so 1 --steps 1 2>&1)
! grep -q "no-overlap-outer ignored" <<<"$out"
check "--no-overlap-outer with an outer phase (--so 1) is not named as ignored" $?
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "--backend cuda without a usable GPU names the cpu backend" "use --backend cpu" \
    "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cuda --steps 1
fi

# --backend cpu is the default; the engine hands off by event, waiting only for MXFP8's outer
# all-gather (codes on the compute thread, so > sw).
for run in "muon bf16" "adamw mxfp8 1 1 2"; do
  read -r opt wdt sw sg so <<<"$run"
  layout=()
  [ -n "$sw" ] && layout=(--sw "$sw" --sg "$sg" --so "$so")
  name="$opt$wdt$sw$sg$so"
  for b in cpu default; do
    backend=()
    [ $b = cpu ] && backend=(--backend cpu)
    timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --optimizer "$opt" --weight-dtype "$wdt" \
      "${layout[@]}" --steps 3 --log-every 1 "${backend[@]}" --metrics "$tmp/${b}_$name.jsonl" \
      >"$tmp/run.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/run.out" | tail -5
    check "$b backend, $opt, $wdt weights, 2 ranks ${layout[*]}: exits 0" $rc
  done
  same_training "$tmp/cpu_$name.jsonl" "$tmp/default_$name.jsonl" 0 3
  check "--backend cpu, $opt, $wdt ${layout[*]}: the default run, bit for bit" $?
  mx_outer=0
  [ -n "$so" ] && mx_outer=1
  python3 - "$tmp/cpu_$name.jsonl" $mx_outer <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
waits = (lambda w: w > 0) if sys.argv[2] == "1" else (lambda w: w == 0)
assert all(r["backend_events"] > 0 and waits(r["backend_waits"]) for r in rows), rows
PY
  check "$opt, $wdt ${layout[*]}: hands off by event (waits only for MXFP8's outer gather)" $?
done
grep -q '"update_p2p_bytes":[1-9]' "$tmp/cpu_muonbf16.jsonl"
check "Muon per head moved split units between the ranks" $?

# An MoE checkpoint resumed as a dense model names where its MoE options came from.
moe=(train --model moe-tiny --layers 2 --d-model 32 --heads 4 --seq-len 16 --batch-size 2
  --shared-expert)
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${moe[@]}" --steps 2 --save-every 2 \
  --ckpt-dir "$tmp/ck_moe" >/dev/null 2>&1
check "--model moe-tiny saves a checkpoint" $?
expect_error "an MoE checkpoint resumed with a dense --model names the checkpoint" \
  "restored them: that checkpoint is an MoE run; resume it with its own --model" \
  "${mpirun[@]}" -np 2 "$bin" train --model tiny --resume "$tmp/ck_moe/step_00000002"

# MXFP8: a checkpoint resumes bit for bit; --mx-gemm bf16 trains near the fp32 GEMMs' run.
mx=(--weight-dtype mxfp8 --steps 4 --log-every 1)
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" \
  --metrics "$tmp/mx_straight.jsonl" >/dev/null 2>&1
check "MXFP8 reference run exits 0" $?
rm -rf "$tmp/ck_mx"
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --save-every 2 \
  --ckpt-dir "$tmp/ck_mx" >/dev/null 2>&1 &&
  timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" \
    --resume "$tmp/ck_mx/step_00000002" --metrics "$tmp/mx_resumed.jsonl" >"$tmp/resume.out" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/resume.out" | tail -5
resumed_like "$tmp/mx_straight.jsonl" "$tmp/mx_resumed.jsonl" 0 || rc=1
check "MXFP8 saved at step 2 and resumed: steps 3-4 bit for bit" $rc
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --mx-gemm bf16 \
  --metrics "$tmp/mx_bf16.jsonl" >"$tmp/mx_bf16.out" 2>&1
rc=$?
grep -q "MXFP8 weights dequantized to bf16 (the peak's path)" "$tmp/mx_bf16.out" || rc=1
python3 - "$tmp/mx_bf16.jsonl" "$tmp/mx_straight.jsonl" <<'PY' || rc=1
import json, sys
b, f = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert b[-1]["loss"] < b[0]["loss"], [r["loss"] for r in b]
# bf16-rounded inputs: close to the fp32 GEMMs' run, not equal to it.
assert b[0]["loss"] != f[0]["loss"] and abs(b[0]["loss"] - f[0]["loss"]) < 1e-2 * f[0]["loss"]
PY
check "--mx-gemm bf16 trains, names its GEMM path and stays near fp32's" $rc
expect_error "--mx-gemm bf16 without MXFP8 weights is refused by name" \
  "use it with --weight-dtype mxfp8" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1 --mx-gemm bf16
"$bin" "${tiny[@]}" "${mx[@]}" --mx-gemm bf16 --dump-config >"$tmp/mx.toml" 2>&1 &&
  timeout 300 "${mpirun[@]}" -np 2 "$bin" train --config "$tmp/mx.toml" --steps 1 >/dev/null 2>&1
check "--mx-gemm bf16: its --dump-config file runs as written" $?

finish_checks
