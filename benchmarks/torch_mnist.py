#!/usr/bin/python3
"""torch_mnist.py - the peer of ddp-train in benchmarks/precision.sh: the same MLP (784-512-256-10)
or CNN (conv 1->20 5x5 pad 2, ReLU, 2x2 max-pool, conv 20->20 5x5 pad 2, ReLU, pool, fc 980->10)
trained data-parallel with PyTorch (DistributedDataParallel over gloo), SGD lr 0.05 momentum 0.9
with a cosine decay, batch 64 per rank, 1 thread per rank, on the same MNIST IDX files and the same
normalisation. --precision bf16 runs the forward pass under torch.autocast("cpu", torch.bfloat16)
(oneDNN's bf16 kernels in Debian's PyTorch), as PyTorch users do; fp32 does not.

Prints one JSON line: samples/s over the training steps (all ranks' samples over the time spent in
them, evaluation excluded, as ddp-train's summary) and the test accuracy after the last epoch.

DDP_CPU_ISA=baseline|avx2|avx512 caps PyTorch as it caps ddp (common/cpu_isa.h), so that both run
the same class of kernels: below the CPU's own level this script sets, before torch is imported,
ONEDNN_MAX_CPU_ISA (oneDNN, PyTorch's too), ATEN_CPU_CAPABILITY (ATen's vectorised kernels) and
OPENBLAS_CORETYPE (the BLAS behind nn.Linear; replacing a preset, as ddp's cap does). The JSON says
what it set ("caps"). --describe prints one line instead of training: what PyTorch runs here (its
version, the caps, ATen's CPU capability, OpenBLAS's core and the oneDNN implementations of one
training step of the model, from ONEDNN_VERBOSE in a child process).

Usage: torch_mnist.py --data DIR --model mlp|cnn --precision fp32|bf16 [--ranks 2] [--epochs 2]
                      [--max-steps N]
       torch_mnist.py --model mlp|cnn --precision fp32|bf16 --describe
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

# DDP_CPU_ISA level -> (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, OPENBLAS_CORETYPE), as ddp sets them.
ISA_CAPS = {"baseline": ("SSE41", "default", "Prescott"), "avx2": ("AVX2", "avx2", "Haswell"),
            "avx512": ("AVX512_CORE", "avx512", "SkylakeX")}
LEVELS = ("baseline", "avx2", "avx512", "native")


def cpu_level():
    """The CPU's DDP_CPU_ISA level from /proc/cpuinfo's flags ("native" with AVX-512 bf16)."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((l for l in f if l.startswith("flags")), ":").split(":", 1)[1].split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "native" if flags & {"avx512_bf16", "amx_bf16"} else "avx512"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else "baseline"


def apply_isa_cap():
    """Sets the caps of DDP_CPU_ISA when it is below the CPU's level; returns what was set."""
    cap = os.environ.get("DDP_CPU_ISA", "") or "native"
    if cap not in LEVELS:
        sys.exit(f"torch_mnist: DDP_CPU_ISA={cap}: use one of {', '.join(LEVELS)}")
    if cap == "native" or LEVELS.index(cap) >= LEVELS.index(cpu_level()):
        return {}
    names = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE")
    caps = dict(zip(names, ISA_CAPS[cap]))
    os.environ.update(caps)
    return caps


CAPS = apply_isa_cap()  # before torch loads oneDNN and OpenBLAS

import torch  # noqa: E402 (after the caps, which must be in the environment first)


def no_bf16_kernels(precision):
    """bf16 capped below AVX-512: oneDNN 2.6 has no bf16 kernels there. On such a CPU PyTorch sees no
    AVX-512 bf16 support and runs bf16 in ATen; capped on an AVX-512 CPU it would still ask oneDNN,
    which refuses ("could not create a primitive descriptor iterator"). So oneDNN is switched off for
    that run, as PyTorch does itself on such a CPU."""
    off = precision == "bf16" and CAPS.get("ONEDNN_MAX_CPU_ISA") in ("SSE41", "AVX2")
    if off:
        torch.backends.mkldnn.enabled = False
    return off
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def read_idx(path):
    with open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(dims)


