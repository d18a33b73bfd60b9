#!/usr/bin/env python3
"""Markdown tables of a bench/baselines_sweep.sh directory (its <model>-<dtype>-<tag>.json).

  bench/summarize_sweep.py out/sweep

Per model and dtype: sshsdp ÷ preset tokens/s, paired (median over rounds of the per-round
ratio), forward / reverse preset order, against the A/A floor (sshsdp ÷ sshsdp in the same
job); then the time split of sshsdp and fsdp2 at the largest workload (ms per step, mean over
ranks: compute, exposed communication, copies, casts, adds, optimizer, other) and the bytes
copied on the weight / gradient paths and inside collectives. The header names the CPU and date.
"""
import datetime
import glob
import json
import os
import platform
import sys


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load(d):
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        name = os.path.basename(path)[:-5]
        model, dtype, tag = name.rsplit("-", 2)
        runs[(model, dtype, tag)] = json.load(open(path))
    return runs


def paired(rows, config, tokens):
    for r in rows:
        if r["config"] == config and r["tokens_per_microbatch"] == tokens:
            return r
    return None


def main():
    d = sys.argv[1]
    runs = load(d)
    isa = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
    seqs = sorted({r["tokens_per_microbatch"] // r["batch_size"]
                   for rows in runs.values() for r in rows if r.get("batch_size")})
    print(f"Measured {datetime.date.today()} on {cpu_name()} ({isa}, {os.cpu_count()} cores), "
          f"2 ranks fully sharded, 4 microbatches, T = {', '.join(map(str, seqs)) or '?'}.\n")
    for model, dtype in sorted({(m, t) for m, t, _ in runs}):
        fwd, rev, aa = (runs.get((model, dtype, t)) for t in ("forward", "reverse", "aa"))
        if not fwd:
            continue
        tokens = sorted({r["tokens_per_microbatch"] for r in fwd})
        presets = [r["config"] for r in fwd if r["tokens_per_microbatch"] == tokens[0]][1:]
        print(f"**{model}, {dtype} weights** — sshsdp ÷ preset tokens/s, paired, forward / "
              "reverse preset order (> 1: sshsdp faster)\n")
        print("| tokens per microbatch | " + " | ".join(str(t) for t in tokens) + " |")
        print("|---|" + "---|" * len(tokens))
        for p in presets:
            cells = []
            for t in tokens:
                a = paired(fwd, p, t)
                b = paired(rev, p, t) if rev else None
                fa = f"{1 / a['ratio_to_sshsdp_paired']:.2f}" if a else "—"
                # In the reverse order the reference is still the sshsdp row.
                fb = f"{1 / b['ratio_to_sshsdp_paired']:.2f}" if b else "—"
                cells.append(f"{fa} / {fb}")
            print(f"| {p} | " + " | ".join(cells) + " |")
        if aa:
            cells = []
            for t in tokens:
                rows = [r for r in aa if r["tokens_per_microbatch"] == t]
                cells.append(f"{1 / rows[-1]['ratio_to_sshsdp_paired']:.3f}" if len(rows) > 1 else "—")
            print("| A/A floor (sshsdp ÷ sshsdp) | " + " | ".join(cells) + " |")
        t = tokens[-1]
        print(f"\nTime split at {t} tokens per microbatch (ms per step, mean over ranks; side work "
              "on the communication thread shows only where it is exposed, as comm wait):\n")
        print("| config | step | compute | comm wait | copy | cast | add | optimizer | other | "
              "bytes copied (weights + grads) | copied inside collectives |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in fwd:
            if r["tokens_per_microbatch"] != t:
                continue
            s = r["time_s"]
            print(f"| {r['config']} ({r['qkv_model']}) | {1e3 * r['median_step_s']:.1f} | "
                  + " | ".join(f"{1e3 * s[k]:.1f}" for k in
                               ("compute", "comm_wait", "copy", "cast", "add", "optimizer", "other"))
                  + f" | {r['bytes_copied_per_step'] / 2**20:.1f} MiB"
                  + f" | {r['collective_copy_bytes_per_step'] / 2**20:.1f} MiB |")
        print()


if __name__ == "__main__":
    main()
