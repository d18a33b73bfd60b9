#!/usr/bin/env bash
# Tokenization throughput: `sshsdp tokenize` against HF `tokenizers` (encode_batch) on the same
# text, tokenizer and machine, at 1 and 2 threads; MB/s of UTF-8 input, medians of REPEATS runs
# each, interleaved. Benchmark only, never a test. Needs `tokenizers` in the peers' venv
# (bench/peers/run_fsdp2_peer.sh installs torch there; this adds tokenizers).
#
#   bench/tokenizer_bench.sh                          # the shipped corpus x 100 (~9 MB)
#   COPIES=20 REPEATS=5 TOKENIZER=path/tokenizer.json bench/tokenizer_bench.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
SSHSDP=${SSHSDP:-$ROOT/build/bin/sshsdp}
TOKENIZER=${TOKENIZER:-$ROOT/sshsdp/text/testdata/qwen_style.json}
COPIES=${COPIES:-100}
REPEATS=${REPEATS:-3}
OUT=${OUT:-$ROOT/out/tokenizer_bench}
mkdir -p "$OUT"
"$VENV/bin/python" -c "import tokenizers" 2>/dev/null || "$VENV/bin/pip" install --quiet tokenizers
text="$OUT/text.txt"
: >"$text"
for _ in $(seq "$COPIES"); do cat "$ROOT/sshsdp/text/testdata/corpus.txt" >>"$text"; done
echo "text: $(du -h "$text" | cut -f1), $(grep -c '' "$text") lines; tokenizer $TOKENIZER; CPU: $(lscpu | sed -n 's/^Model name: *//p')"
for threads in 1 2; do
  for rep in $(seq "$REPEATS"); do
    s=$( { TIMEFORMAT=%R; time "$SSHSDP" tokenize --tokenizer "$TOKENIZER" --input "$text" \
          --out "$OUT/t.bin" --threads "$threads" >/dev/null 2>&1; } 2>&1)
    h=$(RAYON_NUM_THREADS=$threads "$VENV/bin/python" - "$TOKENIZER" "$text" <<'PY'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [d.strip("\n") for d in open(sys.argv[2], encoding="utf-8").read().split("\n\n") if d.strip()]
t0 = time.time()
tok.encode_batch(docs, add_special_tokens=False)
print(f"{time.time() - t0:.3f}")
PY
)
    echo "$threads $s $h"
  done
done | "$VENV/bin/python" -c "
import os, statistics, sys
mb = os.path.getsize('$text') / 1e6
rows = {}
for line in sys.stdin:
    t, s, h = line.split(); rows.setdefault(int(t), []).append((float(s), float(h)))
print(f\"{'threads':>7} {'sshsdp MB/s':>12} {'HF MB/s':>9} {'sshsdp / HF':>12}\")
for t, r in sorted(rows.items()):
    s = statistics.median(x for x, _ in r); h = statistics.median(y for _, y in r)
    print(f'{t:>7} {mb / s:>12.1f} {mb / h:>9.1f} {h / s:>12.2f}')
print('(sshsdp: the whole tokenize command, reading and writing included; HF: encode_batch alone)')
"
