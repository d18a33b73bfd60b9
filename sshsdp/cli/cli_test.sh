#!/usr/bin/env bash
# End-to-end checks of the `sshsdp` program as a user runs it:
#   * --help is complete and exits 0 without mpirun;
#   * bad input (layout not fitting the world, unknown dtype, malformed token file) fails
#     fast with a message naming the problem, non-zero, and no rank hangs;
#   * a short multi-rank training run writes metrics whose loss falls, and safetensors;
#   * moe-tiny with MXFP8 expert weights trains;
#   * the header names the GEMM path and its peak; --gemm-peak pins it, and an MFU above
#     100 % carries a warning (run again with SSHSDP_BF16_GEMM=widened as cli_test_widened).
# Usage: cli_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

# cli_test_widened forces the portable bf16 GEMM path. A CPU without native bf16 GEMMs (neither
# AVX512-BF16 nor AMX-BF16) runs that path in cli_test already: skipped, not run twice.
if [ "${SSHSDP_BF16_GEMM:-}" = widened ] && ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  echo "skipped: no AVX512-BF16 or AMX-BF16 here, so cli_test ran the widened path"
  exit 77
fi

out=$("$bin" train --help 2>&1); rc=$?
[ $rc -eq 0 ] && for f in --model --sw --sg --so --ranks-per-node --microbatches --batch-size \
  --steps --lr --weight-dtype --seed --data --metrics --save-weights --init-weights \
  --gemm-peak --comm-timeout --on-nonfinite --config --dump-config --vocab-size --val-data \
  --eval-every --eval-tokens --lr-schedule --lr-min --decay-steps --allow-data-change; do
  grep -q -- "$f" <<<"$out" || { echo "help lacks $f"; rc=1; }
done
check "train --help lists every option" $rc
grep -q -- "--muon-nesterov,--no-muon-nesterov{false}=true" <<<"$out"
check "train --help shows --muon-nesterov on by default" $?
out=$("$bin" generate --help 2>&1); rc=$?
for f in --ckpt --weights --prompt --prompt-tokens --tokens --temperature --top-k --seed; do
  grep -q -- "$f" <<<"$out" || { echo "generate help lacks $f"; rc=1; }
done
check "generate --help lists every option" $rc

"$bin" >/dev/null 2>&1; rc=$?
check "no subcommand is an error" $([ $rc -ne 0 ] && echo 0 || echo 1)

tiny=(train --model tiny --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch-size 2)
# Ranks started with different options (an MPMD line, a per-node --config) are refused by
# name before any collective: different --steps hung rank 0 until the watchdog, different
# models crashed it, a different --lr trained inconsistent shards.
expect_error "ranks with different --steps: refused, naming the rank and the option" \
  "rank 1 was started with options that differ from rank 0's (rank 1 vs rank 0: 'steps=2' vs 'steps=3')" \
  "${mpirun[@]}" -np 1 "$bin" "${tiny[@]}" --steps 3 : -np 1 "$bin" "${tiny[@]}" --steps 2
# ... but --backend cuda:N may differ per rank (an MPMD launch spreading ranks over GPUs): the
# launch gets past the comparison (here to the missing GPU, or on a GPU machine to training).
timeout 60 "${mpirun[@]}" -np 1 "$bin" "${tiny[@]}" --backend cuda:0 --steps 1 : -np 1 "$bin" \
  "${tiny[@]}" --backend cuda:1 --steps 1 >"$tmp/out" 2>&1
! grep -q "differ from rank 0" "$tmp/out"
check "ranks with --backend cuda:0 and cuda:1 agree" $?
printf 'model = "tiny"\nsteps = 1\n' >"$tmp/c.toml"
expect_error "--metrics onto the --config file is refused" "is the file --config" \
  "$bin" train --config "$tmp/c.toml" --metrics "$tmp/c.toml"
grep -q 'model = "tiny"' "$tmp/c.toml"
check "  ... and the config file is untouched" $?
timeout 60 "$bin" "${tiny[@]}" --steps 1 --trace-steps 1:2 >"$tmp/ts.out" 2>&1 &&
  grep -q "note: --trace-steps 1:2 has no effect without --trace" "$tmp/ts.out"
