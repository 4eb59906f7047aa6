#!/usr/bin/env python3
"""test_verify_fail.py - runs a failing multi-rank job and proves the failure was detected:
the job must finish within --timeout, exit with --expect-rc, and print every --expect text.

usage: test_verify_fail.py [--timeout S] [--skip-rc N] --expect-rc N [--expect TEXT ...] -- COMMAND ...
With --skip-rc N, a command that exits N is passed on as skipped (77): e.g. a GPU test on a GPU.
"""
import argparse
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--expect-rc", type=int, required=True)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--skip-rc", type=int)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        print(f"FAIL: job still running after {args.timeout} s (a rank hangs)\n"
              f"{e.stderr or ''}", file=sys.stderr)
        return 1
    output = proc.stdout + proc.stderr
    if args.skip_rc is not None and proc.returncode == args.skip_rc:
        print(output)
        return 77
    problems = []
    if proc.returncode != args.expect_rc:
        problems.append(f"exit status {proc.returncode}, want {args.expect_rc}")
    problems += [f"missing from the output: {t!r}" for t in args.expect if t not in output]
    if problems:
        print("FAIL: " + "; ".join(problems) + "\n--- output ---\n" + output, file=sys.stderr)
        return 1
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
