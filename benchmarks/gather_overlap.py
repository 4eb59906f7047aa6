#!/usr/bin/python3
"""gather_overlap.py - how much of ZeRO's parameter all-gather the next forward pass hides, read
from a ddp-train --trace file (Chrome trace JSON, every rank's events).

For each optimizer step of each rank: the gather starts when the "optimizer" span ends (the
trainer's ddp_reducer_gather_start) and ends with the last "allgather" span that begins before the
next "optimizer" span; "hidden" is the time inside that interval spent computing "forward.layer"
spans (the forward pass, waiting layer by layer for its slices, gpt2_set_gather), over the
interval. Prints the medians over the steps and ranks (the first step left out: it allocates).

Usage: gather_overlap.py TRACE.json [LABEL]
"""
import json
import statistics
import sys
from collections import defaultdict


def spans_of(path):
    with open(path) as f:
        d = json.load(f)
    events = d["traceEvents"] if isinstance(d, dict) else d
    open_at, spans = {}, defaultdict(list)
    for e in sorted((e for e in events if e.get("ph") in ("B", "E")), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"], e["name"])
        if e["ph"] == "B":
            open_at.setdefault(key, []).append(e["ts"])
        elif open_at.get(key):
            spans[(e["pid"], e["name"])].append((open_at[key].pop(), e["ts"]))
    return spans


def steps(spans):
    """(gather ms, forward compute inside it ms) per step and rank."""
    rows = []
    for pid in sorted({p for p, _ in spans}):
        opt = sorted(spans[(pid, "optimizer")])
        gathers = sorted(spans[(pid, "allgather")])
        layers = sorted(spans[(pid, "forward.layer")])
        for i, (_, start) in enumerate(opt[1:], 1):
            stop = opt[i + 1][0] if i + 1 < len(opt) else float("inf")
            mine = [g for g in gathers if start <= g[0] < stop]
            if not mine:
                continue
            end = max(e for _, e in mine)
            busy = sum(max(0, min(e, end) - max(b, start)) for b, e in layers if b < end and e > start)
            rows.append(((end - start) / 1e3, busy / 1e3))
    return rows


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = steps(spans_of(sys.argv[1]))
    label = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    if not rows:
        sys.exit(f"gather_overlap: {sys.argv[1]}: no all-gather after an optimizer step (a --zero 1|2 run "
                 "with --trace and at least 3 steps?)")
    gather = statistics.median(r[0] for r in rows)
    busy = statistics.median(r[1] for r in rows)
    hidden = statistics.median(r[1] / r[0] for r in rows if r[0] > 0)
    print(f"| {label} | {len(rows)} | {gather:.1f} | {busy:.1f} | {100 * hidden:.0f} % |")


if __name__ == "__main__":
    main()
