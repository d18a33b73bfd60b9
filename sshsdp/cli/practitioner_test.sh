#!/usr/bin/env bash
# A training run as a nanoGPT / llm.c user starts it (issue 16), end to end on 2 ranks:
#   * `small` on a GPT-2-tokenized llm.c file (vocabulary 50,257 from the data, tables padded
#     to 50,304) with a validation file every 10 steps and a cosine schedule, from a --config
#     file; the loss falls, the validation loss is on the progress line and in the metrics,
#     the schedule ends at --lr-min;
#   * the run crashes after its step-20 checkpoint; `--resume DIR` alone continues it, and
#     steps 21..30 (losses, validation, learning rates) equal an uninterrupted run bit for bit;
#   * scripts/plot_metrics.py turns the metrics into a PNG;
#   * greedy `generate` from the checkpoint equals greedy `generate` from --save-weights;
#   * a resume with another --data, a finished run, torchrun / srun singletons, a text prompt
#     for a non-byte model, an unknown --config key and outputs naming an input file (or one
#     another) are refused or reported by name;
#   * the data position is kept in samples across a batch-size change;
#   * the default layout is fully sharded.
# Usage: practitioner_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=testing/check.sh
. "$here/testing/check.sh"
plot=$here/../../scripts/plot_metrics.py

python3 "$here/testing/make_gpt2_tokens.py" "$tmp"  # train.bin, val.bin (GPT-2 ids)
cat >"$tmp/run.toml" <<TOML
model = "small"
seq-len = 64
batch-size = 2
steps = 30
warmup = 3
lr = 0.003
lr-schedule = "cosine"
lr-min = 0.0003
data = "$tmp/train.bin"
val-data = "$tmp/val.bin"
eval-every = 10
eval-tokens = 512
log-every = 5
gemm-peak = 20
TOML
run() { timeout 300 "${mpirun[@]}" -np 2 "$bin" train "$@"; }

run --config "$tmp/run.toml" --metrics "$tmp/m.jsonl" --ckpt-dir "$tmp/ck" --save-every 10 \
  --save-weights "$tmp/w.safetensors" --fault 0:21 >"$tmp/a.out" 2>&1
grep -q "injected failure on rank 0 in step 21" "$tmp/a.out"
check "the first run fails in step 21 (after its step-20 checkpoint)" $?
grep -q "V=50257 (tables padded to 50304)" "$tmp/a.out"
check "the vocabulary comes from the data and the tables are padded" $?
grep -q "sw=2 sg=2 so=2 (fully sharded: no --sw/--sg/--so given)" "$tmp/a.out"
check "the default layout is fully sharded" $?
grep -q "| val [0-9.]* (" "$tmp/a.out"; check "the progress line carries the validation loss" $?

run --resume "$tmp/ck" >"$tmp/b.out" 2>&1
check "--resume alone continues the run" $?
grep -q "resumed from .*step_00000020 at step 20" "$tmp/b.out" &&
  grep -q "options from the checkpoint: .*--lr-schedule=cosine" "$tmp/b.out"
check "the resume names the options it took from the checkpoint" $?
run --config "$tmp/run.toml" --metrics "$tmp/ref.jsonl" --save-weights "$tmp/ref.safetensors" \
  >"$tmp/ref.out" 2>&1
check "the uninterrupted reference run exits 0" $?
python3 - "$tmp/m.jsonl" "$tmp/ref.jsonl" <<'PY'
import json, math, sys
def load(p):
    rows = {}
    for line in open(p):
        r = json.loads(line)
        rows[r["step"]] = r
    return rows
got, ref = load(sys.argv[1]), load(sys.argv[2])
assert sorted(got) == list(range(1, 31)), sorted(got)
for s in range(1, 31):
    for k in ("loss", "grad_norm", "lr"):
        assert got[s][k] == ref[s][k], (s, k, got[s][k], ref[s][k])
    assert ("val_loss" in got[s]) == (s % 10 == 0), s
    if s % 10 == 0:
        assert got[s]["val_loss"] == ref[s]["val_loss"], s
