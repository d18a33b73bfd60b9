#!/usr/bin/python3
"""A timeline PNG of an sshsdp Chrome trace (Debian's python3-matplotlib, scripts/setup.sh).

  scripts/plot_trace.py out/trace.json out/trace.png [--step N] [--title TEXT]
      one row per process (rank, or configuration and rank for `sshsdp bench --trace`) and
      thread (compute, communication); bars coloured by kind: forward, backward, all-gather,
      reduce-scatter, waits, the update phase, G, the baselines' copies. With --step N only
      that step (its "step" span's args.step) is drawn, without it each process's first step;
      time 0 is the earliest rank's start of it (ranks' clocks are aligned at start-up).
  scripts/plot_trace.py out/bench_trace.json out/bench.png --align-each
      each process shifted so its own step starts at 0: rows recorded at different times
      (the configurations of `sshsdp bench --trace`) line up side by side.

The trace file is what `sshsdp train --trace` / `sshsdp bench --trace` write; Perfetto
(ui.perfetto.dev) and chrome://tracing open it too. Exits non-zero naming the file when it
holds no step.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = [  # (label, colour, test on the span name)
    ("forward", "#4C72B0", lambda n: n == "forward"),
    ("backward", "#55A868", lambda n: n == "backward"),
    ("all-gather", "#DD8452", lambda n: n.startswith("all-gather") or n == "outer all-gather"),
    ("reduce-scatter", "#C44E52",
     lambda n: n.startswith("reduce-scatter") or n in ("outer reduce-scatter",
                                                      "HSDP all-reduce",
                                                      "loss/norm all-reduce")),
    ("wait", "#BBBBBB", lambda n: n.startswith("wait")),
    ("update (F), norm", "#8172B3", lambda n: n in ("update (F)", "gradient norm")),
    ("G", "#937860", lambda n: n.startswith("G (")),
    ("copies, casts, adds", "#DA8BC3",
     lambda n: any(c in n for c in ("copy", "cast", "pack", "add"))),
]


def kind_of(name):
    for i, (_, _, test) in enumerate(KINDS):
        if test(name):
            return i
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--step", type=int, default=None, help="the step to draw (default: first)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--align-each", action="store_true",
                    help="start every process's step at 0 (bench traces)")
    a = ap.parse_args()
    try:
        with open(a.trace, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plot_trace.py: {a.trace}: not a readable trace ({e})")
    names, spans = {}, []
    for e in doc.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "X":
            spans.append(e)
    steps = {}  # pid -> (start, end) of the chosen step
    for e in spans:
        if e["name"] != "step" or e["tid"] != 0:
            continue
        n = e.get("args", {}).get("step")
        if a.step is not None and n != a.step:
            continue
        if e["pid"] not in steps or e["ts"] < steps[e["pid"]][0]:
            steps[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    if not steps:
        sys.exit(f"plot_trace.py: {a.trace}: no step" +
                 (f" {a.step}" if a.step is not None else "") + " in the trace")
    pids = sorted(steps)
    if not a.align_each:  # one time axis for every rank
        origin = min(t0 for t0, _ in steps.values())
        steps = {p: (origin, t1) for p, (t0, t1) in steps.items()}
    lanes = [(p, t) for p in pids for t in (0, 1)]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(lanes) + 1.5))
    longest = 0.0
    for row, (pid, tid) in enumerate(lanes):
        t0, t1 = steps[pid]
        longest = max(longest, (t1 - t0) / 1e3)
        by_kind = {}
        for e in spans:
            if e["pid"] != pid or e["tid"] != tid or e["name"] == "step":
                continue
            if e["ts"] < t0 - 1 or e["ts"] + e["dur"] > t1 + 1:
                continue
            k = kind_of(e["name"])
            if k is not None:
                by_kind.setdefault(k, []).append(((e["ts"] - t0) / 1e3, e["dur"] / 1e3))
        y = len(lanes) - 1 - row
        for k, bars in sorted(by_kind.items()):
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=KINDS[k][1], linewidth=0)
    labels = [f"{names.get(p, f'pid {p}')} · {'compute' if t == 0 else 'comm'}" for p, t in lanes]
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=8)
    ax.set_xlim(0, longest * 1.02)
    ax.set_xlabel("ms from the start of the step")
    ax.set_title(a.title or f"{a.trace}: one step per row")
    handles = [matplotlib.patches.Patch(color=c, label=l) for l, c, _ in KINDS]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(lanes)),
              ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png} ({len(pids)} processes, {len(spans)} spans)")


if __name__ == "__main__":
    main()
