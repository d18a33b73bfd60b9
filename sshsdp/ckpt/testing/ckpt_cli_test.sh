#!/usr/bin/env bash
# Checkpoints through the `sshsdp` program, as a user (or a dying cluster) exercises them.
# Every launch is a fresh set of processes; tiny models keep each launch about a second.
#
#   resume  2N steps straight (saving at N) vs a NEW job resuming at N for N more steps:
#           identical losses and grad norms (metrics JSON lines, as text) and identical final
#           weights (safetensors tensor bytes), on W=2 (2,2,2), W=4 (2,2,4), W=4 HSDP (2,2,2),
#           bf16 / fp32 / MXFP8 runtime weights, every gradient reduction mode (fp32,
#           bf16+fp32, bf16sr with its seed restored from the checkpoint), AdamW and Muon,
#           dense and MoE; resuming without layout flags adopts the saved layout.
#           Resharding: the W=4 checkpoint loaded at W=2, 3 and 1 (and W=2 at W=3) gives
#           bit-identical consolidated weights (--steps = the checkpoint's step, then
#           --save-weights, against `sshsdp ckpt export`); training on at W=2 matches the
#           never-resharded run within fp32 tolerance.
#   faults  a rank SIGKILLed at each phase of a save (fault injection): the job ends non-zero
#           without hanging, the previous checkpoint (or the new one, once renamed) passes
#           `sshsdp ckpt inspect`, and resuming from it reproduces the uninterrupted run bit for
#           bit, cleaning the interrupted save's *.tmp.
#   errors  flipped byte, truncated file, missing rank file, newer format version, different
#           model, layout not fitting the world, no checkpoint at all, unusable --ckpt-dir: a
#           clear message naming the file and the problem, non-zero exit, no hang (`timeout`),
#           in both `sshsdp ckpt inspect` and `--resume`; safetensors export / --init-weights
#           round trip; a file of another model refused listing the first mismatches.
#
# Usage: ckpt_cli_test.sh resume|faults|errors SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
section=$1
bin=$2
shift 2
mpirun=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
pass=0
check() {  # check NAME EXIT-CODE-OF-THE-CONDITION
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "ok   $1"; else fails=$((fails + 1)); echo "FAIL $1"; fi
}
# job NP ARGS...: one `sshsdp train` job (fresh processes) on a tiny model (--d-model 32
# --heads 2 --batch-size 2 unless ARGS set them), under a timeout (exit 124: it hung).
job() {
  local np=$1
  shift
  local defaults=()
  for kv in "--d-model 32" "--heads 2" "--batch-size 2"; do
    case " $* " in *" ${kv%% *} "*) ;; *) read -ra more <<<"$kv"; defaults+=("${more[@]}") ;; esac
  done
  timeout 120 "${mpirun[@]}" -np "$np" "$bin" train --layers 1 --seq-len 16 --log-every 1000 \
    "${defaults[@]}" "$@" </dev/null
}
# train NP LOG ARGS...: a job with its output in LOG.
train() {
  local np=$1 log=$2
  shift 2
  job "$np" "$@" >"$log" 2>&1
}
show() { echo "  --- $1:"; tail -n "${2:-15}" "$1" | sed 's/^/  | /'; }
# Tensor bytes of a safetensors file (after the 8-byte length and the JSON header, whose
# metadata may differ); tensors are stored in name order, so equal bytes = equal tensors.
tensor_bytes() { tail -c +$((9 + $(od -An -t u8 -N8 "$1" | tr -d ' '))) "$1"; }
same_weights() { [ -s "$1" ] && [ -s "$2" ] && cmp -s <(tensor_bytes "$1") <(tensor_bytes "$2"); }
# field FILE KEY: one value per metrics line, exactly as printed (full precision).
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }

