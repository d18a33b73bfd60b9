#!/usr/bin/python3
"""Plots of sshsdp runs as PNG files (Debian's python3-matplotlib, installed by scripts/setup.sh).

  scripts/plot_metrics.py out/metrics.jsonl out/metrics.png
      training and validation loss, tokens/s and memory against step, from the JSON lines
      `sshsdp train --metrics` writes (a resumed run appends; the last record of a step wins)
  scripts/plot_metrics.py --bench out/bench.json out/bench.png
      a Figure-8-style plot from `sshsdp bench --json`: sshsdp's speed-up over every other
      configuration (its tokens/s ratio inverted; the paired round-robin ratio where the
      bench measured one) against tokens per microbatch, one line per configuration

Exits non-zero naming the file when it holds no usable record.
"""
import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def fail(msg):
    print(f"plot_metrics: {msg}", file=sys.stderr)
    sys.exit(1)


def read_metrics(path):
    by_step = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not a JSON line ({e})")
            if "step" in r:
                by_step[r["step"]] = r
    if not by_step:
        fail(f"{path}: no step records (write them with sshsdp train --metrics FILE)")
    return [by_step[s] for s in sorted(by_step)]


def plot_metrics(rows, out, title):
    steps = [r["step"] for r in rows]
    fig, (ax_loss, ax_tps, ax_mem) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    train = [(r["step"], r["loss"]) for r in rows if not r.get("skipped")]
    ax_loss.plot([s for s, _ in train], [v for _, v in train], label="train loss", lw=1)
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if val:
        ax_loss.plot([s for s, _ in val], [v for _, v in val], "o-", label="validation loss")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_tps.plot(steps, [r["tokens_per_s"] for r in rows], lw=1, color="tab:green")
    ax_tps.set_ylabel("tokens/s (all ranks)")
    ax_tps.grid(alpha=0.3)
    ax_mem.plot(steps, [r["accounted_peak_mib"] for r in rows], label="accounted peak")
    ax_mem.plot(steps, [r["peak_rss_mib"] for r in rows], label="peak RSS")
    ax_mem.set_ylabel("memory per rank (MiB)")
    ax_mem.set_xlabel("step")
    ax_mem.legend()
    ax_mem.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def plot_bench(rows, out, title):
    if not isinstance(rows, list) or not rows:
        fail("the bench file holds no rows (write it with sshsdp bench --json FILE)")
    lines = {}
    for r in rows:
        if r.get("config") == r.get("ratio_reference"):
            continue  # the reference itself: speed-up 1
        ratio = r.get("ratio_to_sshsdp_paired") or r.get("ratio_to_sshsdp")
        if not ratio or not math.isfinite(ratio):
            continue
        lines.setdefault(r["config"], []).append((r["tokens_per_microbatch"], 1.0 / ratio))
    if not lines:
        fail("the bench file has no configuration besides its reference")
    fig, ax = plt.subplots(figsize=(8, 5))
    for config, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=config)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per microbatch per rank")
    ax.set_ylabel(f"speed-up of {rows[0].get('ratio_reference', 'sshsdp')} over the configuration")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("input", help="metrics JSON lines (train --metrics) or, with --bench, bench --json")
    p.add_argument("output", help="PNG file to write")
    p.add_argument("--bench", action="store_true", help="input is a `sshsdp bench --json` file")
    p.add_argument("--title", default=None, help="figure title (default: the input's name)")
    a = p.parse_args()
    title = a.title or a.input
    try:
        if a.bench:
            with open(a.input) as f:
                try:
                    rows = json.load(f)
                except json.JSONDecodeError as e:
                    fail(f"{a.input}: not a JSON file ({e})")
            plot_bench(rows, a.output, title)
        else:
            plot_metrics(read_metrics(a.input), a.output, title)
    except OSError as e:
        fail(str(e))
    except KeyError as e:
        fail(f"{a.input}: a record lacks {e} (is it the right kind of file? --bench for bench JSON)")
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