check "--trace-steps without --trace trains with a note" $?
expect_error "bench --json and --trace naming one file is refused" "name the same file" \
  "$bin" bench --model tiny --layers 1 --steps 1 --json "$tmp/b.json" --trace "$tmp/b.json"
expect_error "plan --ranks-per-node -1 is refused like train's" "--ranks-per-node -1 must be" \
  "$bin" plan -n 4 --ranks-per-node -1
expect_error "plan --rank-columns -1 is refused" "--rank-columns" "$bin" plan -n 4 --rank-columns -1
# Only sshsdp's checkpoints guard their directories: an unrelated manifest.json, or a file
# named latest without step directories beside it, do not.
mkdir -p "$tmp/webapp" && echo '{"name": "app"}' >"$tmp/webapp/manifest.json" &&
  echo notes >"$tmp/webapp/latest" &&
  timeout 60 "$bin" "${tiny[@]}" --steps 1 --metrics "$tmp/webapp/m.jsonl" >/dev/null 2>&1
check "an output beside an unrelated manifest.json and latest file is allowed" $?
# Ranks whose kernels differ (nodes of another CPU kind, another SSHSDP_GEMM) train, with a
# note on rank 0 naming the rank and the kernels; ranks that agree get no such note.
"${mpirun[@]}" -np 1 -x SSHSDP_GEMM=onednn "$bin" "${tiny[@]}" --steps 1 : -np 1 \
  -x SSHSDP_GEMM=blis "$bin" "${tiny[@]}" --steps 1 >"$tmp/out" 2>&1 &&
  grep "note: the kernels of rank 1 differ from rank 0's (rank 1 vs rank 0: " "$tmp/out" |
  grep -q "BLIS"
check "ranks on other GEMM providers: noted by name" $?
"${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1 >"$tmp/out" 2>&1 &&
  ! grep -q "note: the kernels of" "$tmp/out"
check "ranks on the same kernels: no note" $?
expect_error "bench ranks with different --lr: refused" \
  "rank 1 was started with options that differ from rank 0's (rank 1 vs rank 0: 'lr=0.1' vs 'lr=0.003')" \
  "${mpirun[@]}" -np 1 "$bin" bench --model tiny --layers 1 --steps 1 : -np 1 "$bin" bench \
  --model tiny --layers 1 --steps 1 --lr 0.1
# An output renamed into place must be a file that can be created now: a device there would be
# replaced by a regular file (as root: /dev/full), and /proc refuses new files only at the end.
# Validation over held-out samples of the training source is capped (it never ends otherwise).
timeout 60 "$bin" "${tiny[@]}" --steps 1 --eval-every 1 --eval-tokens 2000000000 \
  >"$tmp/evalcap.out" 2>&1 && grep -q "note: --eval-tokens 2000000000 exceeds the 4194304" \
  "$tmp/evalcap.out"
check "--eval-tokens beyond the held-out budget is capped, with a note" $?
# --config files are parsed as TOML (toml++): a syntax error names its line and column, a
# table that is not [train] is refused.
printf 'steps = 2\nmodel = "tiny\n' >"$tmp/bad.toml"
expect_error "a TOML syntax error names the file, line and column" "bad.toml:2:" \
  "$bin" train --config "$tmp/bad.toml"
printf '[optimizer]\nlr = 0.1\n' >"$tmp/table.toml"
expect_error "a table other than [train] is refused" "'optimizer' is a table" \
  "$bin" train --config "$tmp/table.toml"
expect_error "--dump-config of a config train refuses is an error, not a file" \
  "AdamW lr (--lr) must be a finite number >= 0" "$bin" train --dump-config --lr -1
timeout 60 "$bin" "${tiny[@]}" --steps 2 --warmup 100 >"$tmp/warm.out" 2>&1 &&
  grep -q "note: --warmup 100 is longer than --steps 2" "$tmp/warm.out"
check "--warmup beyond --steps trains with a note, not without a word" $?
expect_error "a microbatch too large for the node is refused before allocating" \
  "a microbatch of 1000000000 x 16 tokens per rank keeps at least" \
  "$bin" "${tiny[@]}" --steps 1 --batch-size 1000000000
