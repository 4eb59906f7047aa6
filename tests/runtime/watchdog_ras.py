#!/usr/bin/python3
"""watchdog_ras.py - NCCL RAS's view in the watchdog's report, end to end on the CPU.

wd-ras (watchdog_ras.c) tells libddp that an NCCL 2.28.9 communicator is open; NCCL_RAS_ADDR
points at a fake RAS service run here (NCCL's side of the client protocol: SERVER PROTOCOL 2, OK to
TIMEOUT, a canned STATUS of 74 non-empty lines, then the connection closed). 2 ranks, DDP_TIMEOUT=2:
  late      rank 1 late for a barrier: the job ends within DDP_TIMEOUT + 10 s, not 0; rank 0's
            report gives the deadline, the wavefront, then RAS's view: its header (NCCL 2.28.9, the
            address), 60 lines prefixed "NCCL RAS | ", "14 more lines left out"; the service was
            asked once: CLIENT PROTOCOL 2, TIMEOUT 1, STATUS
  refused   the same with nobody listening at NCCL_RAS_ADDR: one line saying it could not be asked
            (connection refused), and the job still ends in time
  off       the same with DDP_NCCL_RAS=0: no RAS line, the service never contacted
  survey    every rank calls watchdog_survey (a GPU wait past its deadline): exit 0, rank 0 (the
            lowest that answered) alone asks the service, once, and logs its view

Usage: watchdog_ras.py WD_RAS MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import socket
import subprocess
import sys
import threading
import time

TIMEOUT = 2
STATUS = ("Job summary\n===========\n\n  Nodes  Processes\n      1          2\n\n" +
          "".join(f"fake ras line {i}\n" for i in range(1, 71)))


class FakeRas(threading.Thread):
    """A RAS service on 127.0.0.1: answers every connection as NCCL does; records the commands."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.sessions = []
        self.done = False

    def serve(self, conn):
        commands = []
        self.sessions.append(commands)
        f = conn.makefile("rb")
        for raw in f:
            line = raw.decode().strip()
            commands.append(line)
            if line.startswith("CLIENT PROTOCOL "):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif line.startswith("TIMEOUT "):
                conn.sendall(b"OK\n")
            elif line == "STATUS":
                conn.sendall(STATUS.encode())
                break
        conn.close()

    def run(self):
        while not self.done:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            conn.settimeout(10)
            self.serve(conn)


def refused_port():
    """A port of 127.0.0.1 bound but never listening (connecting is refused); (socket, port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def run(wd_ras, mpirun, mode, env_vars):
    """Runs wd-ras MODE on 2 ranks with env_vars exported; (status, output, seconds)."""
    env = dict(os.environ, DDP_TIMEOUT=str(TIMEOUT), **env_vars)
    exports = [a for v in ["DDP_TIMEOUT"] + list(env_vars) for a in ("-x", v)]
    cmd = mpirun + ["2"] + exports + [wd_ras, mode]
    shown = " ".join(f"{k}={v}" for k, v in env_vars.items())
    print(f"$ {shown} {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = -999, e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    took = time.monotonic() - start
    print("\n".join("  | " + x for x in out.splitlines()), flush=True)
    return rc, out, took


class Checker:
    def __init__(self):
        self.failures = 0

    def check(self, cond, what):
        print(("ok     " if cond else "FAILED ") + what, flush=True)
        self.failures += not cond


def ras_lines(out):
    return [x.split("NCCL RAS | ", 1)[1] for x in out.splitlines() if "NCCL RAS | " in x]


def main():
    wd_ras, mpirun = sys.argv[1], sys.argv[2:]
    chk = Checker()
    limit = TIMEOUT + 10

    fake = FakeRas()
    fake.start()
    addr = f"127.0.0.1:{fake.port}"
    rc, out, took = run(wd_ras, mpirun, "late", {"NCCL_RAS_ADDR": addr})
    chk.check(rc not in (0, -999) and took <= limit,
              f"late: the job ends, not 0 (status {rc}), within {limit} s ({took:.1f} s)")
    head = f"NCCL RAS's view of the job (NCCL 2.28.9, {addr}):"
    order = [out.find(x) for x in ("past its deadline", "where the ranks are", "wavefront (JSON)",
                                   head)]
    chk.check(-1 not in order and order == sorted(order) and out.count(head) == 1,
              f"late: the deadline, the wavefront, then RAS's header once ({order})")
    lines = ras_lines(out)
    want = [x for x in STATUS.splitlines() if x.strip()][:60]
    want.append(f"... 14 more lines left out (all: ncclras -h 127.0.0.1 -p {fake.port})")
    chk.check(lines == want, f"late: 60 lines of RAS's answer and what was left out ({len(lines)})")
    chk.check(fake.sessions == [["CLIENT PROTOCOL 2", "TIMEOUT 1", "STATUS"]],
              f"late: RAS asked once, NCCL's handshake ({fake.sessions})")

    sock, port = refused_port()
    rc, out, took = run(wd_ras, mpirun, "late", {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"})
    sock.close()
    said = [x for x in out.splitlines() if "NCCL RAS" in x]
    chk.check(rc not in (0, -999) and took <= limit, f"refused: the job ends within {limit} s "
              f"(status {rc}, {took:.1f} s)")
    chk.check(len(said) == 1 and f"NCCL RAS (127.0.0.1:{port}) could not be asked: connecting: "
              "Connection refused" in said[0], f"refused: one line says why ({said})")

    fake.sessions.clear()
    rc, out, took = run(wd_ras, mpirun, "late", {"NCCL_RAS_ADDR": addr, "DDP_NCCL_RAS": "0"})
    chk.check(rc not in (0, -999) and "past its deadline" in out and "NCCL RAS" not in out and
              not fake.sessions, f"off: the report without RAS, never asked ({fake.sessions})")

    rc, out, took = run(wd_ras, mpirun, "survey", {"NCCL_RAS_ADDR": addr})
    heads = [x for x in out.splitlines() if head in x]
    chk.check(rc == 0 and len(heads) == 1 and heads[0].startswith("[rank 0 ") and
              len(fake.sessions) == 1 and len(ras_lines(out)) == 61,
              f"survey: rank 0 alone asks RAS and logs its view (status {rc}, {heads}, "
              f"{len(fake.sessions)} session(s))")
    fake.done = True
    if chk.failures:
        print(f"{chk.failures} check(s) failed")
    sys.exit(1 if chk.failures else 0)


if __name__ == "__main__":
    main()
