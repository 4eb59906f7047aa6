#!/usr/bin/python3
"""dashboards.py - ddp-train's --tensorboard and --prometheus, read back by their own readers.

Modes:
  tensorboard  2 ranks, MNIST MLP (2 epochs) and the tiny GPT (6 steps, validation every 3): one
               event file per run, named events.out.tfevents.<time>.<host>.<pid>; every record's
               length and data CRC-32C (masked, TFRecord framing) checked with python3-crc32c;
               every event decoded by python3-protobuf from runtime/tb_event.proto (compiled here
               by protoc), whose field numbers must be TensorBoard's, and re-encoded to the same
               bytes; the first event is the version, the second a SessionLog START at step 0 (at
               the resumed step for a resumed run); the scalars equal what the run printed and
               wrote to --metrics at the same steps: MNIST's loss of each progress line, epoch
               loss and test accuracy, the learning rate; the GPT's loss, gradient norm, learning
               rate and validation loss, its MFU (--peak-tflops 1) and peak memory.
  prometheus   2 ranks, MNIST MLP, --prometheus FILE under SLURM_JOB_ID=4242: the file as read
               while the run goes on is always whole (every version seen passes promtool), and
               it is updated during the run (at most once a second: several steps seen; the
               unit test tests/runtime/test_metrics.c reads 300 rewrites); at the end `promtool check
               metrics` finds nothing to say, every gauge has its HELP and TYPE and the label
               slurm_job_id="4242", ddp_step is the last step, ddp_world_size 2, the loss the last
               progress line's, the test accuracy the summary's; no temporary file is left.
  bad_input    an uncreatable folder, a folder where the file goes, a device, a missing folder,
               empty values: exit 1 on every rank within seconds, the flag and the path named,
               before any training step; with DDP_TEST_TENSORBOARD=0 (a libddp built without
               protobuf-c) --tensorboard is refused naming the packages to install.

Usage: dashboards.py MODE DDP_TRAIN MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gpt_train  # noqa: E402  (the tiny GPT's synthetic shards and flags)
import trainlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "runtime", "tb_event.proto")
# TensorBoard's own field numbers (tensorflow/tensorboard: tensorboard/compat/proto/event.proto,
# summary.proto): the .proto that ddp compiles must keep them, or TensorBoard reads nothing.
UPSTREAM_FIELDS = {
    "Event": {"wall_time": 1, "step": 2, "file_version": 3, "summary": 5, "session_log": 7},
    "SessionLog": {"status": 1, "checkpoint_path": 2, "msg": 3},
    "Summary": {"value": 1},
    "Summary.Value": {"tag": 1, "simple_value": 2},
}
MNIST_STEPS_PER_EPOCH = 30  # 480 samples / (2 ranks x batch 8)
PROGRESS = re.compile(r"^step (\d+)/\d+ epoch \d+ loss ([0-9.]+)", re.M)


def need(module_or_cmd, package):
    """Fails (never skips) naming the Debian package when a reader is missing."""
    print(f"FAILED: {module_or_cmd} is missing: apt-get install {package} (scripts/install-deps.sh "
          "test) and test again")
    sys.exit(1)


def close(a, b, rel=1e-6, abs_=1e-6):
    return abs(a - b) <= abs_ + rel * abs(b)


# ---- TensorBoard ------------------------------------------------------------------------------

def compile_proto(tmp):
    """tb_event_pb2 from runtime/tb_event.proto, compiled by protoc into tmp."""
    if not shutil.which("protoc"):
        need("protoc", "protobuf-compiler")
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        need("python3 module google.protobuf", "python3-protobuf")
    subprocess.run(["protoc", "--proto_path=" + os.path.dirname(PROTO), "--python_out=" + tmp, PROTO],
                   check=True)
    sys.path.insert(0, tmp)
    import tb_event_pb2
    return tb_event_pb2


def masked_crc(data):
    """TFRecord's masked CRC-32C, from python3-crc32c (another implementation than libddp's)."""
    try:
        import crc32c
    except ImportError:
        need("python3 module crc32c", "python3-crc32c")
    crc = crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    """The records of an event file and the framing errors found (CRCs, torn ends)."""
    data = open(path, "rb").read()
    records, errors, at = [], [], 0
    while at < len(data) and not errors:
        if len(data) - at < 12:
            errors.append(f"{len(data) - at} bytes at {at}: a torn header")
            break
        n, len_crc = struct.unpack_from("<QI", data, at)
        if len_crc != masked_crc(data[at:at + 8]):
            errors.append(f"record at {at}: length CRC {len_crc:#x} is wrong")
        if at + 12 + n + 4 > len(data):
            errors.append(f"record at {at}: {n} bytes announced, the file ends first")
            break
        body = data[at + 12:at + 12 + n]
        (data_crc,) = struct.unpack_from("<I", data, at + 12 + n)
        if data_crc != masked_crc(body):
            errors.append(f"record at {at}: data CRC {data_crc:#x} is wrong")
        records.append(body)
        at += 12 + n + 4
    return records, errors


def check_fields(chk, pb2):
    """The compiled .proto keeps TensorBoard's names and field numbers."""
    wrong = []
    for msg, fields in UPSTREAM_FIELDS.items():
        desc = pb2.DESCRIPTOR.message_types_by_name[msg.split(".")[0]]
        if "." in msg:
            desc = desc.nested_types_by_name[msg.split(".")[1]]
        for name, number in fields.items():
            f = desc.fields_by_name.get(name)
            if f is None or f.number != number:
                wrong.append(f"{msg}.{name}: {f.number if f else 'missing'} (TensorBoard: {number})")
    start = pb2.SessionLog.SessionStatus.Value("START")
    chk.check(not wrong and start == 1 and pb2.DESCRIPTOR.package == "tensorboard",
              "tb_event.proto: package, names and field numbers are TensorBoard's", "\n".join(wrong))


