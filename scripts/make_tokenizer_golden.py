#!/usr/bin/env python3
"""Writes the tokenizer goldens tokenizer_test holds sshsdp to (developers only; CI reads the
committed files): two small byte-level BPE tokenizers trained offline with HF `tokenizers` on a
corpus assembled here, and the ids `tokenizers` gives for held-out documents.

  python3 scripts/make_tokenizer_golden.py [OUT_DIR]      # default sshsdp/text/testdata

Needs `tokenizers` (pip install tokenizers; e.g. the peers' venv of bench/peers). Writes
  gpt2_style.json   ByteLevel pre-tokenizer with GPT-2's regex, no normalizer (GPT-2)
  qwen_style.json   NFC, Split(Qwen2's pattern, Isolated) + ByteLevel, ignore_merges (Qwen)
  corpus.txt        the training corpus (documents separated by blank lines)
  heldout.jsonl     {"text": ..., "gpt2_style": [ids], "qwen_style": [ids]} per document
Both tokenizers have the added tokens <|endoftext|>, <|im_start|>, <|im_end|> (special) and
the held-out text uses them inside documents. Deterministic: the corpus comes from a seeded
generator over the fragments below.
"""
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

FRAGMENTS = [
    # English, with contractions in both cases
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, don't worry.",
    "WE'RE HERE AND YOU'VE SEEN IT.", "Sharded data parallelism keeps 1/8 of the weights per rank.",
    "Numbers: 3.14159, 2718281828, 1,000,000 and -42.", "e-mail: someone@example.org (not real)",
    # German, French, Spanish, with accents composed and decomposed (NFC merges the second)
    "Größenwahn über Straßen: Äpfel, Öl und Übermut.", "Les élèves étudient à l'école près du café.",
    "Cafe\u0301 cre\u0300me bru\u0302le\u0301e", "¿Dónde está la biblioteca? ¡Allí!",
    # Russian, Greek, Arabic, Hebrew, Hindi
    "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Καλημέρα κόσμε, τι κάνεις;",
    "مرحبا بالعالم، كيف حالك اليوم؟", "שלום עולם, מה שלומך?", "नमस्ते दुनिया, आप कैसे हैं?",
    # Chinese, Japanese, Korean
    "分片数据并行训练大模型。", "今日はいい天気ですね。東京タワーへ行きましょう！", "안녕하세요 세계, 반갑습니다.",
    # emoji, including ZWJ sequences and flags
    "Deploy 🚀 now! 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ✨✨✨", "😀😃😄😁😆😅😂🤣",
    # code
    "def train(step: int) -> float:\n    return loss.item()  # fp32\n",
    "for (int i = 0; i < n; ++i) {\n\ty[i] += a * x[i];\n}\n", "if x != y && !z { panic!(\"{}\", x) }",
    "<div class=\"row\">&nbsp;</div>", "SELECT * FROM runs WHERE loss < 0.5;",
    # whitespace runs, tabs, newlines, CRLF, non-breaking and ideographic spaces
    "a    b\t\t\tc\n\n\nd", "line one\r\nline two\r\n", "   leading and trailing   ",
    "x\u00a0y\u3000z\u2003w", "tab\tsep\tvalues\n1\t2\t3",
]


def documents(rng, n, lo, hi):
    return ["".join(rng.choice([" ", "\n", "  ", "", "\t"]) + rng.choice(FRAGMENTS)
                    for _ in range(rng.randint(lo, hi))).strip() for _ in range(n)]


def train(kind, corpus):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "qwen_style")))
    if kind == "qwen_style":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "sshsdp", "text", "testdata")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(20261204)
    corpus = documents(rng, 400, 2, 8)
    heldout = documents(rng, 60, 1, 6)
    for i in range(0, len(heldout), 4):  # special tokens inside text
        heldout[i] = heldout[i][:len(heldout[i]) // 2] + rng.choice(SPECIAL) + heldout[i][len(heldout[i]) // 2:]
    heldout += ["", " ", "\n\n", "<|endoftext|><|endoftext|>", "<|im_start|>user\nhi<|im_end|>",
                "a" * 300, " " * 300, "🚀" * 40, "x\u0301" * 20]
    open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8").write("\n\n".join(corpus) + "\n")
    toks = {kind: train(kind, corpus) for kind in ("gpt2_style", "qwen_style")}
    for kind, tok in toks.items():
        tok.save(os.path.join(out, f"{kind}.json"))
    with open(os.path.join(out, "heldout.jsonl"), "w", encoding="utf-8") as f:
        for text in heldout:
            row = {"text": text}
            for kind, tok in toks.items():
                row[kind] = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    n_bytes = sum(len(t.encode()) for t in heldout)
    print(f"wrote {out}: {len(corpus)} corpus documents, {len(heldout)} held-out documents "
          f"({n_bytes} bytes)")


if __name__ == "__main__":
    main()
