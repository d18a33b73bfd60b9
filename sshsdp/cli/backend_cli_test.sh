#!/usr/bin/env bash
# `sshsdp train --backend` as a user runs it (cli/train_backend.h):
#   * --help names the option and its choices;
#   * what the engine on a backend does not run yet (bf16 reductions, --mx-gemm bf16 for MoE), MXFP8 scales in a
#     layout its dequantization cannot read, an unknown backend and NCCL on host memory fail
#     fast, by name, on every rank, before any collective; --backend cuda without a usable GPU
#     says so and names the cpu backend;
#   * --backend cpu on 2 ranks (the device code path: every root, the update's temporaries and
#     every engine op on the backend; Muon's split units staged through the host) trains the
#     same losses and gradient norms as the host engine (relative 1e-6 with fp32 weights, 1e-4
#     with bf16 ones), with the same communicated bytes per step (exact), for AdamW and for
#     Muon per head, and with the outer phase (ZeRO-1 across the ranks, DDP); with MXFP8
#     blocks bit for bit; the MoE preset bit for bit (AdamW, Muon per expert, MXFP8 experts);
#     and validation runs on it;
#   * a checkpoint saved at step 2 of 4 by --backend cpu resumes on --backend cpu and on the
#     host engine, and one saved by the host engine resumes on --backend cpu, each giving
#     steps 3-4 the uninterrupted run's losses.
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

# --attention-dtype fp32: the MoE presets' backend model runs fp32 attention, so the host runs it
# compares with keep attention fp32 too (the dense GPT is one model on both sides).
tiny=(train --attention-dtype fp32 --model tiny --layers 2 --d-model 32 --heads 4 --seq-len 16 --batch-size 2
  --microbatches 2)
expect_error "an unknown backend is refused, naming the choices" \
  "--backend must be host, cpu, cuda or cuda:<ordinal>, got 'tpu'" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend tpu --steps 1
expect_error "--mx-gemm bf16 with MXFP8 experts on a backend is refused by name" \
  "--model moe-tiny: --mx-gemm bf16 runs the dense presets only" \
  "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --backend cpu --weight-dtype mxfp8 \
  --mx-gemm bf16 --steps 1
expect_error "MXFP8 on a backend with scales the device cannot read is refused by name" \
  "set the scale layout to row_major (--scale-layout row_major" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --weight-dtype mxfp8 \
  --scale-layout cublas_swizzle --steps 1
expect_error "bf16 reductions on a backend are refused by name" "pass --reduce fp32" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --reduce bf16sr --steps 1
expect_error "--comm-path nccl on the host engine is refused by name" "--comm-path nccl moves device buffers" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --comm-path nccl --steps 1
expect_error "--comm-path nccl on the CPU backend (host memory) is refused by name" \
  "--comm-path nccl moves device buffers" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --comm-path nccl --steps 1
expect_error "--ranks-per-node that does not divide the world is named with its fix" \
  "--ranks-per-node 3 must be a positive divisor of the world size 2 (nodes hold equal numbers of ranks), or 0" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --ranks-per-node 3 --steps 1
out=$(timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --no-overlap-outer \
  --steps 1 2>&1)
grep -q "note: --no-overlap-outer ignored: sw = sg = so = the world size leaves no outer phase" \
  <<<"$out"
check "--no-overlap-outer without an outer phase is named as ignored" $?
out=$(timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --no-overlap-outer \
  --so 1 --steps 1 2>&1)
! grep -q "no-overlap-outer ignored" <<<"$out"
check "--no-overlap-outer with an outer phase (--so 1) is not named as ignored" $?
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "--backend cuda without a usable GPU names the cpu backend" "use --backend cpu" \
    "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cuda --steps 1
fi

