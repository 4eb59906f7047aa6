#!/usr/bin/python3
"""torch_mnist.py - the peer of ddp-train in benchmarks/precision.sh: the same MLP (784-512-256-10)
or CNN (conv 1->20 5x5 pad 2, ReLU, 2x2 max-pool, conv 20->20 5x5 pad 2, ReLU, pool, fc 980->10)
trained data-parallel with PyTorch (DistributedDataParallel over gloo), SGD lr 0.05 momentum 0.9
with a cosine decay, batch 64 per rank, 1 thread per rank, on the same MNIST IDX files and the same
normalisation. --precision bf16 runs the forward pass under torch.autocast("cpu", torch.bfloat16)
(oneDNN's bf16 kernels in Debian's PyTorch), as PyTorch users do; fp32 does not.

Prints one JSON line: samples/s over the training steps (all ranks' samples over the time spent in
them, evaluation excluded, as ddp-train's summary) and the test accuracy after the last epoch.

Usage: torch_mnist.py --data DIR --model mlp|cnn --precision fp32|bf16 [--ranks 2] [--epochs 2]
"""
import argparse
import json
import math
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


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
    bf16 = args.precision == "bf16"
    step, seconds = 0, 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler))
        for s in range(steps_per_epoch):
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
        out.put({"framework": "pytorch " + torch.__version__, "model": args.model,
                 "precision": args.precision, "ranks": args.ranks, "steps": step,
                 "samples_per_s": step * 64 * args.ranks / (stats[1].item() / args.ranks),
                 "test_accuracy": stats[0].item() / len(yt)})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--model", choices=("mlp", "cnn"), required=True)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    port = 29500 + os.getpid() % 2000
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(train, args=(args, port, out), nprocs=args.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
