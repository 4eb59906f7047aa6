#!/usr/bin/env python3
"""run_suite.py - runs a meson test suite from `meson introspect --tests` output, without meson.

For a build folder compiled on one machine and carried to another (a GPU machine that has no
meson setup of its own, or where the checkout sits at another path): meson stores absolute
paths and may try to regenerate, so `meson test` cannot be trusted there. This runner reads the
tests' JSON (written where the build was made:
    meson introspect --tests BUILD > BUILD/meson-tests.json
), rewrites the recorded source and build folders to the ones given here, and runs each test of
the chosen suites one after another with its own arguments, environment, working folder and
timeout. Exit status 0 passes, 77 skips (meson's convention), anything else fails.

    benchmarks/run_suite.py BUILD/meson-tests.json [--suite cuda] [--source DIR] [--build DIR]
        [--log FILE] [--deadline SECONDS] [--timeout-cap SECONDS] [--only NAME,...]
        [--exclude NAME,...] [--list]

--source/--build default to the folder above the JSON's folder and the JSON's folder. The
recorded folders come from the tests' DDP_TEST_SRCDIR/DDP_TEST_BUILDDIR (or --from-source,
--from-build). A program the JSON names by an absolute path outside those folders (the test's
own program, and mpirun/mpiexec anywhere in its arguments: /usr/bin/mpirun) is taken from PATH
when PATH has one by that name (a carried Open MPI); Python scripts run under this interpreter. LD_LIBRARY_PATH, PATH
and PYTHONPATH of a test are put in front of this process's values (meson would replace them;
a carried build needs the caller's library paths too). A test past its timeout, or past
--deadline (seconds for the whole run), is killed and counted as TIMEOUT; tests not started
before the deadline are NOT RUN. Prints one line per test (result, seconds, the reason of a
skip) and `N passed, N failed, N skipped`; every test's output goes to --log. Exit status 0 when
nothing failed (skips, NOT RUN included, do not fail).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

MERGED = ("LD_LIBRARY_PATH", "PATH", "PYTHONPATH")
LAUNCHERS = ("mpirun", "mpiexec", "orterun")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", help="JSON from `meson introspect --tests BUILD`")
    ap.add_argument("--suite", default="cuda", help="suite(s), comma-separated (default cuda); 'all' for every test")
    ap.add_argument("--source", help="the source tree here (default: the folder above the build)")
    ap.add_argument("--build", help="the build folder here (default: the JSON's folder)")
    ap.add_argument("--from-source", help="the source tree recorded in the JSON (default: DDP_TEST_SRCDIR)")
    ap.add_argument("--from-build", help="the build folder recorded in the JSON (default: DDP_TEST_BUILDDIR)")
    ap.add_argument("--log", help="every test's output, one after another (default: BUILD/run_suite.log)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run (0: none)")
    ap.add_argument("--timeout-cap", type=float, default=0, help="cap on each test's own timeout (0: none)")
    ap.add_argument("--only", default="", help="test names to run, comma-separated")
    ap.add_argument("--exclude", default="", help="test names to leave out, comma-separated")
    ap.add_argument("--list", action="store_true", help="print the rewritten commands, run nothing")
    return ap.parse_args()


def in_suites(test, suites):
    if suites == {"all"}:
        return True
    names = set()
    for s in test.get("suite", []):
        names.add(s)
        names.add(s.split(":", 1)[-1])
    return bool(names & suites)


def recorded_roots(tests):
    src = build = None
    for t in tests:
        env = t.get("env") or {}
        src = src or env.get("DDP_TEST_SRCDIR")
        build = build or env.get("DDP_TEST_BUILDDIR")
    return src, build


def rewriter(pairs):
    """Replaces each recorded folder by its counterpart here, longest first."""
    pairs = sorted([(a.rstrip("/"), b.rstrip("/")) for a, b in pairs if a], key=lambda p: -len(p[0]))

    def rw(s):
        for old, new in pairs:
            if old != new and old in s:
                s = s.replace(old, new)
        return s
    return rw


def command(test, rw, roots):
    cmd = [rw(a) for a in test["cmd"]]
    for i, arg in enumerate(cmd):
        # a system program (outside the source and build folders): the one on PATH wins, so that
        # a carried Open MPI's mpirun replaces the /usr/bin/mpirun recorded where the build was made
        if os.path.isabs(arg) and (i == 0 or os.path.basename(arg) in LAUNCHERS) \
                and not any(arg.startswith(r + "/") for r in roots):
            found = shutil.which(os.path.basename(arg))
            if found:
                cmd[i] = found
    if cmd[0].endswith(".py"):
        cmd = [sys.executable] + cmd
    return cmd


def environment(test, rw):
    env = dict(os.environ)
    for k, v in (test.get("env") or {}).items():
        v = rw(v)
        if k in MERGED and os.environ.get(k):
            v = v + ":" + os.environ[k]
        env[k] = v
    env.setdefault("MESON_TEST_ITERATION", "1")
    return env


def skip_reason(out):
    why = [l for l in out.splitlines() if "skipped:" in l or "SKIP" in l]
    return why[-1].split("skipped:", 1)[-1].strip() if why else ""


def run_one(cmd, env, cwd, timeout):
    """(exit status or None on timeout, output, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=env, cwd=cwd, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the test's whole process group (mpirun's ranks too)
        out, _ = p.communicate()
        rc = None
    return rc, out.decode(errors="replace"), time.monotonic() - t0