# --backend cpu against the host engine, 2 ranks: the one Gpt on the run's CPU backend against
# the same Gpt on its own (fp32 weights to 1e-6, bf16 to 1e-4, AdamW with bf16 weights bit for
# bit), through --backend's whole set-up (options, device comm choice, notes).
# Then the outer phase on the backend: ZeRO-1 across the 2 ranks (sw = sg = 1: the outer
# reduce-scatter and all-gather every step) and DDP (so = 1: HSDP's all-reduce). Then MXFP8
# blocks, bit for bit: the backend dequantizes the same codes with the same scales (relaid out
# row-major there, cuBLAS-swizzled on the host) into the same fp32 weights.
for run in "adamw fp32" "muon fp32" "adamw bf16" "muon bf16" "adamw fp32 1 1 2" "muon bf16 1 1 1" \
  "adamw mxfp8" "muon mxfp8 1 1 2"; do
  read -r opt wdt sw sg so <<<"$run"
  layout=()
  [ -n "$sw" ] && layout=(--sw "$sw" --sg "$sg" --so "$so")
  name="$opt$wdt$sw$sg$so"
  timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --optimizer "$opt" --weight-dtype "$wdt" \
    "${layout[@]}" --steps 4 --log-every 1 --backend cpu --metrics "$tmp/backend_$name.jsonl" \
    >"$tmp/backend.out" 2>&1
  rc=$?
  grep -q "backend cpu" "$tmp/backend.out" || rc=1
  [ "$wdt" = mxfp8 ] && ! grep -q "dequantized to fp32 for each GEMM" "$tmp/backend.out" && rc=1
  [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/backend.out" | tail -5
  check "--backend cpu, $opt, $wdt weights, 2 ranks ${layout[*]}: exits 0 and names the backend" $rc
  timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --optimizer "$opt" --weight-dtype "$wdt" \
    "${layout[@]}" --steps 4 --log-every 1 --metrics "$tmp/host_$name.jsonl" >/dev/null 2>&1
  check "host engine, $opt, $wdt weights, 2 ranks ${layout[*]}: exits 0" $?
  case "$wdt/$opt" in
    fp32/*) tol=1e-6 ;;
    mxfp8/* | bf16/adamw) tol=0 ;;
    *) tol=1e-4 ;;
  esac
  same_training "$tmp/backend_$name.jsonl" "$tmp/host_$name.jsonl" $tol
  check "--backend cpu, $opt, $wdt weights ${layout[*]}: the host engine's losses, norms and bytes" $?
  # MXFP8 codes take their outer all-gather on the compute thread (so > sw): it waits there.
  mx_outer=0
  [ "$wdt" = mxfp8 ] && [ -n "$so" ] && [ "$so" -gt "$sw" ] && mx_outer=1
  python3 - "$tmp/backend_$name.jsonl" "$tmp/host_$name.jsonl" $mx_outer <<'PY'
import json, sys
dev, host = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
waits = (lambda w: w > 0) if sys.argv[3] == "1" else (lambda w: w == 0)
# The host engine runs on the CPU backend too: the same hand-offs.
assert all(r["backend_events"] > 0 and waits(r["backend_waits"]) for r in dev + host), (dev, host)
PY
  check "--backend cpu and host, $opt, $wdt weights ${layout[*]}: hand off by event (waits only for MXFP8's outer gather)" $?
done
# The MoE preset on the backend (models/backend_moe.h: the router and the experts' GEMMs
# on the backend): bit for bit with the host engine training MoeGpt — AdamW with fp32 weights,
# Muon per expert with bf16 weights and the outer phase (ZeRO-1 across the ranks), and MXFP8
# experts (their scales row-major on both: the host dequantizes them as the device does).
moe=(train --attention-dtype fp32 --model moe-tiny --layers 2 --d-model 32 --heads 4 --seq-len 16
  --batch-size 2 --microbatches 2 --shared-expert --steps 4 --log-every 1
  --scale-layout row_major)
for run in "adamw fp32" "muon bf16 1 1 2" "muon mxfp8"; do
  read -r opt wdt sw sg so <<<"$run"
  layout=()
  [ -n "$sw" ] && layout=(--sw "$sw" --sg "$sg" --so "$so")
  for b in cpu host; do
    timeout 300 "${mpirun[@]}" -np 2 "$bin" "${moe[@]}" --optimizer "$opt" --weight-dtype "$wdt" \
      "${layout[@]}" --backend $b --metrics "$tmp/moe_$b.jsonl" >"$tmp/moe.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/moe.out" | tail -5
    check "--model moe-tiny --backend $b, $opt, $wdt weights ${layout[*]}: exits 0" $rc
  done
  same_training "$tmp/moe_cpu.jsonl" "$tmp/moe_host.jsonl" 0
  check "--model moe-tiny --backend cpu, $opt, $wdt ${layout[*]}: the host engine's losses, norms and bytes, bit for bit" $?
done

# An MoE checkpoint resumed as a dense model names where its MoE options came from.
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${moe[@]}" --backend cpu --steps 2 --save-every 2 \
  --ckpt-dir "$tmp/ck_moe" >/dev/null 2>&1
check "--model moe-tiny --backend cpu saves a checkpoint" $?
expect_error "an MoE checkpoint resumed with a dense --model names the checkpoint" \
  "restored them: that checkpoint is an MoE run; resume it with its own --model" \
  "${mpirun[@]}" -np 2 "$bin" train --backend cpu --model tiny --resume "$tmp/ck_moe/step_00000002"

grep -q '"update_p2p_bytes":[1-9]' "$tmp/backend_muonbf16.jsonl"
check "Muon per head on the backend moved split units between the ranks" $?

timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --backend cpu --steps 2 --eval-every 2 \
  --eval-tokens 64 --log-every 1 --save-weights "$tmp/w.safetensors" >"$tmp/eval.out" 2>&1
rc=$?
grep -q "val " "$tmp/eval.out" && [ -s "$tmp/w.safetensors" ] || rc=1
check "--backend cpu: validation loss and --save-weights" $rc

# Checkpoints across the backend boundary (Muon per head, bf16 weights: every state field).
ck=(--optimizer muon --steps 4 --log-every 1)
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${ck[@]}" --backend cpu \
  --metrics "$tmp/straight.jsonl" >/dev/null 2>&1
check "checkpoint reference run exits 0" $?
for saver in cpu host; do
  rm -rf "$tmp/ck_$saver"
  timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${ck[@]}" --backend "$saver" \
    --save-every 2 --ckpt-dir "$tmp/ck_$saver" --metrics "$tmp/saved_$saver.jsonl" >/dev/null 2>&1
  check "--backend $saver saves a checkpoint" $?
  for loader in cpu host; do
    [ "$saver" = host ] && [ "$loader" = host ] && continue
    timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${ck[@]}" --backend "$loader" \
      --resume "$tmp/ck_$saver/step_00000002" --metrics "$tmp/resumed.jsonl" >"$tmp/resume.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/resume.out" | tail -5
    resumed_like "$tmp/straight.jsonl" "$tmp/resumed.jsonl" 1e-4 || rc=1
    check "saved by --backend $saver, resumed by --backend $loader: steps 3-4 as uninterrupted" $rc
  done
done
# MXFP8 on the backend: its scale layout (auto: row_major there) is the launch's, so a checkpoint
# resumes on the backend (and on the host engine, whose auto is cublas_swizzle) and a
# --dump-config file runs as written.
mx=(--weight-dtype mxfp8 --steps 4 --log-every 1)
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --backend cpu \
  --metrics "$tmp/mx_straight.jsonl" >/dev/null 2>&1
check "MXFP8 reference run on --backend cpu exits 0" $?
rm -rf "$tmp/ck_mx"
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --backend cpu --save-every 2 \
  --ckpt-dir "$tmp/ck_mx" >/dev/null 2>&1
check "MXFP8 on --backend cpu saves a checkpoint" $?
for loader in cpu host; do
  timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --backend "$loader" \
    --resume "$tmp/ck_mx/step_00000002" --metrics "$tmp/mx_resumed.jsonl" >"$tmp/resume.out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/resume.out" | tail -5
  resumed_like "$tmp/mx_straight.jsonl" "$tmp/mx_resumed.jsonl" 0 || rc=1
  check "MXFP8 saved by --backend cpu, resumed by --backend $loader: steps 3-4 bit for bit" $rc
done
# --mx-gemm bf16: the MXFP8 blocks' GEMMs in bf16 (the GPU's fast path), named in the header;
# a host run or other weights refuse it by name.
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --backend cpu --mx-gemm bf16 \
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
check "--mx-gemm bf16 on --backend cpu trains, names its GEMM path and stays near fp32's" $rc
expect_error "--mx-gemm bf16 on the host engine is refused by name" \
  "use it with --backend and --weight-dtype mxfp8" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" "${mx[@]}" --mx-gemm bf16
"$bin" "${tiny[@]}" "${mx[@]}" --backend cpu --dump-config >"$tmp/mx.toml" 2>&1 &&
  timeout 300 "${mpirun[@]}" -np 2 "$bin" train --config "$tmp/mx.toml" --steps 1 >/dev/null 2>&1
check "MXFP8 on --backend cpu: its --dump-config file runs as written" $?

# Where a run executes is per launch: a resume without --backend runs on the host engine.
timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --optimizer muon --steps 3 \
  --resume "$tmp/ck_cpu/step_00000002" >"$tmp/resume.out" 2>&1
rc=$?
grep -q "| backend" "$tmp/resume.out" && rc=1
check "a checkpoint saved by --backend cpu resumes on the host engine without --backend" $rc

finish_checks
