#!/usr/bin/env bash
# Hugging Face models end to end through the `sshsdp` program (hf/, models/llama.h), on the
# tiny transformers models of sshsdp/hf/testdata:
#   hf_test.sh SSHSDP MPIRUN...        fine-tune from --init-from-hf on 4 ranks with per-head
#                                      Muon, checkpoint, export-hf; import -> export with no step
#                                      is bit-identical; bad inputs refused by name.
#   hf_test.sh --peer SSHSDP MPIRUN... for a tied Qwen3 and a Qwen3-MoE: transformers loads the
#                                      exported model with no missing or unexpected key and
#                                      computes the validation loss sshsdp reported on the same
#                                      tokens (within 1e-6 relative).
#                                      Skipped (77) without torch in the peers' environment.
set -u
peer=0
if [ "${1:-}" = "--peer" ]; then
  peer=1
  shift
fi
bin=$1
shift
mpirun=("$@")
root=$(cd "$(dirname "$0")/../.." && pwd)
data=$root/sshsdp/hf/testdata
venv=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
if [ $peer -eq 1 ] && ! "$venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
  echo "skipped: no torch and transformers in $venv (bench/peers/run_fsdp2_peer.sh makes it)"
  exit 77
fi
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

# llm.c token files (uint16) of the vocabulary-97 model: a learnable training stream and a
# validation file of exactly one 32-token window.
python3 - "$tmp" <<'PY'
import array, random, struct, sys
def write(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(array.array("H", toks).tobytes())
random.seed(1)
seq = []
while len(seq) < 4096:
    s = random.randrange(97)
    seq += [(s + 7 * i) % 97 for i in range(8)]
write(sys.argv[1] + "/train.bin", seq[:4096])
write(sys.argv[1] + "/train61.bin", [t % 61 for t in seq[:4096]])
write(sys.argv[1] + "/val.bin", [(5 + 7 * i) % 97 for i in range(33)])
write(sys.argv[1] + "/val61.bin", [(5 + 7 * i) % 61 for i in range(33)])
write(sys.argv[1] + "/big.bin", [3, 200, 5] * 100)
PY
run=(--data "$tmp/train.bin" --seq-len 32 --batch-size 1 --weight-dtype fp32)

# peer_check MODEL SUFFIX: fine-tune MODEL on 2 ranks with Muon, export it, and have transformers
# load it and compute the validation loss sshsdp reported on the same 32 tokens.
peer_check() {
  local m=$1 v=$2
  timeout 180 "${mpirun[@]}" -np 2 "$bin" train --init-from-hf "$data/$m" --seq-len 32 \
    --batch-size 1 --weight-dtype fp32 --data "$tmp/train$v.bin" --val-data "$tmp/val$v.bin" \
    --eval-every 10 --eval-tokens 32 --steps 10 --optimizer muon \
    --save-weights "$tmp/$m.safetensors" --metrics "$tmp/$m.jsonl" >"$tmp/out" 2>&1
  rc=$?
  [ $rc -eq 0 ] || tail -20 "$tmp/out"
  check "$m: fine-tunes from --init-from-hf on 2 ranks with Muon" $rc
  "$bin" export-hf --weights "$tmp/$m.safetensors" --out "$tmp/hf_$m" >/dev/null
  check "$m: export-hf writes the fine-tuned model" $?
  "$venv/bin/python" - "$tmp" "$m" "$v" <<'PY'
import array, json, sys
import torch, transformers
tmp, m, v = sys.argv[1:4]
model, info = transformers.AutoModelForCausalLM.from_pretrained(f"{tmp}/hf_{m}",
                                                                output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
t = array.array("H")
t.frombytes(open(f"{tmp}/val{v}.bin", "rb").read()[1024:])
x, y = torch.tensor([list(t[:32])]), torch.tensor(list(t[1:33]))
with torch.no_grad():
    hf = torch.nn.functional.cross_entropy(model.float().eval()(input_ids=x).logits[0], y).item()
ours = [json.loads(l)["val_loss"] for l in open(f"{tmp}/{m}.jsonl") if "val_loss" in l][-1]
print(f"  {m}: validation loss sshsdp {ours!r}, transformers {hf!r}")
assert abs(ours - hf) <= 1e-6 * hf, (ours, hf)
PY
  check "$m: transformers loads the export (no missing / unexpected keys) with sshsdp's val loss" $?
}

if [ $peer -eq 1 ]; then
  peer_check qwen3_tied ""
  peer_check qwen3_moe 61
  finish_checks
  exit $?
fi

# Fine-tune on 4 ranks (2 x 2: sharded and replicated) with per-head Muon, checkpointing; the
# peer part below fine-tunes the tied model.
timeout 180 "${mpirun[@]}" -np 4 "$bin" train --init-from-hf "$data/qwen3_gqa" "${run[@]}" \
  --steps 6 --optimizer muon --sg 2 --so 2 --ckpt-dir "$tmp/ck" --save-every 3 >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -20 "$tmp/out"
check "mpirun -np 4 train --init-from-hf fine-tunes with per-head Muon" $rc
grep -q "Qwen3 \[4 Q / 2 KV heads of 16, QK-norm" "$tmp/out"
check "the header names the architecture from config.json" $?
"$bin" export-hf --ckpt "$tmp/ck" --out "$tmp/exp" >/dev/null && [ -f "$tmp/exp/config.json" ]
check "export-hf --ckpt writes config.json and safetensors" $?
timeout 180 "${mpirun[@]}" -np 4 "$bin" train --init-from-hf "$data/qwen3_moe" --seq-len 32 \
  --batch-size 1 --data "$tmp/train61.bin" --steps 4 --optimizer muon --sg 2 --so 2 \
  >"$tmp/out" 2>&1 && grep -q "Qwen3-MoE \[2 Q / 1 KV heads of 16.*2 of 3 blocks MoE: E=4" "$tmp/out"
check "mpirun -np 4 fine-tunes a Qwen3-MoE (a dense block among MoE blocks) with per-expert Muon" $?

# Import -> export with no step: the same bytes for every tensor (untied, and tied: one table).
for m in llama_mqa qwen3_tied qwen3_moe; do
  "$bin" train --init-from-hf "$data/$m" --seq-len 32 --weight-dtype fp32 --steps 0 \
    --save-weights "$tmp/$m.safetensors" >/dev/null 2>&1 &&
    "$bin" export-hf --weights "$tmp/$m.safetensors" --out "$tmp/rt_$m" >/dev/null
  check "$m: import then export with no step runs" $?
  python3 - "$data/$m/model.safetensors" "$tmp/rt_$m/model.safetensors" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a), "tensors differ"
PY
  check "$m: import -> export with no step is bit-identical" $?
done

# A Hugging Face directory with a tokenizer.json: the run remembers it, and generate --ckpt
# encodes the prompt and prints text with nothing else (a vocabulary-800 Qwen3 exported, then
# started from, with the tokenizer of the README's example).
"$bin" train --model qwen3-tiny --vocab-size 800 --seq-len 32 --steps 1 \
  --save-weights "$tmp/q800.safetensors" >/dev/null 2>&1 &&
  "$bin" export-hf --weights "$tmp/q800.safetensors" --out "$tmp/q800" >/dev/null &&
  cp "$root/sshsdp/text/testdata/gpt2_style.json" "$tmp/q800/tokenizer.json" &&
  "$bin" train --init-from-hf "$tmp/q800" --seq-len 32 --steps 2 --ckpt-dir "$tmp/ck800" \
    >/dev/null 2>&1 &&
  "$bin" generate --ckpt "$tmp/ck800" --prompt "The quick" --tokens 8 >"$tmp/gen" 2>&1 &&
  grep -q "^The quick" "$tmp/gen"
rc=$?
[ $rc -eq 0 ] || cat "$tmp/gen"
check "a checkpoint from --init-from-hf remembers the directory's tokenizer for generate" $rc

# A resume needs nothing of the Hugging Face directory it started from: moved away, the
# checkpoint's own description of the model builds it.
cp -r "$data/qwen3_gqa" "$tmp/moved" &&
  "$bin" train --init-from-hf "$tmp/moved" --seq-len 32 --steps 2 --ckpt-dir "$tmp/ckm" \
    >/dev/null 2>&1 && rm -rf "$tmp/moved" &&
  "$bin" train --resume "$tmp/ckm" --steps 4 >"$tmp/out" 2>&1 && grep -q "step     4/4" "$tmp/out"
rc=$?
[ $rc -eq 0 ] || tail -5 "$tmp/out"
check "a resume runs after its --init-from-hf directory is gone" $rc

expect_error "a token outside the config's vocabulary" "big.bin" \
  "$bin" train --init-from-hf "$data/qwen3_gqa" --data "$tmp/big.bin" --seq-len 32 --steps 1
expect_error "--layers with a config.json" "fixes the architecture" \
  "$bin" train --model-config "$data/qwen3_gqa/config.json" --layers 3 --steps 1
expect_error "--model with a config.json" "both name the architecture" \
  "$bin" train --model small --model-config "$data/qwen3_gqa/config.json" --steps 1
expect_error "--model-config naming a missing file is named" "nonexist.json: cannot read it" \
  "$bin" train --model-config "$tmp/nonexist.json" --steps 1
expect_error "--model naming the default preset with a config.json" "both name the architecture" \
  "$bin" train --model tiny --model-config "$data/qwen3_gqa/config.json" --steps 1
"$bin" train --model-config "$data/qwen3_gqa/config.json" --seq-len 16 --dump-config \
  >"$tmp/dumped.toml" 2>/dev/null && grep -q '^model="tiny"' "$tmp/dumped.toml" &&
  "$bin" train --config "$tmp/dumped.toml" --steps 1 >/dev/null 2>&1
check "a dumped config of a config.json run (it lists model=\"tiny\") trains" $?
expect_error "--model with an HF directory" "--init-from-hf both name the architecture" \
  "$bin" train --model qwen3-tiny --init-from-hf "$data/qwen3_gqa" --steps 1
expect_error "bench --model with a config.json" "both name the architecture" \
  "$bin" bench --model base --model-config "$data/qwen3_gqa/config.json" --steps 1
expect_error "export-hf with two inputs" "one input" \
  "$bin" export-hf --ckpt "$tmp/ck" --weights "$tmp/w0.safetensors" --out "$tmp/x"
"$bin" train --model tiny --steps 1 --save-weights "$tmp/gpt.safetensors" >/dev/null 2>&1
expect_error "export-hf of a GPT weights file" "export-hf writes the Llama family" \
  "$bin" export-hf --weights "$tmp/gpt.safetensors" --out "$tmp/x"
expect_error "export-hf into its own checkpoint" "checkpoint" \
  "$bin" export-hf --ckpt "$tmp/ck" --out "$tmp/ck/step_00000006"
# No output of train replaces the model's description or the Hugging Face directory it reads.
cp "$data/qwen3_gqa/config.json" "$tmp/mc.json"
expect_error "--metrics onto --model-config is refused" "is the file --model-config" \
  "$bin" train --model-config "$tmp/mc.json" --seq-len 16 --steps 1 --metrics "$tmp/mc.json"
cp -r "$data/qwen3_gqa" "$tmp/hf_in"
expect_error "--metrics into the --init-from-hf directory is refused" "lies inside --init-from-hf" \
  "$bin" train --init-from-hf "$tmp/hf_in" --seq-len 16 --steps 1 --metrics "$tmp/hf_in/config.json"
# A Hugging Face cache snapshot: its files are links to blobs outside the directory; writing
# the link's name (a rename replaces the link in the snapshot) is refused all the same.
mkdir -p "$tmp/hfc/blobs" "$tmp/hfc/snap" && cp "$data/qwen3_gqa"/* "$tmp/hfc/blobs/" &&
  for f in "$tmp/hfc/blobs"/*; do ln -s "../blobs/$(basename "$f")" "$tmp/hfc/snap/"; done
expect_error "--save-weights onto a snapshot's linked weights is refused" \
  "lies inside --init-from-hf" "$bin" train --init-from-hf "$tmp/hfc/snap" --seq-len 16 \
  --steps 1 --save-weights "$tmp/hfc/snap/model.safetensors"
cmp -s "$tmp/mc.json" "$data/qwen3_gqa/config.json" &&
  cmp -s "$tmp/hf_in/config.json" "$data/qwen3_gqa/config.json"
check "  ... and both inputs are untouched" $?
# An export into a directory holding an earlier export leaves no stale weights beside its
# own (a loader takes model.safetensors before an index, as transformers does).
"$bin" train --model qwen3-small --seq-len 32 --steps 0 --save-weights "$tmp/qs.safetensors" \
  >/dev/null 2>&1 &&
  "$bin" export-hf --weights "$tmp/qs.safetensors" --out "$tmp/re" >/dev/null 2>&1 &&
  cp "$root/sshsdp/text/testdata/gpt2_style.json" "$tmp/re/tokenizer.json" &&
  "$bin" export-hf --weights "$tmp/qs.safetensors" --out "$tmp/re" --shard-mb 1 >/dev/null 2>&1 &&
  [ ! -e "$tmp/re/model.safetensors" ] && [ -e "$tmp/re/model.safetensors.index.json" ] &&
  "$bin" export-hf --weights "$tmp/qs.safetensors" --out "$tmp/re" >/dev/null 2>&1 &&
  [ -e "$tmp/re/model.safetensors" ] && [ ! -e "$tmp/re/model.safetensors.index.json" ] &&
  ! ls "$tmp/re"/model-*-of-*.safetensors >/dev/null 2>&1 &&
  cmp -s "$tmp/re/tokenizer.json" "$root/sshsdp/text/testdata/gpt2_style.json"
check "export-hf replaces an earlier export's weights, single file or shards, leaving none stale (and other files alone)" $?
finish_checks
