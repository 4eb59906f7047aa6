#!/usr/bin/python3
"""make_seeds.py - writes the seed corpora of the fuzz harnesses into corpus/NAME/ (committed; run
again after a file format changes). Text seeds are real command lines, environments and node lists;
binary seeds are small valid files in the formats of readers/mnist.c and runtime/checkpoint.c
(versions 1 and 2), with the harnesses' framing (see each fuzz_*.c).

Usage: make_seeds.py [CORPUS_DIR]   (default: corpus/ beside this script)
"""
import gzip
import os
import struct
import sys
import zlib

HOSTLISTS = ["gpu-a[007-009,11],b3", "rack[1-2]-node[01-02]", "n[0-1]-[8-9]", "a[1-2],a[1-2]",
             "node1,node2,node3", "n[000001-000003]", "a[1-2]b", "n[2-1]", "a]", ",a,"]

ENVS = {
    "srun": ["SLURM_PROCID=3", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=1", "SLURM_NODEID=1",
             "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_JOB_ID=42",
             "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n[01-02]", "SLURM_NTASKS_PER_NODE=2",
             "SLURM_GPUS_PER_TASK=1", "CUDA_VISIBLE_DEVICES=1"],
    "mpirun": ["OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
               "OMPI_COMM_WORLD_LOCAL_SIZE=2", "OMPI_MCA_orte_num_nodes=2", "SLURM_JOB_NODELIST=a[1-2]",
               "SLURMD_NODENAME=a1", "OMPI_MCA_ess_base_jobid=123", "CUDA_VISIBLE_DEVICES=0,1,2,3"],
    "hydra": ["PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=2"],
    "torchrun": ["RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                 "MASTER_ADDR=head", "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=x",
                 "CUDA_VISIBLE_DEVICES=GPU-1a2b,MIG-3c4d"],
    "pmix": ["PMIX_RANK=0", "PMIX_NAMESPACE=ns", "@n=2", "@nproc=2", "@share"],
    "local": ["@n=4", "@ntasks=4", "@port=1234", "@addr=127.0.0.1", "CUDA_VISIBLE_DEVICES=0,1"],
}

ARGS = {
    "defaults": [],
    "mlp": ["--model", "mlp", "--widths", "784-512-256-10", "--epochs", "2", "--batch", "32",
            "--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4", "--seed", "7"],
    "cnn": ["--model=cnn", "--accum", "2", "--lr-schedule", "cosine", "--augment", "--device", "cpu",
            "--threads", "2", "--bucket-mb", "4", "--first-bucket-mb", "0.5", "--max-steps", "100"],
    "files": ["--data", "d", "--metrics", "m.jsonl", "--save", "s.ckpt", "--no-shuffle",
              "--broadcast-init", "--log-every", "10", "--tensorboard", "tb", "--prometheus", "p.prom"],
    "bad": ["--lr", "1e308", "--epochs", "9223372036854775808", "-h"],
}


def idx_pair(n, pad=0):
    """The harness framing of fuzz_idx.c: mode byte, u16 images length, images file, labels file
    (mode 1: the images file is only its header; the harness appends the pixels)."""
    images = struct.pack(">IIII", 0x803, n, 28, 28)
    if not pad:
        images += bytes((i * 7) % 256 for i in range(n * 784))
    labels = struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))
    return struct.pack("<BH", pad, len(images)) + images + labels


def idx_pair_gz(n):
    """Mode 2 of fuzz_idx.c: the images and the labels file of idx_pair(n), each gzip'ed."""
    images = struct.pack(">IIII", 0x803, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 784))
    labels = struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))
    images, labels = gzip.compress(images, mtime=0), gzip.compress(labels, mtime=0)
    return struct.pack("<BH", 2, len(images)) + images + labels


def checkpoint(params, mode=0):
    """Mode byte (1: the harness rewrites the CRC) and a version 1 checkpoint of params: [(name, shape)]."""
    recs, total = records(params)
    body = b"DDPCKPT1" + struct.pack("<IIQ", 1, len(params), total) + recs
    body += struct.pack(f"<{total}f", *[0.25 * i for i in range(total)])
    return bytes([mode]) + body + struct.pack("<I", zlib.crc32(body))


def records(params):
    """The 84-byte parameter records and the element total of params: [(name, shape)]."""
    out, total = b"", 0
    for name, shape in params:
        numel = 1
        for d in shape:
            numel *= d
        total += numel
        dims = list(shape) + [0] * (4 - len(shape))
        out += name.encode().ljust(48, b"\0") + struct.pack("<I4q", len(shape), *dims)
    return out, total


def checkpoint_v2(params, extra, mode=0):
    """Mode byte and a version 2 checkpoint: signature, params, then extra [(name, kind, count,
    data)] sections (see runtime/checkpoint.c)."""
    recs, total = records(params)
    sections = [("signature", 1, len(params), recs),
                ("params", 2, total, struct.pack(f"<{total}f", *[0.5 * i for i in range(total)]))] + extra
    table_bytes = 72 * len(sections)
    offset, table, data = 32 + table_bytes, b"", b""
    for name, kind, count, blob in sections:
        table += name.encode().ljust(48, b"\0") + struct.pack("<IIQQ", kind, 0, offset + len(data), count)
        data += blob + b"\0" * (-len(blob) % 8)
    file_bytes = offset + len(data) + 4
    body = b"DDPCKPT1" + struct.pack("<IIQQ", 2, len(sections), file_bytes, 32) + table + data
    return bytes([mode]) + body + struct.pack("<I", zlib.crc32(body))


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    for i, h in enumerate(HOSTLISTS):
        write(os.path.join(root, "hostlist"), f"list{i}", h)
    for name, lines in ENVS.items():
        write(os.path.join(root, "launch_env"), name, "\n".join(lines))
    for name, args in ARGS.items():
        write(os.path.join(root, "train_opts"), name, "\n".join(args))
    write(os.path.join(root, "idx"), "two", idx_pair(2))
    write(os.path.join(root, "idx"), "empty", idx_pair(0))
    write(os.path.join(root, "idx"), "ten_padded", idx_pair(10, pad=1))
    write(os.path.join(root, "idx"), "two_gz", idx_pair_gz(2))
    write(os.path.join(root, "checkpoint"), "one", checkpoint([("w", (3,))]))
    write(os.path.join(root, "checkpoint"), "mlp", checkpoint([("fc1.weight", (4, 3)), ("fc1.bias", (4,)),
                                                              ("scalar", ())]))
    state = [("momentum", 2, 3, struct.pack("<3f", 1, 2, 3)), ("step", 3, 1, struct.pack("<Q", 7)),
             ("loss_scale", 4, 1, struct.pack("<d", 65536.0)), ("config.world_size", 5, 1, b"2")]
    write(os.path.join(root, "checkpoint"), "v2_state", checkpoint_v2([("w", (3,))], state, mode=1))
    # A name one byte short of the 48-byte field, behind a CRC the harness keeps valid.
    write(os.path.join(root, "checkpoint"), "long_name", checkpoint([("n" * 47, (2, 1, 1, 2))], mode=1))


if __name__ == "__main__":
    main()