expect_error "an integer out of range names the option and its range, not 'Could not convert'" \
  "--steps 99999999999: not a whole number in the option's range" \
  "$bin" train --steps 99999999999
expect_error "bench --json into a missing directory fails at start-up, named" \
  "--json $tmp/nodir/b.json: directory '$tmp/nodir' does not exist" \
  "$bin" bench --model tiny --json "$tmp/nodir/b.json"
timeout 60 "$bin" "${tiny[@]}" --steps 3 --ckpt-dir "$tmp/final_ckpt" >/dev/null 2>&1 &&
  [ -f "$tmp/final_ckpt/step_00000003/manifest.json" ]
check "--ckpt-dir without --save-every saves the final state" $?
expect_error "an unknown command is named, with the commands" \
  "unknown command 'frobnicate': use train, bench, plan, generate, ckpt, tokenize or export-hf" "$bin" frobnicate
expect_error "--val-data naming a directory is named as --val-data" \
  "--val-data $tmp: is a directory" "$bin" "${tiny[@]}" --steps 1 --eval-every 1 --val-data "$tmp"
timeout 60 "$bin" "${tiny[@]}" --steps 2 --trace "$tmp/late.json" --trace-steps 10:20 \
  >"$tmp/late.out" 2>&1 && grep -q "note: --trace-steps 10:20 starts after the last step" \
  "$tmp/late.out"
check "a --trace-steps window past --steps says the trace holds no step" $?
expect_error "plan of an absurd world is refused, not run for hours" \
  "plans at most 65536" "$bin" plan -n 1000000000
expect_error "--save-weights on a device is refused at start-up" \
  "--save-weights /dev/full: exists and is not a regular file" \
  "$bin" "${tiny[@]}" --save-weights /dev/full --steps 1
[ -c /dev/full ]
check "/dev/full is still a character device" $?
# That refusal is rank 0's alone: the MPI_Abort it ends in signals the other ranks before their
# first step, which must not read as a preemption ("finishing the current step").
timeout 60 "${mpirun[@]}" -np 3 "$bin" "${tiny[@]}" --save-weights /dev/full --steps 1 \
  >"$tmp/out" 2>&1
[ $? -ne 0 ] && grep -q "exists and is not a regular file" "$tmp/out" &&
  ! grep -q "finishing the current step" "$tmp/out"
check "other ranks stopped by a start-up error do not report a preemption" $?
expect_error "--trace where no file can be created is refused at start-up" \
  "--trace /proc/t.json: cannot create /proc/t.json.tmp" "$bin" "${tiny[@]}" --trace /proc/t.json \
  --steps 1
# A model that cannot fit the node is refused by size before anything is allocated (it was
# ended by the OOM killer, with no message, after allocating the machine's memory).
expect_error "a model too large for the node is refused before allocating" \
  "would need at least" "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --d-model 65536 --heads 2 \
  --layers 64 --steps 1
# Dimensions far beyond any published model are refused by bound before anything is sized
# from them (10^9 blocks built for minutes; 4·2·10^9 overflowed d_ff).
expect_error "a block count beyond the bound is refused at once" \
  "n_layer = 1000000000 is above sshsdp's bound of 4096" \
  "$bin" "${tiny[@]}" --steps 1 --layers 1000000000
expect_error "plan: a width beyond the bound is refused, not overflowed" \
  "d_model = 2000000000 is above sshsdp's bound" "$bin" plan -n 1 --d-model 2000000000
# Values whose default means "unset" are refused when given out of range, not taken as unset.
expect_error "--sw 0 is refused, not taken as unset" "--sw: must be an integer >= 1, got '0'" \
  "$bin" "${tiny[@]}" --sw 0 --steps 1
expect_error "--lr-min below 0 is refused, not replaced by --lr / 10" \
  "--lr-min: must be a finite number >= 0, got '-0.001'" "$bin" "${tiny[@]}" --lr-schedule cosine \
  --lr-min -0.001 --steps 1
