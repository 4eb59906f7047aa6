#!/usr/bin/env python3
"""scaling_report.py - turns the CSVs of benchmarks/scaling.sh into a markdown table and PNG plots.

Usage: scaling_report.py OUT_DIR [--note TEXT]
Reads OUT_DIR/runs.csv and OUT_DIR/allreduce.csv; writes OUT_DIR/table.md and, with gnuplot,
throughput.png (samples/s vs ranks, with the ideal line), efficiency.png, exposed.png (exposed
communication per step) and busbw.png (all-reduce bus bandwidth vs message size).
A configuration is (model, mode, bucket cap, overlap, gradient dtype); its runs at one rank count are
reduced to their median. Efficiency at R ranks = samples/s(R) / (samples/s(R0) * R / R0), R0 the
fewest ranks measured for that configuration (weak and strong scaling alike: the ideal is linear
speed-up of throughput). GPT-2 rows show tokens/s (runs.csv's tokens_per_s) where MLP rows show
samples/s; a runs.csv without a model column is the MLP's.
"""
import csv
import os
import shutil
import statistics
import subprocess
import sys

CONFIG = ("model", "mode", "bucket_mb", "overlap", "grad_dtype")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def median_of(rows, field):
    vals = [float(r[field]) for r in rows if r.get(field) not in (None, "")]
    return statistics.median(vals) if vals else None


def summarise(runs):
    """{config: {ranks: {field: median}}} plus the number of runs behind each median."""
    groups = {}
    for r in runs:
        r.setdefault("model", "mlp")
        key = tuple(r[k] for k in CONFIG)
        groups.setdefault(key, {}).setdefault(int(r["ranks"]), []).append(r)
    out = {}
    for key, by_ranks in groups.items():
        out[key] = {}
        for ranks, rows in sorted(by_ranks.items()):
            out[key][ranks] = {f: median_of(rows, f) for f in
                               ("samples_per_s", "tokens_per_s", "step_ms", "exposed_comm_ms", "comm_ms", "hidden_fraction")}
            out[key][ranks].update(nodes=int(rows[0]["nodes"]), batch=int(rows[0]["batch_per_rank"]),
                                   n=len(rows))
        base_ranks = min(out[key])
        base = out[key][base_ranks]["samples_per_s"]
        for ranks, m in out[key].items():
            m["ideal"] = base * ranks / base_ranks
            m["efficiency"] = m["samples_per_s"] / m["ideal"] if m["ideal"] else None
    return out


