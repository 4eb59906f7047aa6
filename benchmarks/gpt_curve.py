#!/usr/bin/python3
"""gpt_curve.py - the loss curve of a ddp-train --model gpt2 run from its --metrics file: a markdown
table (step, training loss, validation loss) on stdout and, with gnuplot, a PNG.

ddp-train writes {"step", "train_loss", "grad_norm"} every --log-every steps, {"step",
"val_loss", ...} every --val-every steps, and a summary line last (its val_loss is the final one).

Usage: gpt_curve.py METRICS.jsonl [OUT.png]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    summary = next((l for l in lines if l.get("summary")), {})
    train = [(l["step"], l["train_loss"]) for l in lines if "train_loss" in l and "val_loss" not in l
             and not l.get("summary")]
    val = [(l["step"], l["val_loss"]) for l in lines if "val_loss" in l and not l.get("summary")]
    if summary.get("val_loss", -1) >= 0 and (not val or val[-1][0] != summary["steps"]):
        val.append((summary["steps"], summary["val_loss"]))
    vals = dict(val)
    print("| step | training loss (rank 0, mean since the last line) | validation loss |")
    print("|---|---|---|")
    for step, loss in train:
        v = vals.get(step)
        print(f"| {step} | {loss:.3f} | {'' if v is None else f'{v:.3f}'} |")
    if summary:
        print(f"\nsummary: {summary.get('steps')} steps, {summary.get('tokens_per_s')} tokens/s, "
              f"{summary.get('model_gflops_per_rank')} GFLOP/s per rank")
    if len(sys.argv) == 3:
        plot(train, val, sys.argv[2])


def plot(train, val, out):
    if not shutil.which("gnuplot"):
        print("gpt_curve: gnuplot not found: no plot", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows in (("train", train), ("val", val)):
            with open(os.path.join(tmp, name + ".dat"), "w") as f:
                f.writelines(f"{s} {v}\n" for s, v in rows)
        script = (f"set terminal pngcairo size 900,520 noenhanced\nset output '{out}'\nset grid\n"
                  "set xlabel 'optimizer step'\nset ylabel 'cross-entropy (nats)'\n"
                  f"plot '{tmp}/train.dat' with linespoints title 'training (rank 0)', "
                  f"'{tmp}/val.dat' with linespoints lw 2 title 'validation'\n")
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


if __name__ == "__main__":
    main()
