#!/usr/bin/python3
"""gpt_init.py - a GPT-2's ddp checkpoint used as a model: ddp-train --init-from CKPT (weights only)
and ddp-ckpt export-llmc CKPT OUT.bin (llm.c's file without a training run).

Modes:
  init_from    a tiny GPT trained 4 steps at 2 ranks (--save FILE, and a checkpoint folder); a new
               run --init-from each (the file at 2 ranks, the folder at 1), 1 step at lr 1e-12: its
               parameters are the saved ones (ddp-ckpt diff, to 1e-6; a fresh start differs: the
               negative control), and so is the validation loss at 2 ranks; it counts from step 0
               (its checkpoint says step 1, not 5), says where the weights came from and that the
               optimizer state and step were not; the checkpoint's sizes win over --layers, with a
               note. Refused with the fix: an MNIST checkpoint
               (not a GPT-2's), --init-from with --model mlp (names --resume).
  export_llmc  ddp-ckpt export-llmc from the checkpoint file and from the folder writes the very
               bytes --save-llmc wrote for the same weights; refused with a clear message: a
               checkpoint of another model, an llm.c file as input, an output that is a folder, in
               a missing folder, or the checkpoint itself; a folder with a corrupt byte (written
               with --no-verify); --help lists the command.

Usage: gpt_init.py MODE DDP_TRAIN DDP_CKPT MPIRUN MPIRUN_ARGS... (the last of which is -np)
"""
import os
import re
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import trainlib  # noqa: E402
from gpt_train import tiny, val_loss, write_data  # noqa: E402

STEPS = 4


def trained(chk, exe, mpi, tmp, extra=()):
    """A tiny GPT trained STEPS steps at 2 ranks: its --save file, its checkpoint folder (the same
    weights), the --save-llmc file and the output."""
    data = write_data(tmp)
    ckpt, llmc, cdir = (os.path.join(tmp, n) for n in ("trained.ckpt", "trained.bin", "ckpts"))
    rc, out = trainlib.run(mpi + ["2"] + tiny(exe, data, STEPS, [
        "--save", ckpt, "--save-llmc", llmc, "--checkpoint-dir", cdir, "--checkpoint-format", "folder",
        *extra]), timeout=300)
    folder = os.path.join(cdir, f"step-{STEPS:012d}.ckpt")
    chk.check(rc == 0 and os.path.isfile(ckpt) and os.path.isfile(llmc)
              and os.path.isfile(os.path.join(folder, "MANIFEST")),
              f"a tiny GPT trained {STEPS} steps: --save file, --save-llmc file, checkpoint folder", out)
    return data, ckpt, folder, llmc, out


def mnist_ckpt(chk, exe, tmp):
    """A one-step MLP checkpoint (a ddp checkpoint of another model)."""
    folder = os.path.join(tmp, "mnist")
    trainlib.write_dataset(folder, 64, 16)
    return trainlib.train_save(chk, tmp, "mlp", [exe, "--model", "mlp", "--data", folder, "--widths",
                                                 "784-16-10", "--batch", "8", "--max-steps", "1",
                                                 "--device", "cpu"])


def step_of(chk, ckpt, path):
    rc, out = trainlib.run([ckpt, "show", path], timeout=60)
    m = re.search(r"^\s*step = (\d+)$", out, re.M)
    chk.check(rc == 0 and m is not None, f"ddp-ckpt show {path}: a step", out)
    return int(m.group(1)) if m else None


def init_from(chk, exe, ckpt, mpi, tmp):
    data, saved, folder, _, out = trained(chk, exe, mpi, tmp)
    saved_loss = val_loss(out)
    still = ["--lr", "1e-12", "--warmup-steps", "0"]  # one step that leaves the weights as they are
    # the file at 2 ranks, as trained: --val-max-batches caps the batches per rank, so the
    # validation covers the same tokens only at the same world size; the folder of 2 ranks' files
    # at 1 process (it reads both files)
    for src, ranks, what in ((saved, mpi + ["2"], "file"), (folder, [], "folder")):
        args = tiny(exe, data, 1, ["--init-from", src] + still)
        args[args.index("--layers") + 1] = "3"  # the checkpoint's 2 layers win
        name = f"from_{what}"
        rc, out = trainlib.run(ranks + args + ["--save", os.path.join(tmp, name + ".ckpt")], timeout=300)
        chk.check(rc == 0, f"--init-from the checkpoint {what}: exit {rc}", out)
        chk.check(f"--layers is ignored: with --init-from {src}" in out and "L 2, heads 2, channels 64" in out,
                  f"--init-from a {what}: the checkpoint's sizes win over --layers 3, with a note", out)
        chk.check(f"the weights come from the ddp checkpoint {what} {src} at step {STEPS}" in out
                  and "optimizer state and step were not restored" in out,
                  f"--init-from a {what}: the start-up line names the step and what was not restored", out)
        chk.check("step 1/1" in out,
                  f"--init-from a {what}: the run counts from step 0 (step 1/1 is its only step)", out)
        new = os.path.join(tmp, name + ".ckpt")
        chk.check(step_of(chk, ckpt, new) == 1, f"--init-from a {what}: its checkpoint says step 1, not {STEPS + 1}")
        trainlib.diff_ckpt(chk, ckpt, saved, new, True, f"--init-from a {what}: the saved weights", "1e-6")
        b = val_loss(out)
        chk.check(not ranks or (saved_loss is not None and b is not None and abs(saved_loss - b) < 1e-3),
                  f"--init-from a {what}: the validation loss is the saved model's ({saved_loss} then {b})")
    fresh = trainlib.train_save(chk, tmp, "fresh", tiny(exe, data, 1, still))
    trainlib.diff_ckpt(chk, ckpt, saved, fresh, False, "a fresh start (no --init-from) differs", "1e-6")
    other = mnist_ckpt(chk, exe, tmp)
    rc, out = trainlib.run(tiny(exe, data, 1, ["--init-from", other]), timeout=120)
    chk.check(rc not in (0, -999) and "not of a GPT-2" in out and "--resume" in out and "step 1/" not in out,
              f"--init-from an MLP checkpoint: refused, naming --resume (exit {rc})", out)
    rc, out = trainlib.run([exe, "--model", "mlp", "--data", os.path.join(tmp, "mnist"), "--init-from", other,
                            "--device", "cpu"], timeout=120)
    chk.check(rc not in (0, -999) and f"--resume {other}" in out,
              f"--model mlp --init-from: refused, naming --resume (exit {rc})", out)


