#!/usr/bin/env python3
"""Writes GPT-2-sized token files in llm.c's format (test fixtures, no tokenizer needed).

  make_gpt2_tokens.py DIR   ->  DIR/train.bin (200,000 tokens), DIR/val.bin (20,000 tokens)

Tokens follow an order-1 chain over 300 ids spread up to 50,256 (each id has 3 successors, the
first taken 70 % of the time), so a model can learn it and the vocabulary inferred from the
data is GPT-2's 50,257.
"""
import random
import struct
import sys

ids = sorted(random.Random(0).sample(range(50256), 299)) + [50256]
nxt = {a: random.Random(a).sample(ids, 3) for a in ids}


def write(path, n, seed):
    r = random.Random(seed)
    t = [ids[0]]
    while len(t) < n:
        t.append(nxt[t[-1]][0] if r.random() < 0.7 else r.choice(nxt[t[-1]]))
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *t))


write(f"{sys.argv[1]}/train.bin", 200000, 1)
write(f"{sys.argv[1]}/val.bin", 20000, 2)
