#!/usr/bin/env bash
# Text in, text out, as a user runs it, from the shipped small tokenizer and corpus
# (sshsdp/text/testdata, made by scripts/make_tokenizer_golden.py):
#   * `sshsdp tokenize` turns the corpus into a train and a validation token file (llm.c
#     uint16 format, documents separated by <|endoftext|>) and prints its summary; the same ids
#     on 1 and on 2 threads;
#   * `mpirun -np 2 sshsdp train` trains on them with validation and saves a checkpoint;
#   * `sshsdp generate --tokenizer --prompt TEXT` prints the prompt and generated text;
#   * bad input — invalid UTF-8, a JSONL line without the key, a directory, an output that is
#     an input, an unsupported tokenizer.json — is refused naming the file (and line), and no
#     output or temporary file is left behind.
# Usage: tokenize_test.sh SSHSDP TESTDATA MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
data=$2
shift 2
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

tok=(--tokenizer "$data/gpt2_style.json")
"$bin" tokenize "${tok[@]}" --input "$data/corpus.txt" --out "$tmp/train.bin" \
  --val-out "$tmp/val.bin" --val-fraction 0.1 >"$tmp/summary" 2>"$tmp/progress"
rc=$?
grep -q "[0-9]* documents ([1-9][0-9]* to validation)" "$tmp/summary" && grep -q "bytes per token" \
  "$tmp/summary" && grep -q "MB/s" "$tmp/progress" || rc=1
python3 - "$tmp/train.bin" "$tmp/val.bin" <<'PY' || rc=1
import struct, sys
for path in sys.argv[1:]:
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1) and len(raw) == 1024 + 2 * n, (path, magic, n)
    toks = struct.unpack(f"<{n}H", raw[1024:])
    assert toks[-1] == 0 and max(toks) < 800, (path, toks[-5:])  # <|endoftext|> is id 0
PY
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/summary" "$tmp/progress" | tail -5
check "tokenize: the corpus into train and validation llm.c files, with a summary" $rc
"$bin" tokenize "${tok[@]}" --input "$data/corpus.txt" --out "$tmp/one.bin" --val-out \
  "$tmp/one_val.bin" --val-fraction 0.1 --threads 1 >/dev/null 2>&1 &&
  cmp -s "$tmp/one.bin" "$tmp/train.bin" && cmp -s "$tmp/one_val.bin" "$tmp/val.bin"
check "tokenize: the same files on 1 thread as on all" $?

timeout 300 "${mpirun[@]}" -np 2 "$bin" train --model tiny --layers 1 --d-model 32 --heads 2 \
  --seq-len 32 --data "$tmp/train.bin" --val-data "$tmp/val.bin" --vocab-size 800 --steps 6 \
  --eval-every 3 --eval-tokens 256 --log-every 3 --gemm-peak 10 --ckpt-dir "$tmp/ck" \
  >"$tmp/train.out" 2>&1
rc=$?
grep -q "val " "$tmp/train.out" || rc=1
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/train.out" | tail -8
check "train on the tokenized files with validation (2 ranks)" $rc
"$bin" generate --ckpt "$tmp/ck" "${tok[@]}" --prompt "The quick brown" --tokens 12 \
  --temperature 0 >"$tmp/gen" 2>"$tmp/gen.err"
rc=$?
head -c 15 "$tmp/gen" | grep -q "^The quick brown" && [ "$(wc -c <"$tmp/gen")" -gt 16 ] || rc=1
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/gen" "$tmp/gen.err" | tail -5
check "generate --tokenizer --prompt TEXT prints the prompt and generated text" $rc

printf 'good text\n\nbad \xff byte\n' >"$tmp/bad.txt"
expect_error "invalid UTF-8 is refused naming the file and line" "bad.txt:3: invalid UTF-8" \
  "$bin" tokenize "${tok[@]}" --input "$tmp/bad.txt" --out "$tmp/x.bin"