expect_error "--aux-loss-weight nan is refused" "--aux-loss-weight: must be a finite number >= 0" \
  "$bin" train --model moe-tiny --aux-loss-weight nan --steps 1
"$bin" "${tiny[@]}" --seed 18446744073709551615 --steps 1 >/dev/null 2>&1 &&
  "$bin" "${tiny[@]}" --seed 0x2A --sr-seed 0 --steps 1 >/dev/null 2>&1
check "seeds up to 2^64-1 and in hex are accepted" $?
expect_error "a negative --seed is refused, not wrapped" "--seed: must be an integer >= 0, got '-1'" \
  "$bin" "${tiny[@]}" --seed -1 --steps 1
expect_error "a layout error says where the degrees not given came from" \
  "sg=2 must divide so=3 (each ZeRO-1 shard nests in a ZeRO-2 shard); pick so as a multiple of sg (--sg, --so not given: sg = --sw 2, so = the world size 3)" \
  "${mpirun[@]}" -np 3 "$bin" "${tiny[@]}" --sw 2 --steps 1
expect_error "layout not dividing the world is refused before any collective" "so=3 must divide the world size 2" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --so 3 --steps 1
expect_error "non-nested degrees are refused" "sw=2 must divide sg=1" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --sw 2 --sg 1 --steps 1
expect_error "unknown weight dtype is refused" "weight-dtype must be bf16, fp32 or mxfp8, got 'fp16'" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --weight-dtype fp16 --steps 1
expect_error "a raw element type is not a weight dtype" "weight-dtype must be bf16, fp32 or mxfp8, got 'e4m3'" \
  "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --weight-dtype e4m3 --steps 1
expect_error "an unknown attention dtype is refused" "attention-dtype must be auto" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --attention-dtype bf16 --steps 1
expect_error "MoE options on a dense preset are refused" "apply to MoE presets" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --experts 4 --steps 1
expect_error "an explicit --top-k 0 reaches validation (not the preset's default)" "top_k (0)" \
  "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --top-k 0 --steps 1
expect_error "a negative --aux-loss-weight is refused" "--aux-loss-weight: must be a finite number >= 0" \
  "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --aux-loss-weight -0.5 --steps 1
printf 'abc' >"$tmp/odd.bin"
expect_error "malformed token file is named" "odd.bin" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --data "$tmp/odd.bin" --steps 1
expect_error "missing init weights file is named" "nope.safetensors" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --init-weights "$tmp/nope.safetensors" --steps 1
# Hyperparameters and sizes that cannot train are refused by name before any collective.
for bad in "--lr nan|AdamW lr (--lr) must be a finite number >= 0, got nan" \
           "--lr -1|AdamW lr (--lr) must be a finite number >= 0, got -1" \
           "--beta1 1.5|AdamW beta1 (--beta1) must lie in [0, 1), got 1.5" \
           "--eps -1|AdamW eps (--eps) must be a finite number > 0" \
           "--clip -1|(--clip) must be a finite number >= 0" \
           "--muon-momentum 1|(--muon-momentum) must lie in [0, 1)" \
           "--warmup -1|--warmup must be >= 0 steps, got -1" \
           "--seq-len -8|must be >= 0 (0: the preset's)" \
           "--seq-len 200|--seq-len 200 exceeds the 'tiny' preset's context of 64 tokens" \
           "--on-nonfinite ignore|--on-nonfinite must be stop or skip, got 'ignore'" \
           "--save-weights $tmp/no/such/dir/w.safetensors|directory '$tmp/no/such/dir' does not exist" \
           "--metrics $tmp|--metrics $tmp: is a directory" \
           "--data $tmp|token file '$tmp': not a regular file (a directory)"; do
  flag=${bad%%|*}
  # shellcheck disable=SC2086  # flag is an option and its value
  expect_error "refused: $flag" "${bad#*|}" "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" $flag --steps 1
done
expect_error "a negative --gemm-peak is refused" "gemm-peak must be a GFLOP/s figure per rank >= 0" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --gemm-peak -5 --steps 1
expect_error "an unknown SSHSDP_GEMM is refused, naming the providers" "SSHSDP_GEMM=openblas: GEMM provider 'openblas' is not one of auto, onednn, mkl, blis" \
  env SSHSDP_GEMM=openblas "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1