def read_events(chk, pb2, folder, what):
    """The events of the one event file in folder, checked: name, CRCs, decoding, first events."""
    files = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
    chk.check(len(files) == 1, f"{what}: one event file in {folder}", str(files))
    if not files:
        return []
    name = os.path.basename(files[0])
    host = re.escape(socket.gethostname())
    chk.check(re.fullmatch(rf"events\.out\.tfevents\.\d{{10}}\.{host}\.\d+", name) is not None,
              f"{what}: named events.out.tfevents.<time>.<host>.<pid> ({name})")
    records, errors = read_records(files[0])
    chk.check(not errors and len(records) > 3,
              f"{what}: {len(records)} records, every length and data CRC-32C right", "\n".join(errors))
    events, same = [], True
    for body in records:
        ev = pb2.Event()
        ev.ParseFromString(body)
        same = same and ev.SerializeToString() == body  # nothing unknown, nothing extra
        events.append(ev)
    chk.check(same, f"{what}: every event decodes and re-encodes to its own bytes")
    return events


def check_head(chk, pb2, events, start_step, what):
    """Event 0: the version; event 1: a SessionLog START at start_step, before any scalar."""
    ok = len(events) > 2 and events[0].WhichOneof("what") == "file_version" and \
        events[0].file_version == "brain.Event:2" and events[1].WhichOneof("what") == "session_log" \
        and events[1].session_log.status == pb2.SessionLog.START and events[1].step == start_step
    now = time.time()
    chk.check(ok and all(now - 600 < e.wall_time <= now + 1 for e in events),
              f"{what}: file version brain.Event:2, then SessionLog START at step {start_step}; wall "
              "times are now", str(events[:2]))


def scalars(events):
    """{tag: {step: value}} of the summary events."""
    out = {}
    for e in events:
        if e.WhichOneof("what") == "summary":
            for v in e.summary.value:
                out.setdefault(v.tag, {})[e.step] = v.simple_value
    return out


