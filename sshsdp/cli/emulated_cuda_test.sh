#!/usr/bin/env bash
# `sshsdp train --backend cuda` on the CPU emulation of CUDA (backend/testing/cuda_emulation.h:
# the program linked with the CUDA backend's real code and kernels, run on the CPU): what
# scripts/gpu_check.sh checks on a GPU, in CI without one —
#   * the run names the emulated device and reports tokens/s and MFU like any backend;
#   * GPT tiny trains the losses and gradient norms of --backend cpu from the same seed (fp32
#     weights: 1e-5 relative; bf16 weights: 1e-3), with the same communicated bytes, on one
#     rank and with the outer phase across 2 ranks (ZeRO-1, staged through host memory);
#   * MXFP8 blocks (dequantized on the device for fp32 GEMMs) and the MoE preset (routing on
#     the device) likewise; with MXFP8, 2e-3 (engine/testing/parity_harness.h's MxTolerances:
#     after step 1 a last-bit difference in a main weight can land on the neighbouring code).
# Several ranks with runtime collectives need CUDA IPC or NCCL, which the emulation lacks.
# Usage: emulated_cuda_test.sh SSHSDP_EMULATED MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

tiny=(train --attention-dtype fp32 --model tiny --layers 2 --d-model 32 --heads 4 --seq-len 16
  --batch-size 2 --microbatches 2 --steps 4 --log-every 1)
moe=(train --attention-dtype fp32 --model moe-tiny --layers 2 --d-model 32 --heads 4 --seq-len 16
  --batch-size 2 --microbatches 2 --shared-expert --steps 4 --log-every 1 --scale-layout row_major)
for run in "1 tiny adamw fp32 1e-5" "1 tiny muon bf16 1e-3" "2 tiny adamw fp32 1e-5 1 1 2" \
  "1 tiny adamw mxfp8 2e-3" "1 moe adamw fp32 1e-5" "1 moe muon mxfp8 2e-3"; do
  read -r np model opt wdt tol sw sg so <<<"$run"
  layout=()
  [ -n "${sw:-}" ] && layout=(--sw "$sw" --sg "$sg" --so "$so")
  if [ "$model" = tiny ]; then args=("${tiny[@]}"); else args=("${moe[@]}"); fi
  name="$np$model$opt$wdt${sw:-}"
  # The first run measures the device's GEMM peak at start-up (slow on the emulation: ~17 s);
  # the others are given one.
  peak=(--gemm-peak 100)
  [ "$name" = 1tinyadamwfp32 ] && peak=()
  for b in cuda cpu; do
    timeout 300 "${mpirun[@]}" -np "$np" "$bin" "${args[@]}" --optimizer "$opt" \
      --weight-dtype "$wdt" "${layout[@]}" --backend $b --metrics "$tmp/${b}_$name.jsonl" \
      "${peak[@]}" >"$tmp/$b.out" 2>&1
    rc=$?
    [ $b = cuda ] && [ ${#peak[@]} -eq 0 ] && cp "$tmp/$b.out" "$tmp/measured.out"
    [ $b = cuda ] && ! grep -q "CUDA emulated on the CPU" "$tmp/$b.out" && rc=1
    [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/$b.out" | tail -8
    check "$np rank(s), $model, $opt, $wdt ${layout[*]}: --backend $b exits 0 (and names the device)" $rc
  done
  same_training "$tmp/cuda_$name.jsonl" "$tmp/cpu_$name.jsonl" "$tol"
  check "$np rank(s), $model, $opt, $wdt ${layout[*]}: cuda trains cpu's losses within $tol" $?
done
grep -q "GEMM on backend cuda:0 (CUDA emulated on the CPU" "$tmp/measured.out" &&
  grep -qE "tok/s" "$tmp/measured.out" && grep -qE "MFU" "$tmp/measured.out"
check "the device's GEMM peak is measured; the progress line reports tokens/s and MFU" $?
# A model using an op the backend lacks is refused naming the op and the way out.
"$bin" train --model qwen3-tiny --backend cuda --steps 1 >"$tmp/rope.out" 2>&1
[ $? -ne 0 ] && grep -q "Llama-family model on backend cuda:0.*it has no RoPE.*use --backend cpu" \
  "$tmp/rope.out"
check "the Llama family on a backend without RoPE is refused by name" $?
finish_checks