# resume_case NAME NP "SAVE-ARGS" "RESUME-ARGS": 2N steps saving every N vs resume at N.
N=3
resume_case() {
  local name=$1 np=$2 save_args=$3 resume_args=$4 d=$tmp/$1
  mkdir -p "$d"
  # shellcheck disable=SC2086
  train "$np" "$d/a.log" --steps $((2 * N)) --save-every $N --ckpt-dir "$d/ckpt" \
    --metrics "$d/a.jsonl" --save-weights "$d/a.st" $save_args
  local rc_a=$?
  # shellcheck disable=SC2086
  train "$np" "$d/b.log" --steps $((2 * N)) --resume "$d/ckpt/step_0000000$N" \
    --metrics "$d/b.jsonl" --save-weights "$d/b.st" $resume_args
  local rc_b=$?
  if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
    show "$d/a.log"; show "$d/b.log"
    check "$name: both jobs exit 0" 1
    return
  fi
  grep -q "resumed from .*step_0000000$N at step $N" "$d/b.log"
  check "$name: resumed at step $N" $?
  cmp -s <(field "$d/a.jsonl" loss | tail -n $N) <(field "$d/b.jsonl" loss) &&
    cmp -s <(field "$d/a.jsonl" grad_norm | tail -n $N) <(field "$d/b.jsonl" grad_norm) &&
    [ "$(field "$d/b.jsonl" step | head -1)" = $((N + 1)) ]
  local rc=$?
  [ $rc -ne 0 ] && paste <(field "$d/a.jsonl" loss | tail -n $N) <(field "$d/b.jsonl" loss)
  check "$name: steps $((N + 1))..$((2 * N)) losses and grad norms bit for bit" $rc
  same_weights "$d/a.st" "$d/b.st"
  check "$name: final weights bit for bit" $?
}

# reshard_case NAME NP CKPT-STEP-DIR ARGS...: load at another layout without training.
reshard_case() {
  local name=$1 np=$2 src=$3
  shift 3
  local d=$tmp/$name
  mkdir -p "$d"
  "$bin" ckpt export "$src" "$d/export.st" </dev/null >"$d/export.log" 2>&1 &&
    train "$np" "$d/r.log" --steps $N --resume "$src" --save-weights "$d/r.st" "$@"
  local rc=$?
  [ $rc -ne 0 ] && { show "$d/export.log"; show "$d/r.log"; }
  grep -q "note: resharded from" "$d/r.log" && same_weights "$d/export.st" "$d/r.st"
  rc=$?
  [ $rc -ne 0 ] && show "$d/r.log"
  check "$name: logical weights bit-identical after loading at another layout" $rc
}