def label(key):
    model, mode, bucket, overlap, dtype = key
    cap = "one bucket" if bucket == "one" else f"{bucket} MiB"
    ov = "" if bucket == "one" else (", overlap" if overlap == "on" else ", no overlap")
    dt = "" if dtype == "default" else f", {dtype}"
    return f"{'' if model == 'mlp' else model + ' '}{mode}: {cap}{ov}{dt}"


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def write_table(out_dir, summary, note):
    lines = ["| mode | model | nodes | ranks | batch/rank | buckets | overlap | grad dtype | throughput | "
             "efficiency | step (ms) | exposed comm (ms) | hidden | runs |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key in sorted(summary):
        model, mode, bucket, overlap, dtype = key
        for ranks, m in sorted(summary[key].items()):
            hidden = None if m["hidden_fraction"] is None else 100 * m["hidden_fraction"]
            rate = (f"{fmt(m['samples_per_s'], ',.0f')} samples/s" if m["tokens_per_s"] is None else
                    f"{fmt(m['tokens_per_s'], ',.0f')} tokens/s")
            lines.append(f"| {mode} | {model} | {m['nodes']} | {ranks} | {m['batch']} | "
                         f"{'one' if bucket == 'one' else bucket + ' MiB'} | {overlap} | {dtype} | "
                         f"{rate} | {fmt(100 * m['efficiency'], '.0f')}% | "
                         f"{fmt(m['step_ms'], '.1f')} | {fmt(m['exposed_comm_ms'], '.1f')} | "
                         f"{fmt(hidden, '.0f')}% | {m['n']} |")
    if note:
        lines.append(f"\n{note}. Medians of the runs per row; efficiency = samples/s over the ideal "
                     "(the fewest ranks' samples/s scaled linearly).")
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def write_series(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(" ".join("nan" if v is None else str(v) for v in r) + "\n")


def busbw_series(bench):
    """{ranks: [(size, median busbw)]}"""
    by = {}
    for r in bench:
        by.setdefault(int(r["ranks"]), {}).setdefault(int(r["size_bytes"]), []).append(float(r["busbw_gbs"]))
    return {k: sorted((s, statistics.median(v)) for s, v in sizes.items()) for k, sizes in sorted(by.items())}


def gnuplot_script(out_dir, summary, busbw):
    keys = sorted(summary)
    d = os.path.join(out_dir, "plotdata")
    os.makedirs(d, exist_ok=True)
    for i, key in enumerate(keys):
        write_series(os.path.join(d, f"c{i}.dat"),
                     [(r, m["samples_per_s"], m["ideal"], m["efficiency"], m["exposed_comm_ms"])
                      for r, m in sorted(summary[key].items())])
    for ranks, pts in busbw.items():
        write_series(os.path.join(d, f"bw{ranks}.dat"), pts)
    head = ("set terminal pngcairo size 900,560 noenhanced\nset key outside right top\nset grid\n"
            "set xlabel 'ranks'\nset logscale x 2\n")
    cfg = lambda col, extra="": ", ".join(
        f"'{d}/c{i}.dat' using 1:{col} with linespoints title '{label(k)}'{extra}" for i, k in enumerate(keys))
    ideal = ", ".join(f"'{d}/c{i}.dat' using 1:3 with lines dashtype 2 lc rgb 'gray' "
                      f"title '{'ideal' if i == 0 else ''}'" for i, k in enumerate(keys))
    s = head
    s += f"set output '{out_dir}/throughput.png'\nset title 'samples/s vs ranks (GPT: sequences/s; dashed: ideal)'\n"
    s += f"set ylabel 'samples/s'\nplot {cfg(2)}, {ideal}\n"
    s += f"set output '{out_dir}/efficiency.png'\nset title 'scaling efficiency'\nset ylabel 'efficiency'\n"
    s += f"set yrange [0:*]\nplot {cfg(4)}, 1 with lines dashtype 2 lc rgb 'gray' title 'ideal'\n"
    s += f"set output '{out_dir}/exposed.png'\nset title 'exposed communication per step (ddp-train --trace)'\n"
    s += f"set ylabel 'ms per step'\nplot {cfg(5)}\n"
    s += (f"set output '{out_dir}/busbw.png'\nset title 'ddp-allreduce-bench bus bandwidth'\n"
          "set xlabel 'message size (bytes)'\nset ylabel 'busbw (GB/s)'\nset logscale x 4\nset yrange [0:*]\n")
    s += "plot " + ", ".join(f"'{d}/bw{r}.dat' using 1:2 with linespoints title '{r} ranks'" for r in busbw) + "\n"
    return s


def main():
    out_dir = os.path.abspath(sys.argv[1])
    note = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--note" else ""
    summary = summarise(read_csv(os.path.join(out_dir, "runs.csv")))
    busbw = busbw_series(read_csv(os.path.join(out_dir, "allreduce.csv")))
    write_table(out_dir, summary, note)
    script = gnuplot_script(out_dir, summary, busbw)
    with open(os.path.join(out_dir, "plots.gp"), "w") as f:
        f.write(script)
    if not shutil.which("gnuplot"):
        sys.exit("scaling_report: gnuplot not found: apt-get install -y gnuplot-nox "
                 "(scripts/install-deps.sh test installs it); table.md is written")
    subprocess.run(["gnuplot", os.path.join(out_dir, "plots.gp")], check=True)
    print(f"scaling_report: {out_dir}/table.md and 4 PNGs")


if __name__ == "__main__":
    main()