printf '{"text": "a"}\n{"body": "b"}\n' >"$tmp/d.jsonl"
expect_error "a JSONL line without the key is refused naming file and line" \
  "d.jsonl:2: no string 'text'" "$bin" tokenize "${tok[@]}" --input "$tmp/d.jsonl" --out "$tmp/x.bin"
expect_error "a directory as input is refused" "not a readable regular file (a directory" \
  "$bin" tokenize "${tok[@]}" --input "$tmp" --out "$tmp/x.bin"
cp "$data/corpus.txt" "$tmp/c.txt"
expect_error "an output that is an input is refused" \
  "--out $tmp/c.txt is the file --input $tmp/c.txt reads" \
  "$bin" tokenize "${tok[@]}" --input "$tmp/c.txt" --out "$tmp/c.txt"
cp "$data/gpt2_style.json" "$tmp/t.json"
expect_error "an output that is the tokenizer is refused" "is the file --tokenizer" \
  "$bin" tokenize --tokenizer "$tmp/t.json" --input "$tmp/c.txt" --out "$tmp/t.json"
mkdir -p "$tmp/hfdir" && cp "$data/gpt2_style.json" "$tmp/hfdir/tokenizer.json"
expect_error "an output inside the tokenizer's model directory is refused" \
  "lies inside --tokenizer $tmp/hfdir" \
  "$bin" tokenize --tokenizer "$tmp/hfdir" --input "$tmp/c.txt" --out "$tmp/hfdir/x.bin"
"$bin" tokenize --tokenizer "$tmp/hfdir" --input "$tmp/c.txt" --out "$tmp/d.bin" >/dev/null &&
  "$bin" tokenize --tokenizer "$tmp/t.json" --input "$tmp/c.txt" --out "$tmp/f.bin" >/dev/null &&
  cmp -s "$tmp/d.bin" "$tmp/f.bin"
check "--tokenizer takes a model directory holding tokenizer.json" $?
cmp -s "$tmp/t.json" "$data/gpt2_style.json"
check "the tokenizer named as output is untouched" $?
expect_error "--threads beyond 1024 is refused" "--threads" \
  "$bin" tokenize --tokenizer "$tmp/t.json" --input "$tmp/c.txt" --out "$tmp/x.bin" --threads 100000
python3 -c "
import json,sys; t=json.load(open(sys.argv[1])); t['model']['type']='WordPiece'
json.dump(t, open(sys.argv[2],'w'))" "$data/gpt2_style.json" "$tmp/wp.json"
expect_error "a WordPiece tokenizer.json is refused naming what is unsupported" \
  "model 'WordPiece' is not supported" \
  "$bin" tokenize --tokenizer "$tmp/wp.json" --input "$tmp/c.txt" --out "$tmp/x.bin"
printf 'one short document\n' >"$tmp/one.txt"
expect_error "a validation split that leaves a file empty is refused, writing nothing" \
  "sent 0 of the 1 documents to validation" "$bin" tokenize "${tok[@]}" --input "$tmp/one.txt" \
  --out "$tmp/x.bin" --val-out "$tmp/x_val.bin" --val-fraction 0.01
expect_error "--out and --val-out naming one file by two spellings are refused" \
  "name the same file" "$bin" tokenize "${tok[@]}" --input "$tmp/c.txt" --out "$tmp/x.bin" \
  --val-out "$tmp/./x.bin" --val-fraction 0.5
expect_error "a bad file after a good one is refused once its tokens were streamed" \
  "bad.txt:3: invalid UTF-8" "$bin" tokenize "${tok[@]}" --input "$tmp/c.txt" "$tmp/bad.txt" \
  --out "$tmp/x.bin"
! ls "$tmp"/x.bin* "$tmp"/x_val.bin* >/dev/null 2>&1
check "no output or temporary file is left by a refused run" $?
cmp -s "$tmp/c.txt" "$data/corpus.txt"
check "the input named as output is untouched" $?

finish_checks