if [ "$section" = resume ]; then
  # Features this build has (runtime dtypes and reduction modes land independently).
  help=$("$bin" train --help 2>&1)
  mx="" sr="" bf=""
  grep -q mxfp8 <<<"$help" && mx="--weight-dtype mxfp8"
  grep -q bf16sr <<<"$help" && sr="--reduce bf16sr" bf="--reduce bf16+fp32"
  [ -z "$sr" ] && echo "  note: this build has no --reduce modes; resuming with fp32 reduction only"
  resume_case w2_mx_fp32reduce_adopt 2 "--sw 2 --sg 2 --so 2 --microbatches 2 $mx" \
    "--microbatches 2 $mx"
  grep -q "W=2 nodes=1x2 sw=2 sg=2 so=2" "$tmp/w2_mx_fp32reduce_adopt/b.log"
  check "resume without layout flags adopts the saved layout" $?
  # --ranks-per-node alone (the job moved to other nodes) keeps the saved degrees.
  resume_case w2_ddp_rpn 2 "--sw 1 --sg 1 --so 1 --weight-dtype fp32" \
    "--ranks-per-node 1 --weight-dtype fp32"
  grep -q "W=2 nodes=2x1 sw=1 sg=1 so=1" "$tmp/w2_ddp_rpn/b.log"
  check "resume with only --ranks-per-node keeps the saved sw/sg/so on the new nodes" $?
  resume_case w2_fp32_sr 2 "--sw 2 --sg 2 --so 2 --weight-dtype fp32 $sr ${sr:+--sr-seed 7}" \
    "--sw 2 --sg 2 --so 2 --weight-dtype fp32 $sr"
  if [ -n "$sr" ]; then
    grep -qE "checkpoint's --sr-seed 7|options from the checkpoint: .*--sr-seed=7" "$tmp/w2_fp32_sr/b.log"
    check "bf16sr: the stochastic-rounding seed is restored from the checkpoint" $?
  fi
  resume_case w4_bf16_bf16fp32 4 "--sw 2 --sg 2 --so 4 $bf" "--sw 2 --sg 2 --so 4 $bf"
  resume_case w4_hsdp_fp32 4 "--sw 2 --sg 2 --so 2 --weight-dtype fp32" \
    "--sw 2 --sg 2 --so 2 --weight-dtype fp32"
  resume_case w2_moe_muon 2 "--model moe-tiny --experts 2 --so 2 --optimizer muon" \
    "--model moe-tiny --experts 2 --so 2 --optimizer muon"

  # Resharding (the W=4 (2,2,4) bf16 checkpoint; the W=2 (2,2,2) one to W=3).
  src4=$tmp/w4_bf16_bf16fp32/ckpt/step_0000000$N
  reshard_case reshard_4to2 2 "$src4" --so 2
  reshard_case reshard_4to3 3 "$src4" --sw 3 --sg 3 --so 3
  reshard_case reshard_4to1 1 "$src4" --so 1
  reshard_case reshard_2to3 3 "$tmp/w2_mx_fp32reduce_adopt/ckpt/step_0000000$N" --so 3 \
    --microbatches 2
  # Resuming a copy of a run's checkpoints writes next to the copy: the original directory
  # (its step 2N, its `latest`) is left byte for byte as it was, and nothing there is pruned.
  d=$tmp/resume_copy
  mkdir -p "$d"
  cp -r "$tmp/w4_bf16_bf16fp32/ckpt" "$d/copy"
  orig=$tmp/w4_bf16_bf16fp32/ckpt
  before=$(cd "$orig" && find . -type f | sort | xargs md5sum)
  train 4 "$d/c.log" --steps $((2 * N)) --resume "$d/copy/step_0000000$N" --lr 0.001 \
    --sw 2 --sg 2 --so 4
  rc=$?
  [ $rc -ne 0 ] && show "$d/c.log"
  [ $rc -eq 0 ] && [ "$before" = "$(cd "$orig" && find . -type f | sort | xargs md5sum)" ] &&
    grep -q "saved $d/copy/step_0000000$((2 * N))" "$d/c.log"
  check "resuming a copied checkpoint saves next to the copy; the original is untouched" $?
  # `--resume .` from inside a step directory saves next to it, not into it.
  (cd "$d/copy/step_0000000$N" && train 4 "$d/dot.log" --steps $((2 * N)) --resume . \
    --sw 2 --sg 2 --so 4)
  [ $? -eq 0 ] && grep -q "saved $d/copy/step_0000000$((2 * N))" "$d/dot.log" &&
    [ ! -e "$d/copy/step_0000000$N/latest" ]
  check "--resume . inside a step directory saves beside it" $?
  # Training on after resharding W=4 HSDP -> W=2 (same global batch of 8 samples) matches the
  # run that never stopped within fp32 tolerance (only summation order differs).
  d=$tmp/reshard_continue
  mkdir -p "$d"
  train 2 "$d/c.log" --steps $((2 * N)) --resume "$tmp/w4_hsdp_fp32/ckpt/step_0000000$N" \
    --so 2 --batch-size 4 --weight-dtype fp32 --metrics "$d/c.jsonl"
  rc=$?
  [ $rc -ne 0 ] && show "$d/c.log"
  paste -d' ' <(field "$tmp/w4_hsdp_fp32/a.jsonl" loss | tail -n $N) <(field "$d/c.jsonl" loss) |
    awk 'NF != 2 { bad = 1 } { r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-5) bad = 1;
         printf "  loss %s vs %s (rel %.1e)\n", $1, $2, r } END { exit bad || NR == 0 }'
  check "continued training after W=4 -> W=2 resharding matches within 1e-5 (fp32)" $(( rc != 0 || $? ))
fi

if [ "$section" = faults ]; then
  # The uninterrupted reference: 6 steps.
  train 2 "$tmp/ref.log" --sw 2 --sg 2 --so 2 --steps 6 --metrics "$tmp/ref.jsonl" \
    --save-weights "$tmp/ref.st"
  check "reference run exits 0" $?
  # phase rank expected-latest-step-after-the-kill [extra args]
  while read -r phase rank latest extra; do
    d=$tmp/fault_$phase
    # shellcheck disable=SC2086
    train 2 "$d.log" --sw 2 --sg 2 --so 2 --steps 4 --save-every 2 --ckpt-dir "$d" \
      --ckpt-fault "$rank:$phase:4" $extra
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "killing rank $rank at '$phase'" "$d.log"; then
      echo "  rc=$rc"; show "$d.log"
      check "kill rank $rank at '$phase': job ends non-zero, no hang" 1
      continue
    fi
    check "kill rank $rank at '$phase': job ends non-zero, no hang (rc=$rc)" 0
    timeout 60 "$bin" ckpt inspect "$d" </dev/null >"$d.inspect" 2>&1 &&
      grep -q "^  step $latest " "$d.inspect" && grep -q "checksums: all 2 files verified" "$d.inspect"
    rc=$?
    [ $rc -ne 0 ] && show "$d.inspect"
    check "  after '$phase': latest checkpoint is step $latest and passes ckpt inspect" $rc
  done <<'EOF'