def mnist_run(chk, pb2, train, mpi, tmp):
    data = os.path.join(tmp, "data")
    trainlib.write_dataset(data, 480, 60)
    tb, metrics = os.path.join(tmp, "tb_mlp"), os.path.join(tmp, "mlp.jsonl")
    args = ["--model", "mlp", "--data", data, "--batch", "8", "--lr", "0.05", "--device", "cpu",
            "--log-every", "5", "--metrics", metrics, "--tensorboard", tb,
            "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--checkpoint-every", "30"]
    rc, out = trainlib.run(mpi + ["2", train, "--epochs", "2"] + args, timeout=180)
    chk.check(rc == 0, f"mlp: training exits 0 (status {rc})", out)
    events = read_events(chk, pb2, tb, "mlp")
    check_head(chk, pb2, events, 0, "mlp")
    s = scalars(events)
    progress = {int(a): float(b) for a, b in PROGRESS.findall(out)}
    loss = s.get("train/loss", {})
    chk.check(progress and set(loss) == set(progress) and
              all(abs(loss[k] - v) <= 6e-5 for k, v in progress.items()),
              f"mlp: train/loss at each progress line's step ({len(progress)}) equals its loss",
              f"tb {loss}\nprinted {progress}")
    epochs = [json.loads(x) for x in open(metrics) if '"epoch"' in x and '"data_step"' not in x]
    want_loss = {MNIST_STEPS_PER_EPOCH * (e["epoch"] + 1): e["train_loss"] for e in epochs}
    want_acc = {MNIST_STEPS_PER_EPOCH * (e["epoch"] + 1): e["test_accuracy"] for e in epochs}
    got_loss, got_acc = s.get("train/epoch_loss", {}), s.get("eval/test_accuracy", {})
    chk.check(len(epochs) == 2 and set(got_loss) == set(want_loss) and
              all(close(got_loss[k], v) for k, v in want_loss.items()) and set(got_acc) == set(want_acc)
              and all(close(got_acc[k], v) for k, v in want_acc.items()),
              "mlp: train/epoch_loss and eval/test_accuracy equal --metrics' epoch lines at their steps",
              f"tb {got_loss} {got_acc}\nmetrics {want_loss} {want_acc}")
    lr, rate = s.get("train/learning_rate", {}), s.get("train/samples_per_second", {})
    chk.check(set(lr) == set(progress) and all(close(v, 0.05) for v in lr.values()) and
              set(rate) == set(progress) and all(v > 0 for v in rate.values()) and
              s.get("world_size") == {0: 2.0} and "train/grad_norm" not in s,
              "mlp: learning_rate 0.05 and samples_per_second > 0 at each progress step, world_size "
              "2 at step 0, no gradient norm (MNIST computes none)", str({k: s[k] for k in s}))
    # resumed from the step-60 checkpoint for 20 more steps: a second file, START at step 60
    rc, out = trainlib.run(mpi + ["2", train, "--epochs", "3", "--max-steps", "80", "--resume", "auto"]
                           + args, timeout=180)
    chk.check(rc == 0, f"mlp resumed: exit status {rc}", out)
    files = sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*")), key=os.path.getmtime)
    chk.check(len(files) == 2, "mlp resumed: a second event file beside the first", str(files))
    if len(files) == 2:
        records, errors = read_records(files[1])
        events = [pb2.Event.FromString(r) for r in records]
        check_head(chk, pb2, events, 60, "mlp resumed")
        steps = sorted(scalars(events).get("train/loss", {}))
        chk.check(not errors and steps and steps[0] > 60 and steps[-1] == 80,
                  f"mlp resumed: its losses from step 61 to 80 ({steps})", "\n".join(errors))