expect_error "an unknown SSHSDP_BF16_GEMM is refused, naming the choices" "SSHSDP_BF16_GEMM=amx: bf16 GEMM path 'amx' is not one of auto, native, widened" \
  env SSHSDP_BF16_GEMM=amx "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1
expect_error "an unknown SSHSDP_BF16_ATTENTION_PRODUCTS is refused, naming the choices" "SSHSDP_BF16_ATTENTION_PRODUCTS=vnni: bf16 attention products 'vnni' are not one of auto, amx, avx512bf16" \
  env SSHSDP_BF16_ATTENTION_PRODUCTS=vnni "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1
expect_error "an unknown SSHSDP_BF16_GEMM_KERNEL is refused, naming the choices" "SSHSDP_BF16_GEMM_KERNEL=mkl: bf16 GEMM kernel 'mkl' is not one of auto, amx, onednn" \
  env SSHSDP_BF16_GEMM_KERNEL=mkl "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1

timeout 300 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --sw 2 --sg 2 --so 2 --microbatches 2 \
  --steps 40 --lr 1e-2 --log-every 10 --metrics "$tmp/m.jsonl" \
  --save-weights "$tmp/w.safetensors" >"$tmp/train.out" 2>&1
rc=$?
check "short 2-rank training run exits 0" $rc
first=$(head -1 "$tmp/m.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
last=$(tail -1 "$tmp/m.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
echo "  loss $first -> $last over $(wc -l <"$tmp/m.jsonl") steps"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'
check "loss falls by more than 1 nat" $?
grep -q "MFU" "$tmp/train.out" && grep -q "tok/s" "$tmp/train.out"
check "progress line shows tokens/s and MFU" $?
# The outer phase (DDP layout: every gradient all-reduced across the two replicas) overlapped by
# default and in the update phase with --no-overlap-outer: counted only when overlapped, the
# same losses either way.
for o in on off; do
  flag=(); [ $o = off ] && flag=(--no-overlap-outer)
  timeout 120 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --sw 1 --sg 1 --so 1 --steps 3 \
    --log-every 1 --metrics "$tmp/outer_$o.jsonl" "${flag[@]}" >/dev/null 2>&1 || echo "  outer $o: train failed"
done
python3 - "$tmp/outer_on.jsonl" "$tmp/outer_off.jsonl" <<'PY'
import json, sys
on, off = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(on) == len(off) == 3, (on, off)
assert all(r["outer_overlapped"] > 0 for r in on) and all(r["outer_overlapped"] == 0 for r in off)
assert [r["loss"] for r in on] == [r["loss"] for r in off], ([r["loss"] for r in on], [r["loss"] for r in off])
PY
check "--no-overlap-outer: the outer phase counted only when overlapped, same losses" $?
# The GEMM path the bf16 weights take, named with the peak it is measured against.
# Forced, or on a CPU without native bf16 GEMMs, the widened path; otherwise either.
want_path="bf16 \(native\|widened to fp32\)"
if [ "${SSHSDP_BF16_GEMM:-auto}" = widened ] || ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  want_path="bf16 widened to fp32"
fi
grep -q "^GEMM: $want_path .*peak [0-9.]* GFLOP/s/rank (measured on 2 ranks at once" "$tmp/train.out"
check "header names the GEMM path and the all-ranks peak" $?
# bf16 weights run bf16 attention by default, on the kernel this CPU has; fp32 on request.
grep -q "| attention bf16 " "$tmp/train.out"
check "header names bf16 attention for bf16 weights" $?
timeout 120 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1 --attention-dtype fp32 \
  2>&1 | grep -q "| attention fp32 (\(oneDNN\|MKL\|BLIS\))"
check "--attention-dtype fp32 keeps attention fp32 (header)" $?
[ -s "$tmp/w.safetensors" ]
check "final weights written as safetensors" $?
# Tensor bytes of a safetensors file: everything after the 8-byte length and the JSON header
# (whose metadata, e.g. the step count, may differ).
tensor_bytes() { tail -c +$((9 + $(od -An -t u8 -N8 "$1" | tr -d ' '))) "$1"; }
timeout 120 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 0 \
  --init-weights "$tmp/w.safetensors" --save-weights "$tmp/w2.safetensors" >/dev/null 2>&1 &&
  cmp -s <(tensor_bytes "$tmp/w.safetensors") <(tensor_bytes "$tmp/w2.safetensors")
check "--init-weights round-trips the saved weights bit for bit" $?
# The same file with one weight set to NaN is refused, naming the tensor.
python3 - "$tmp/w.safetensors" "$tmp/nan.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
name, e = next((k, v) for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__")
at = 8 + n + e["data_offsets"][0]
open(sys.argv[2], "wb").write(raw[:at] + struct.pack("<f", float("nan")) + raw[at + 4:])

PY
expect_error "--init-weights with a NaN is refused, naming the tensor" "holds a non-finite value (nan at element 0)" \
  "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 1 --init-weights "$tmp/nan.safetensors"

# MoE with MXFP8 expert weights: experts in their own runtime groups (the only MX ones).
timeout 120 "${mpirun[@]}" -np 2 "$bin" train --model moe-tiny --weight-dtype mxfp8 --steps 20 \
  --log-every 10 --metrics "$tmp/moe.jsonl" >"$tmp/moe.out" 2>&1 &&
  grep -q "expert groups" "$tmp/moe.out" && grep -q "weights mxfp8" "$tmp/moe.out" &&
  grep -q "^GEMM: MXFP8 weights dequantized to fp32 (the peak.s path): fp32 .*; groups kept in bf16: bf16 " "$tmp/moe.out"
check "moe-tiny --weight-dtype mxfp8 runs (expert groups); the header names both GEMM paths" $?
first=$(head -1 "$tmp/moe.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
last=$(tail -1 "$tmp/moe.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
echo "  moe mxfp8 loss $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'
check "moe-tiny mxfp8 loss falls by more than 1 nat" $?

# A loss that turns NaN (lr 1e30 without clipping blows the weights up at the first update):
# stop names the step and exits non-zero, keeping the finite checkpoint of step 1; skip goes
# on, leaving weights and optimizer state as they were.
timeout 60 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 4 --lr 1e30 --clip 0 --save-every 1 \
  --ckpt-dir "$tmp/nan_ckpt" >"$tmp/nan.out" 2>"$tmp/nan.err"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "step 2: non-finite loss or gradient norm (loss .*); the update was not applied" "$tmp/nan.err" &&
  [ -d "$tmp/nan_ckpt/step_00000001" ] && [ ! -e "$tmp/nan_ckpt/step_00000002" ] &&
  "$bin" ckpt inspect "$tmp/nan_ckpt" >/dev/null 2>&1
check "non-finite loss stops the run at its step; the last finite checkpoint is kept" $?
timeout 60 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 4 --lr 1e30 --clip 0 \
  --on-nonfinite skip --log-every 1 >"$tmp/skip.out" 2>&1 &&
  [ "$(grep -c "skipped: non-finite loss or gradient norm (loss .*); weights and optimizer state unchanged" "$tmp/skip.out")" -eq 3 ]
check "--on-nonfinite skip skips the non-finite steps and exits 0" $?

# A pinned peak is used as given; an MFU above 100 % is never printed without the warning (for
# a pinned peak: that the pin is too low, not that the measurement was).
timeout 60 "${mpirun[@]}" -np 2 "$bin" "${tiny[@]}" --steps 2 --log-every 1 --gemm-peak 0.001 \
  >"$tmp/pin.out" 2>&1 &&
  grep -q "peak 0.0 GFLOP/s/rank (pinned by --gemm-peak)" "$tmp/pin.out" &&
  grep -q "above 100%: the pinned --gemm-peak is below what this machine reaches" "$tmp/pin.out" &&
  ! grep -E "MFU [0-9]{3,}\.[0-9]% \|" "$tmp/pin.out"
check "--gemm-peak pins the peak; MFU above 100% carries the warning" $?

finish_checks