begin 1 2
mid-file 1 2
after-file 0 2
before-manifest 0 2
before-rename 0 2
after-rename 0 4
mid-prune 0 4 --keep 1
EOF
  ls "$tmp/fault_mid-prune" | grep -q "step_00000002$"
  check "  after 'mid-prune': the pruned checkpoint is gone or pending (*.tmp), never half-listed" \
    $(( $? == 0 ))
  # Resume from what the kills left: the same losses and weights as the uninterrupted run, and
  # the interrupted save's temporary directory is cleaned by the next save.
  for phase in mid-file before-rename; do
    d=$tmp/fault_$phase
    ls -d "$d"/*.tmp >/dev/null 2>&1
    check "  after '$phase': an incomplete step_00000004.tmp is left behind" $?
    train 2 "$d.resume.log" --sw 2 --sg 2 --so 2 --steps 6 --resume "$d" --save-every 2 \
      --ckpt-dir "$d" --metrics "$d.jsonl" --save-weights "$d.st"
    rc=$?
    [ $rc -ne 0 ] && show "$d.resume.log"
    grep -q "resumed from .*step_00000002 at step 2" "$d.resume.log" &&
      cmp -s <(field "$tmp/ref.jsonl" loss | tail -n 4) <(field "$d.jsonl" loss) &&
      same_weights "$tmp/ref.st" "$d.st"
    check "  resume after '$phase' reproduces the uninterrupted run bit for bit" $(( rc != 0 || $? ))
    ! ls -d "$d"/*.tmp >/dev/null 2>&1 && [ -f "$d/step_00000006/manifest.json" ]
    check "  the next save removed the leftover *.tmp" $?
  done
fi

if [ "$section" = errors ]; then
  good=$tmp/good
  train 2 "$tmp/good.log" --sw 2 --sg 2 --so 2 --steps 2 --save-every 2 --ckpt-dir "$good" \
    --save-weights "$tmp/good.st"
  check "base run saves a checkpoint" $?
  step=$good/step_00000002
  # expect_error NAME NEEDLE... -- CMD...: non-zero within the timeout, every NEEDLE in stderr.
  expect_error() {
    local name=$1 needles=()
    shift
    while [ "$1" != "--" ]; do needles+=("$1"); shift; done
    shift
    "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
    local rc=$? ok=0
    [ $rc -eq 0 ] || [ $rc -eq 124 ] && ok=1
    for n in "${needles[@]}"; do grep -qF -- "$n" "$tmp/err" || ok=1; done
    if [ $ok -ne 0 ]; then
      echo "  rc=$rc; wanted: ${needles[*]}"; sed 's/^/  | /' "$tmp/err" | head -20
    fi
    check "$name" $ok
  }
  corrupt() {  # corrupt NAME: a copy of the good checkpoint
    rm -rf "$tmp/$1"; mkdir -p "$tmp/$1"; cp -r "$step" "$tmp/$1/"; echo "$tmp/$1/step_00000002"
  }
  resume=(job 2 --sw 2 --sg 2 --so 2 --steps 4 --resume)
  inspect=(timeout 60 "$bin" ckpt inspect)

  c=$(corrupt flip)
  printf '\x5a' | dd of="$c/rank_00001.safetensors" bs=1 seek=3000 conv=notrunc status=none
  expect_error "flipped byte: ckpt inspect names the file" "rank_00001.safetensors" "checksum mismatch" \
    -- "${inspect[@]}" "$c"
  expect_error "flipped byte: --resume fails on every rank, naming the file" \
    "rank_00001.safetensors" "checksum mismatch" -- "${resume[@]}" "$c"
  c=$(corrupt trunc)
  truncate -s -100 "$c/rank_00000.safetensors"
  expect_error "truncated file: ckpt inspect" "rank_00000.safetensors" "truncated" \
    -- "${inspect[@]}" "$c"
  expect_error "truncated file: --resume" "rank_00000.safetensors" "truncated" \
    -- "${resume[@]}" "$c"
  c=$(corrupt missing)
  rm "$c/rank_00001.safetensors"
  expect_error "missing rank file: ckpt inspect" "rank_00001.safetensors" "missing" \
    -- "${inspect[@]}" "$c"
  expect_error "missing rank file: --resume" "rank_00001.safetensors" "missing" \
    -- "${resume[@]}" "$c"
  c=$(corrupt newer)
  sed -i 's/"format_version": [0-9]*/"format_version": 99/' "$c/manifest.json"
  expect_error "newer format version: ckpt inspect" "manifest.json" "format version 99 is newer" \
    -- "${inspect[@]}" "$c"
  expect_error "newer format version: --resume" "manifest.json" "format version 99 is newer" \
    -- "${resume[@]}" "$c"
  expect_error "different model config is named (before any collective)" "manifest.json" \
    "d_model 32 (checkpoint) vs 64 (this run)" "use the model options" \
    -- job 2 --d-model 64 --steps 4 --resume "$good"
  expect_error "a dense checkpoint for an MoE run is named as such" "manifest.json" \
    "the checkpoint holds a dense GPT model, this run is an MoE one" \
    -- job 2 --model moe-tiny --steps 4 --resume "$good"
  expect_error "saved layout not fitting the world size is refused" \
    "layout W=2 nodes=1x2 sw=2 sg=2 so=2 does not fit 3 ranks" \
    -- job 3 --steps 4 --resume "$good"
  # An output never replaces a file of a checkpoint tree it reads or writes (resolved paths).
  expect_error "ckpt export into its own checkpoint is refused" "checkpoint tree" \
    -- timeout 60 "$bin" ckpt export "$good" "$step/rank_00000.safetensors"
  "${inspect[@]}" "$good" >/dev/null 2>&1
  check "  ... and the checkpoint still verifies" $?
  ln -sfn "$good" "$tmp/good_link"
  expect_error "--save-weights onto --ckpt-dir's latest record (through a symlink) is refused" \
    "checkpoint tree" -- job 2 --steps 2 --ckpt-dir "$good" \
    --save-weights "$tmp/good_link/latest"
  expect_error "--metrics into a --resume step directory (through ..) is refused" \
    "--metrics" "checkpoint tree" \
    -- "${resume[@]}" "$step" --metrics "$step/../step_00000002/rank_00001.safetensors"
  "${inspect[@]}" "$good" >/dev/null 2>&1
  check "  ... and the checkpoint still verifies after both" $?
  # ... nor of another checkpoint: a step directory (its manifest) or a root (`latest`).
  cp -r "$good" "$tmp/other"
  other_step=$(ls -d "$tmp/other"/step_* | head -1)
  expect_error "ckpt export onto another checkpoint's rank file is refused" \
    "which holds a checkpoint's manifest.json" \
    -- timeout 60 "$bin" ckpt export "$good" "$other_step/rank_00000.safetensors"
  expect_error "--save-weights onto another checkpoint root's latest is refused" \
    "which holds a checkpoint root's \`latest\` record" \
    -- job 2 --steps 2 --save-weights "$tmp/other/latest"
  "${inspect[@]}" "$tmp/other" >/dev/null 2>&1
  check "  ... and that checkpoint still verifies" $?
  mkdir -p "$tmp/outdir"
  expect_error "ckpt export onto a directory is refused before writing" "is a directory" \
    -- timeout 60 "$bin" ckpt export "$good" "$tmp/outdir"
  [ ! -e "$tmp/outdir.tmp" ]
  check "  ... and leaves no .tmp behind" $?
  touch "$tmp/afile"
  expect_error "an unusable --ckpt-dir fails at startup, named" \
    "afile/ckpt: cannot create the checkpoint directory" \
    -- job 2 --steps 2 --save-every 1 --ckpt-dir "$tmp/afile/ckpt"
  mkdir -p "$tmp/empty/step_00000009.tmp"
  expect_error "no complete checkpoint: incomplete saves ignored, named" "no complete checkpoint" \
    "1 incomplete save(s)" -- "${resume[@]}" "$tmp/empty"
  expect_error "ckpt inspect of a non-checkpoint" "no complete checkpoint" \
    -- "${inspect[@]}" "$tmp/empty"

  # safetensors: export = --save-weights (same names, same bits); export -> --init-weights
  # -> --save-weights round-trips; another model's file is refused listing mismatches.
  "$bin" ckpt export "$good" "$tmp/export.st" >/dev/null 2>&1 && same_weights "$tmp/good.st" "$tmp/export.st"
  check "ckpt export equals --save-weights bit for bit (stable update-parameter names)" $?
  train 2 "$tmp/init.log" --steps 0 --init-weights "$tmp/export.st" --save-weights "$tmp/back.st" &&
    same_weights "$tmp/export.st" "$tmp/back.st"
  check "safetensors round trip: export -> --init-weights -> --save-weights" $?
  expect_error "a different model's safetensors file is refused, listing mismatches" \
    "export.st: does not match this model" "'wte' has shape [256, 32] in the file, the model needs [256, 48]" \
    -- job 2 --d-model 48 --steps 1 --init-weights "$tmp/export.st"
fi

echo "$section: $pass passed, $fails failed"
[ "$fails" -eq 0 ] && [ "$pass" -gt 0 ]