def main():
    a = parse_args()
    tests_path = os.path.abspath(a.tests)
    build = os.path.abspath(a.build or os.path.dirname(tests_path))
    source = os.path.abspath(a.source or os.path.dirname(build))
    with open(tests_path) as f:
        tests = json.load(f)
    rec_src, rec_build = recorded_roots(tests)
    rec_src, rec_build = a.from_source or rec_src, a.from_build or rec_build
    rw = rewriter([(rec_build, build), (rec_src, source)])
    suites = set(s for s in a.suite.split(",") if s)
    only = set(s for s in a.only.split(",") if s)
    exclude = set(s for s in a.exclude.split(",") if s)
    chosen = [t for t in tests if in_suites(t, suites) and (not only or t["name"] in only)
              and t["name"] not in exclude]
    log_path = a.log or os.path.join(build, "run_suite.log")
    print(f"run_suite: {len(chosen)} test(s) of suite {a.suite}; recorded {rec_src} -> {source}, "
          f"{rec_build} -> {build}; log {log_path}", flush=True)
    if a.list:
        for t in chosen:
            print(t["name"], " ".join(command(t, rw, (source, build))))
        return 0
    start = time.monotonic()
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "NOT RUN": 0}
    rows = []
    with open(log_path, "w") as log:
        for t in chosen:
            name = t["name"]
            left = a.deadline - (time.monotonic() - start) if a.deadline else None
            timeout = float(t.get("timeout") or 30)
            if a.timeout_cap:
                timeout = min(timeout, a.timeout_cap)
            if left is not None and left < 5:
                res, secs, detail = "NOT RUN", 0.0, "past --deadline"
            else:
                if left is not None:
                    timeout = min(timeout, left)
                cmd = command(t, rw, (source, build))
                cwd = rw(t["workdir"]) if t.get("workdir") else None
                missing = [c for c in cmd[:2] if os.path.isabs(c) and not os.path.exists(c)]
                if missing:
                    rc, out, secs = 127, f"not found here: {' '.join(missing)}\n", 0.0
                else:
                    rc, out, secs = run_one(cmd, environment(t, rw), cwd, timeout)
                log.write(f"==== {name}: {' '.join(cmd)}\n{out}\n==== {name}: exit {rc} in {secs:.1f} s\n\n")
                log.flush()
                if rc is None:
                    res, detail = "TIMEOUT", f"killed after {timeout:.0f} s"
                elif rc == 0:
                    res, detail = "PASS", ""
                elif rc == 77:
                    res, detail = "SKIP", skip_reason(out)
                else:
                    res, detail = "FAIL", f"exit {rc}" + (f": {out.strip().splitlines()[-1][:90]}" if out.strip() else "")
            counts[res] += 1
            rows.append((name, res, secs, detail))
            print(f"{name[:34]:34} {res:8} {secs:6.1f} s  {detail[:100]}", flush=True)
    failed = counts["FAIL"] + counts["TIMEOUT"]
    print(f"run_suite: {counts['PASS']} passed, {failed} failed ({counts['TIMEOUT']} timed out), "
          f"{counts['SKIP']} skipped, {counts['NOT RUN']} not run, in {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