def gpt_run(chk, pb2, train, mpi, tmp):
    data = gpt_train.write_data(tmp)
    tb, metrics = os.path.join(tmp, "tb_gpt"), os.path.join(tmp, "gpt.jsonl")
    cmd = mpi + ["2"] + gpt_train.tiny(train, data, 6, ["--val-every", "3", "--peak-tflops", "1",
                                                        "--metrics", metrics, "--tensorboard", tb])
    rc, out = trainlib.run(cmd, timeout=300)
    chk.check(rc == 0, f"gpt: training exits 0 (status {rc})", out)
    events = read_events(chk, pb2, tb, "gpt")
    check_head(chk, pb2, events, 0, "gpt")
    s = scalars(events)
    lines = [json.loads(x) for x in open(metrics) if '"data_step"' not in x] if rc == 0 else []
    steps = [x for x in lines if "step" in x and "val_loss" not in x]
    vals = [x for x in lines if "val_loss" in x and "summary" not in x]
    loss, norm = s.get("train/loss", {}), s.get("train/grad_norm", {})
    chk.check(len(steps) == 6 and all(close(loss.get(x["step"], -1), x["train_loss"]) and
                                      close(norm.get(x["step"], -1), x["grad_norm"]) for x in steps),
              "gpt: train/loss and train/grad_norm equal --metrics' lines at steps 1 to 6",
              f"tb {loss} {norm}\nmetrics {steps}")
    val, lr = s.get("eval/val_loss", {}), s.get("train/learning_rate", {})
    chk.check(len(vals) == 2 and all(close(val.get(x["step"], -1), x["val_loss"]) and
                                     close(lr.get(x["step"], -1), x["lr"]) for x in vals),
              "gpt: eval/val_loss and train/learning_rate equal the validation lines at steps 3 and 6",
              f"tb {val} {lr}\nmetrics {vals}")
    mfu, rss = s.get("train/mfu_ratio", {}), s.get("memory/peak_rss_bytes", {})
    summary = lines[-1] if lines else {}
    chk.check(set(mfu) == set(range(1, 7)) and all(0 < v < 1 for v in mfu.values()) and
              set(rss) == {6} and close(rss[6] / 2 ** 20, summary.get("mem_peak_rss_max_mib", -1), 0, 0.006),
              "gpt: train/mfu_ratio in (0, 1) at every step; memory/peak_rss_bytes at the end, the "
              "summary's mem_peak_rss_max_mib", f"{mfu} {rss} {summary}")
    chk.check(all(v > 0 for v in s.get("train/tokens_per_second", {0: 0}).values()),
              "gpt: train/tokens_per_second > 0")


def tensorboard(chk, train, mpi, tmp):
    pb2 = compile_proto(tmp)
    check_fields(chk, pb2)
    mnist_run(chk, pb2, train, mpi, tmp)
    gpt_run(chk, pb2, train, mpi, tmp)


# ---- Prometheus ------------------------------------------------------------------------------

def promtool(text):
    """(exit status, output) of promtool check metrics on text."""
    p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return p.returncode, p.stdout


def watch(path, seen, stop):
    """Collects every distinct content of path until stop is set (the reads a scraper makes)."""
    while not stop.is_set():
        try:
            with open(path) as f:
                seen.add(f.read())
        except FileNotFoundError:
            pass
        time.sleep(0.002)


def gauges(text):
    """{name: (labels, value)} of the samples, and the names with HELP and with TYPE gauge."""
    samples = dict((m[0], (m[1], float(m[2]))) for m in
                   re.findall(r"^([a-z_]+)\{(.*)\} (\S+)$", text, re.M))
    helps = set(re.findall(r"^# HELP (\S+) \S", text, re.M))
    types = set(re.findall(r"^# TYPE (\S+) gauge$", text, re.M))
    return samples, helps, types