def corrupt_folder(chk, ckpt, folder, tmp):
    """A corrupt byte in a shard file: export-llmc refuses the folder naming the file, and writes
    from it with --no-verify."""
    bad = os.path.join(tmp, "corrupt_folder")
    shutil.copytree(folder, bad)
    victim = os.path.join(bad, "rank-00001-of-00002.ckpt")
    with open(victim, "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0x40]))
    out_path = os.path.join(tmp, "from_corrupt.bin")
    rc, out = trainlib.run([ckpt, "export-llmc", bad, out_path], timeout=120)
    chk.check(rc == 2 and f"checksum mismatch: {victim}" in out and not os.path.exists(out_path),
              "export-llmc: a corrupt folder is refused naming the file, nothing written", out)
    rc, out = trainlib.run([ckpt, "export-llmc", "--no-verify", bad, out_path], timeout=120)
    chk.check(rc == 0 and os.path.isfile(out_path), "export-llmc --no-verify writes from it", out)


def export_llmc(chk, exe, ckpt, mpi, tmp):
    _, saved, folder, llmc, _ = trained(chk, exe, mpi, tmp)
    with open(llmc, "rb") as f:
        want = f.read()
    for src, what in ((saved, "file"), (folder, "folder")):
        out_path = os.path.join(tmp, f"export_{what}.bin")
        rc, out = trainlib.run([ckpt, "export-llmc", src, out_path], timeout=120)
        chk.check(rc == 0 and f"at step {STEPS}" in out, f"export-llmc from the checkpoint {what}: exit {rc}", out)
        got = open(out_path, "rb").read() if os.path.exists(out_path) else b""
        chk.check(got == want, f"export-llmc from the checkpoint {what}: the bytes --save-llmc wrote "
                  f"({len(got)} and {len(want)} bytes)")
    other = mnist_ckpt(chk, exe, tmp)
    os.makedirs(os.path.join(tmp, "a_folder"))
    for args, words, what in (
            ([other, os.path.join(tmp, "x.bin")], ["not of a GPT-2"], "a checkpoint of an MLP"),
            ([llmc, os.path.join(tmp, "x.bin")], ["not a ddp checkpoint"], "an llm.c file as input"),
            ([saved, os.path.join(tmp, "a_folder")], ["is a folder"], "an output that is a folder"),
            ([saved, os.path.join(tmp, "none", "x.bin")], ["cannot write into the folder"],
             "an output in a missing folder"),
            ([saved, saved], ["is the checkpoint"], "the checkpoint as its own output"),
            ([saved], ["export-llmc needs"], "one argument")):
        rc, out = trainlib.run([ckpt, "export-llmc"] + args, timeout=60)
        chk.check(rc == 2 and all(w in out for w in words), f"export-llmc {what}: exit 2, says {words}", out)
    chk.check(not os.path.exists(os.path.join(tmp, "x.bin")), "a refused export writes nothing")
    corrupt_folder(chk, ckpt, folder, tmp)
    chk.check(step_of(chk, ckpt, saved) == STEPS, "the checkpoint is intact after being named as the output")
    rc, out = trainlib.run([ckpt, "--help"], timeout=60)
    chk.check(rc == 0 and "export-llmc" in out, "ddp-ckpt --help lists export-llmc", out)


def main():
    mode, exe, ckpt, mpi = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    chk = trainlib.Checker()
    with tempfile.TemporaryDirectory(prefix="ddp-gpt-init-") as tmp:
        {"init_from": init_from, "export_llmc": export_llmc}[mode](chk, exe, ckpt, mpi, tmp)
    chk.done()


if __name__ == "__main__":
    main()