def load(data, split):
    x = read_idx(os.path.join(data, f"{split}-images-idx3-ubyte")).float().div(255.0)
    y = read_idx(os.path.join(data, f"{split}-labels-idx1-ubyte")).long()
    return ((x - 0.1307) / 0.3081).unsqueeze(1), y


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 512), nn.Linear(512, 256), nn.Linear(256, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5, padding=2), nn.Conv2d(20, 20, 5, padding=2)
        self.fc1 = nn.Linear(980, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc1(x.flatten(1))


def train(rank, args, port, out):
    torch.set_num_threads(1)
    no_bf16_kernels(args.precision)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks)
    x, y = load(args.data, "train")
    xt, yt = load(args.data, "t10k")
    model = nn.parallel.DistributedDataParallel(Mlp() if args.model == "mlp" else Cnn())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(range(len(y)), args.ranks, rank,
                                                              seed=args.seed)
    steps_per_epoch = len(sampler) // 64
    total = steps_per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)  # as ddp-train --max-steps: the schedule spans these
    bf16 = args.precision == "bf16"
    step, seconds = 0, 0.0
    for epoch in range(args.epochs):
        if step == total:
            break
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        for s in range(min(steps_per_epoch, total - step)):
            b = idx[s * 64:(s + 1) * 64]
            xb, yb = x[b], y[b]
            start = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = 0.05 * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(xb)
            loss = F.cross_entropy(logits.float(), yb)
            loss.backward()
            opt.step()
            seconds += time.perf_counter() - start
            step += 1
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        mine = torch.arange(rank, len(yt), args.ranks)
        for i in range(0, len(mine), 500):
            b = mine[i:i + 500]
            correct += int((model(xt[b]).float().argmax(1) == yt[b]).sum())
    stats = torch.tensor([float(correct), seconds])
    dist.all_reduce(stats)
    if rank == 0:
        out.put({"framework": "pytorch " + torch.__version__, "caps": CAPS,
                 "onednn": torch.backends.mkldnn.enabled, "model": args.model,
                 "precision": args.precision, "ranks": args.ranks, "steps": step,
                 "samples_per_s": step * 64 * args.ranks / (stats[1].item() / args.ranks),
                 "test_accuracy": stats[0].item() / len(yt)})
    dist.destroy_process_group()


def one_step(model, precision):
    """One training step of the model on random data (what --describe watches)."""
    torch.set_num_threads(1)
    no_bf16_kernels(precision)
    net = Mlp() if model == "mlp" else Cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = net(torch.randn(64, 1, 28, 28))
    F.cross_entropy(logits.float(), torch.randint(0, 10, (64,))).backward()
    opt.step()


def openblas_core():
    """OpenBLAS's kernel set in this process (the library torch loaded), or "?"."""
    import ctypes
    with open("/proc/self/maps") as f:
        path = next((l.split()[-1] for l in f if "libopenblas" in l), None)
    if not path:
        return "?"
    lib = ctypes.CDLL(path)
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return lib.openblas_get_corename().decode()


# oneDNN's verbose (primitive, propagation kind) -> the names ddp-train's start-up report uses.
ONEDNN_KINDS = {("convolution", "forward_training"): "conv_fwd", ("convolution", "backward_data"): "conv_bwd_data",
                ("convolution", "backward_weights"): "conv_bwd_weights", ("pooling", "forward_training"): "pool_fwd",
                ("pooling", "backward_data"): "pool_bwd", ("matmul", "undef"): "matmul"}


def describe(model, precision):
    """What PyTorch runs here: version, ATen capability, OpenBLAS core, oneDNN implementations."""
    shown = torch.__config__.show()
    capability = re.search(r"CPU capability usage: (\S+)", shown)
    child = subprocess.run([sys.executable, __file__, "--model", model, "--precision", precision, "--one-step"],
                           env=dict(os.environ, ONEDNN_VERBOSE="1"), capture_output=True, text=True,
                           check=True)
    impls = {}  # ddp_dnnl_describe's names: "conv_fwd" -> ["jit:avx2"], in order of appearance
    for line in child.stdout.splitlines():
        f = line.split(",")
        if len(f) > 5 and f[:3] == ["onednn_verbose", "exec", "cpu"] and f[3] != "reorder":
            kind = ONEDNN_KINDS.get((f[3].split("_v")[0], f[5]), f[3])
            if f[4] not in impls.setdefault(kind, []):
                impls[kind].append(f[4])
    caps = " ".join(f"{k}={v}" for k, v in CAPS.items()) or "none (DDP_CPU_ISA unset or not below the CPU)"
    if no_bf16_kernels(precision):
        caps += ", torch.backends.mkldnn off (bf16 below AVX-512)"
    onednn = ", ".join(f"{k} {'+'.join(v)}" for k, v in impls.items()) or "none (no oneDNN primitive)"
    return (f"pytorch {torch.__version__} ({model} {precision}): caps set by torch_mnist.py: {caps}; ATen "
            f"{capability.group(1) if capability else '?'}; OpenBLAS core {openblas_core()}; oneDNN: {onednn}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data")
    p.add_argument("--model", choices=("mlp", "cnn"), required=True)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    p.add_argument("--describe", action="store_true", help="print what PyTorch runs here; no training")
    p.add_argument("--one-step", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_step:
        return one_step(args.model, args.precision)
    if args.describe:
        return print(describe(args.model, args.precision))
    if not args.data:
        p.error("--data is required to train")
    port = 29500 + os.getpid() % 2000
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(train, args=(args, port, out), nprocs=args.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