def prometheus(chk, train, mpi, tmp):
    if not shutil.which("promtool"):
        need("promtool", "prometheus")
    data = os.path.join(tmp, "data")
    trainlib.write_dataset(data, 480, 60)
    folder = os.path.join(tmp, "textfile")
    os.makedirs(folder)
    prom, metrics = os.path.join(folder, "ddp.prom"), os.path.join(tmp, "m.jsonl")
    cmd = mpi + ["2", train, "--model", "mlp", "--data", data, "--epochs", "3", "--batch", "8",
                 "--device", "cpu", "--log-every", "2", "--metrics", metrics, "--prometheus", prom]
    seen, stop = set(), threading.Event()
    watcher = threading.Thread(target=watch, args=(prom, seen, stop))
    watcher.start()
    rc, out = trainlib.run(cmd, timeout=180, env=dict(os.environ, SLURM_JOB_ID="4242"))
    stop.set()
    watcher.join()
    chk.check(rc == 0, f"training exits 0 (status {rc})", out)
    bad = [(t, promtool(t)) for t in seen]
    bad = [(t, r) for t, r in bad if r[0] != 0 or "ddp_world_size{" not in t or not t.endswith("\n")]
    steps = {gauges(t)[0].get("ddp_step", ("", -1))[1] for t in seen}
    chk.check(not bad, f"every one of the {len(seen)} versions read during the run is whole (passes "
              "promtool, ends with its last gauge's line)",
              "\n".join(f"{o}\n---\n{t}" for t, (_, o) in bad[:2]))
    chk.check(len(steps) >= 2, f"the file was updated during the run (ddp_step seen: {sorted(steps)})")
    text = open(prom).read() if os.path.exists(prom) else ""
    prc, pout = promtool(text)
    chk.check(prc == 0 and pout.strip() == "", "promtool check metrics: no complaint", pout + text)
    samples, helps, types = gauges(text)
    chk.check(samples and set(samples) == helps == types and
              all(lab == 'slurm_job_id="4242"' for lab, _ in samples.values()),
              "every gauge has HELP, TYPE gauge and the label slurm_job_id=\"4242\"", text)
    progress = {int(a): float(b) for a, b in PROGRESS.findall(out)}
    summary = [json.loads(x) for x in open(metrics) if '"summary"' in x] if rc == 0 else [{}]
    last = max(progress) if progress else -1
    get = lambda name: samples.get(name, ("", float("nan")))[1]  # noqa: E731
    chk.check(last == 3 * MNIST_STEPS_PER_EPOCH and get("ddp_step") == last and
              get("ddp_world_size") == 2 and abs(get("ddp_train_loss") - progress.get(last, -1)) <= 6e-5
              and close(get("ddp_eval_test_accuracy"), summary[-1].get("test_accuracy", -1)) and
              close(get("ddp_train_learning_rate"), 0.05) and get("ddp_train_samples_per_second") > 0,
              "values: ddp_step the last step, world size 2, the last progress line's loss, the "
              "summary's test accuracy, learning rate 0.05, a throughput", text)
    left = [f for f in os.listdir(folder) if f != "ddp.prom"]
    chk.check(not left, f"no temporary file left beside it ({left})")


# ---- bad input -------------------------------------------------------------------------------

def bad_input(chk, train, mpi, tmp):
    data = os.path.join(tmp, "data")
    trainlib.write_dataset(data, 480, 60)
    a_file = os.path.join(tmp, "a_file")
    open(a_file, "w").close()
    tb_bad = ["--tensorboard " + a_file + "/tb: cannot create the folder: Not a directory"]
    if os.environ.get("DDP_TEST_TENSORBOARD") == "0":  # a libddp built without protobuf-c
        tb_bad = ["built without TensorBoard event files", "apt-get install libprotobuf-c-dev "
                  "protobuf-c-compiler libisal-dev"]
    cases = [
        (["--tensorboard", os.path.join(a_file, "tb")], tb_bad),
        (["--tensorboard", ""], ["--tensorboard is empty"]),
        (["--prometheus", data], ["--prometheus " + data + " is a folder"]),
        (["--prometheus", "/dev/null"], ["--prometheus /dev/null is a character device"]),
        (["--prometheus", os.path.join(tmp, "none", "x.prom")],
         ["--prometheus " + os.path.join(tmp, "none", "x.prom") + ": cannot write into the folder"]),
        (["--prometheus", ""], ["--prometheus  is empty"]),
    ]
    for extra, words in cases:
        what = " ".join(extra) or "empty"
        start = time.monotonic()
        rc, out = trainlib.run(mpi + ["2", train, "--model", "mlp", "--data", data, "--epochs", "1",
                                      "--batch", "8", "--device", "cpu", "--log-every", "1"] + extra,
                               timeout=120)
        took = time.monotonic() - start
        chk.check(rc == 1 and took < 30, f"{what}: exit 1 within seconds ({rc}, {took:.1f} s)", out)
        chk.check(all(w in out for w in words), f"{what}: the message names the flag and the problem",
                  out)
        chk.check(not PROGRESS.search(out), f"{what}: refused before any training step", out)


def main():
    mode, train, mpi = sys.argv[1], sys.argv[2], sys.argv[3:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-dash-") as tmp:
        {"tensorboard": tensorboard, "prometheus": prometheus, "bad_input": bad_input}[mode](
            chk, train, mpi, tmp)
    chk.done()


if __name__ == "__main__":
    main()