assert ref[1]["loss"] > 10.0, ref[1]["loss"]  # ln 50257 = 10.8 at the start
assert ref[30]["loss"] < ref[1]["loss"] - 2.0, (ref[1]["loss"], ref[30]["loss"])
assert ref[30]["val_loss"] < ref[10]["val_loss"], (ref[10]["val_loss"], ref[30]["val_loss"])
assert abs(ref[1]["lr"] - 0.001) < 1e-9, ref[1]["lr"]  # warm-up: (0 + 1) / 3 of the peak
assert abs(ref[4]["lr"] - 0.003) < 1e-9, ref[4]["lr"]  # first step after warm-up: the peak
assert abs(ref[30]["lr"] - 0.0003) < 1e-9, ref[30]["lr"]  # cosine ends at --lr-min
assert ref[15]["lr"] < ref[5]["lr"], (ref[5]["lr"], ref[15]["lr"])
print(f"  loss {ref[1]['loss']:.3f} -> {ref[30]['loss']:.3f}, val {ref[10]['val_loss']:.3f} -> "
      f"{ref[30]['val_loss']:.3f}, lr {ref[4]['lr']:.2e} -> {ref[30]['lr']:.2e}")
PY
check "crash + --resume equals the uninterrupted run (losses, validation, schedule)" $?

"$plot" "$tmp/m.jsonl" "$tmp/m.png" >/dev/null && [ "$(head -c 4 "$tmp/m.png" | od -An -c | tr -d ' ')" = "211PNG" ]
check "plot_metrics.py writes a PNG of the run" $?

g1=$("$bin" generate --ckpt "$tmp/ck" --prompt-tokens 50256 --tokens 12 --temperature 0 2>/dev/null)
g2=$("$bin" generate --weights "$tmp/w.safetensors" --prompt-tokens 50256 --tokens 12 \
  --temperature 0 2>/dev/null)
echo "  generated: $g1"
[ -n "$g1" ] && [ "$g1" = "$g2" ] && [ "$(tr ',' '\n' <<<"$g1" | wc -l)" -eq 13 ]
check "greedy generate from the checkpoint equals generate from the weights file" $?
expect_error "a text prompt for a GPT-2 vocabulary is refused" "give --prompt-tokens" \
  "$bin" generate --weights "$tmp/w.safetensors" --prompt "hello"

expect_error "resuming on other data is refused" "the checkpoint trained on --data $tmp/train.bin" \
  "${mpirun[@]}" -np 2 "$bin" train --resume "$tmp/ck" --data "$tmp/val.bin"
out=$(run --resume "$tmp/ck" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "nothing to train (pass a larger --steps" <<<"$out"
check "resuming a finished run says there is nothing to train" $?

tiny=(--model tiny --layers 1 --d-model 32 --heads 2 --seq-len 16 --batch-size 2)
expect_error "torchrun singletons are refused with the mpirun command" "mpirun -np 2 sshsdp train" \
  env TORCHELASTIC_RUN_ID=t LOCAL_RANK=0 RANK=0 WORLD_SIZE=2 "$bin" train "${tiny[@]}" --steps 1
expect_error "srun without PMIx is refused" "srun --mpi=pmix -n 2" \
  env SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=0 "$bin" train "${tiny[@]}" --steps 1
expect_error "--eval-every on a token file needs --val-data" "--eval-every 5 needs --val-data FILE" \
  "$bin" train "${tiny[@]}" --data "$tmp/train.bin" --eval-every 5 --steps 1
expect_error "--val-data without --eval-every is named" "is read only with --eval-every N" \
  "$bin" train "${tiny[@]}" --val-data "$tmp/val.bin" --steps 1
expect_error "a validation token beyond the training vocabulary is refused" "pass --vocab-size" \
  "$bin" train "${tiny[@]}" --eval-every 1 --val-data "$tmp/train.bin" --steps 1
# An output naming an input file would overwrite it under the running job (--metrics on the
# token file truncated it and the run died of SIGBUS): refused at start-up, the file intact.
sum_before=$(md5sum <"$tmp/train.bin")
expect_error "--metrics naming the --data file is refused" \
  "--metrics $tmp/./train.bin is the file --data $tmp/train.bin reads" \
  "$bin" train "${tiny[@]}" --data "$tmp/train.bin" --metrics "$tmp/./train.bin" --steps 1
[ "$sum_before" = "$(md5sum <"$tmp/train.bin")" ]
check "the token file is untouched" $?
"$bin" train "${tiny[@]}" --steps 1 --save-weights "$tmp/w.st" --gemm-peak 10 >/dev/null 2>&1 &&
  "$bin" train "${tiny[@]}" --steps 1 --init-weights "$tmp/w.st" --save-weights "$tmp/w.st" \
    --gemm-peak 10 >/dev/null 2>&1 && [ -s "$tmp/w.st" ] && [ ! -e "$tmp/w.st.tmp" ]
check "--save-weights may replace its own --init-weights file" $?
expect_error "--save-weights and --metrics naming one file is refused" "name the same file" \
  "$bin" train "${tiny[@]}" --save-weights "$tmp/out.x" --metrics "$tmp/out.x" --steps 1
# --eval-tokens beyond the validation file validates on one pass over it (it repeated the
# file's samples: 16 s per evaluation at 200 passes), and says so.
out=$("$bin" train "${tiny[@]}" --data "$tmp/train.bin" --val-data "$tmp/val.bin" --eval-every 2 \
  --eval-tokens 100000000 --steps 2 --gemm-peak 10 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "note: --eval-tokens 100000000 exceeds --val-data's .* tokens: validating on" <<<"$out" &&
  grep -q "val [0-9]" <<<"$out"
check "--eval-tokens beyond the validation file: one pass over it, noted" $?
# Options set but unused by this run are named, not silently dropped.
out=$("$bin" train "${tiny[@]}" --steps 1 --muon-lr 5 --decay-steps 3 --keep 1 --gemm-peak 10 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -q "note: --muon-lr ignored: --optimizer is adamw" <<<"$out" &&
  grep -q "note: --decay-steps ignored: --lr-schedule is constant" <<<"$out" &&
  grep -q "note: --keep ignored: no --ckpt-dir" <<<"$out"
check "options the run does not use are named" $?
expect_error "an unknown schedule is refused" "--lr-schedule must be constant, cosine or wsd" \
  "$bin" train "${tiny[@]}" --lr-schedule linear --steps 1
expect_error "--lr-min above --lr is refused" "--lr-min 0.5 exceeds --lr 0.003" \
  "$bin" train "${tiny[@]}" --lr-schedule cosine --lr-min 0.5 --steps 1
expect_error "wsd decay longer than the run is refused" "exceed --steps 4" \
  "$bin" train "${tiny[@]}" --lr-schedule wsd --decay-steps 9 --steps 4
printf 'stepz = 3\n' >"$tmp/bad.toml"
expect_error "an unknown --config key is named" "'stepz' is not an option of sshsdp train" \
  "$bin" train --config "$tmp/bad.toml" --steps 1
# A config file is read strictly: a key set twice (top level and [train] alike), an array for
# a one-value option, command-line-only keys, and a value that does not convert (named with
# the file) are refused; CLI11 alone kept the last value or ignored them.
printf 'steps = 2\n[train]\nsteps = 3\n' >"$tmp/twice.toml"
expect_error "a config key set twice is refused" "'steps' is set twice" \
  "$bin" train --config "$tmp/twice.toml"
printf 'steps = [2, 3]\n' >"$tmp/array.toml"
expect_error "an array for a one-value option is refused" "'steps' takes one value, got 2" \
  "$bin" train --config "$tmp/array.toml"
printf 'config = "other.toml"\n' >"$tmp/nested.toml"
expect_error "--config inside a config file is refused" "'config' cannot be set in a config file" \
  "$bin" train --config "$tmp/nested.toml"
printf 'steps = 2.5\n' >"$tmp/conv.toml"
expect_error "a value that does not convert names the file" "in --config $tmp/conv.toml" \
  "$bin" train --config "$tmp/conv.toml"
"$bin" train "${tiny[@]}" --lr-schedule wsd --steps 9 --dump-config >"$tmp/dump.toml" &&
  "$bin" train --config "$tmp/dump.toml" --dump-config | cmp -s - "$tmp/dump.toml" &&
  grep -q 'lr-schedule="wsd"' "$tmp/dump.toml"
check "--dump-config writes a file --config reads back to the same options" $?

# The data position is in samples: 2 steps of 2 ranks x 2 samples = 8, then batch 1: +2 per step.
run "${tiny[@]}" --steps 2 --ckpt-dir "$tmp/pos" --save-every 2 >/dev/null 2>&1 &&
  run --resume "$tmp/pos" --batch-size 1 --steps 4 >"$tmp/pos.out" 2>&1
python3 - "$tmp/pos/step_00000004/manifest.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["scalars"]
assert s["data_samples"] == 12 and s["data_position"] == 4, s
PY
check "a resume at another batch size continues at the saved sample (8 + 2 x 2 = 12)" $?
finish_checks practitioner
