#!/usr/bin/python3
"""gpt_torch.py - the PyTorch half of the GPT-2 CPU benchmark: the model of
tests/models/gpt2_torch.py (the reference ddp's C model is tested against; wpe of 1024 rows as
GPT-2's, vocabulary 50,257 padded to 50,304) trained data-parallel with DistributedDataParallel over
gloo, 1 thread per rank, AdamW (betas 0.9/0.95, eps 1e-8, weight decay on the 2-D weights only,
constant lr) after clipping by the global gradient norm, on random tokens (seeded) or on llm.c token
shards (--data). --precision bf16 runs the forward pass under torch.autocast("cpu",
torch.bfloat16), as PyTorch users do.

Ranks are started as benchmarks/torch_mnist.py starts them (torch.multiprocessing, --ranks N), or
by an outside launcher that sets RANK/WORLD_SIZE (torchrun; Debian's needs --redirects 1 --tee 1
--log_dir DIR) or OMPI_COMM_WORLD_RANK/SIZE (mpirun; MASTER_ADDR/MASTER_PORT, by default
127.0.0.1:29517). DDP_CPU_ISA caps PyTorch's kernels as in torch_mnist.py.

Rank 0 prints one JSON line at the end: tokens/s of all ranks over the timed steps (after
--warmup untimed ones), ms per step, and the model FLOPs per second per rank counted as nanoGPT
counts them, 6 N + 12 L T C per token with N the parameter count WITHOUT wte's padding rows
(GPT-2's 124M for d12); ddp-train's model_gflops_per_rank counts the same way (llm.c's 6 N + 6 L C
T with the padding rows is ddp-train's MFU count, models/gpt2_mfu.c).

Usage: gpt_torch.py [--ranks 2] [--layers 4] [--heads 4] [--channels 256] [--seq 128] [--batch 4]
                    [--steps 20] [--warmup 3] [--precision fp32|bf16] [--data 'DIR/*_train_*.bin']
"""
import argparse
import glob
import json
import os
import resource
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "models")]
from torch_mnist import CAPS, no_bf16_kernels  # noqa: E402 (sets the ISA caps, then imports torch)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from gpt2_torch import GPT2, Config  # noqa: E402

SHARD_MAGIC, SHARD_VERSION = 20240520, 1


def read_shards(pattern):
    """All tokens of the llm.c shards matching pattern (sorted by name), as one int64 array."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"gpt_torch: no shard matches {pattern}")
    parts = []
    for path in paths:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(1024), dtype="<i4")
            tokens = np.frombuffer(f.read(), dtype="<u2")
        if header.size != 256 or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION or \
                tokens.size != header[2]:
            sys.exit(f"gpt_torch: {path}: not an llm.c token shard (magic, version 1, count)")
        parts.append(tokens)
    return np.concatenate(parts).astype(np.int64)


class Batches:
    """Each rank's (inputs, targets) of B x T: disjoint windows of B*T+1 tokens of the shards in
    turn (wrapping around), or uniform random tokens from a per-rank seeded generator."""

    def __init__(self, args, rank, world):
        self.B, self.T, self.rank, self.world = args.batch, args.seq, rank, world
        self.tokens = read_shards(args.data) if args.data else None
        if self.tokens is not None and self.tokens.size < self.B * self.T + 1:
            sys.exit(f"gpt_torch: {args.data}: fewer than B*T+1 = {self.B * self.T + 1} tokens")
        self.gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
        self.step = 0

    def next(self):
        n = self.B * self.T + 1
        if self.tokens is None:
            window = torch.randint(0, 50257, (n,), generator=self.gen)
        else:
            windows = (self.tokens.size - 1) // (n - 1)
            w = (self.step * self.world + self.rank) % windows
            window = torch.from_numpy(self.tokens[w * (n - 1):w * (n - 1) + n])
        self.step += 1
        return window[:-1].view(self.B, self.T), window[1:].view(self.B, self.T)


def train_step(ddp, opt, x, y, args):
    """One step; returns the loss (this rank's)."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        loss = ddp(x, y)
    loss.backward()
    if args.clip > 0:
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip)
    opt.step()
    return loss.item()


def train(rank, world, args, init_method, out):
    torch.set_num_threads(1)
    no_bf16_kernels(args.precision)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    cfg = Config(max(args.seq, 1024), 50257, args.layers, args.heads, args.channels)
    model = GPT2(cfg)
    model.init_gpt2(args.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.param_groups(args.wd), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    batches = Batches(args, rank, world)
    losses = [train_step(ddp, opt, *batches.next(), args) for _ in range(args.warmup)]
    dist.barrier()
    start = time.perf_counter()
    losses += [train_step(ddp, opt, *batches.next(), args) for _ in range(args.steps)]
    seconds = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    loss = torch.tensor([losses[0], losses[-1]])
    dist.all_reduce(loss)
    result = summary(cfg, args, world, seconds.item(), (loss / world).tolist())
    # DDP holds the process group: freed by every rank together, not after rank 0 has exited
    # (a gloo group destroyed after its peer is gone may hang).
    del ddp, opt
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out(result)


def summary(cfg, args, world, seconds, losses):
    n = cfg.n_params(padded=False)
    per_token = 6 * n + 12 * cfg.layers * args.seq * cfg.channels
    tokens_per_s = args.steps * args.batch * args.seq * world / seconds
    return {"framework": "pytorch " + torch.__version__, "torch": torch.__version__, "caps": CAPS,
            "onednn": torch.backends.mkldnn.enabled, "precision": args.precision, "ranks": world,
            "threads": torch.get_num_threads(), "layers": cfg.layers, "heads": cfg.heads,
            "channels": cfg.channels, "seq": args.seq, "batch_per_rank": args.batch,
            "vocab": cfg.vocab, "padded_vocab": cfg.padded_vocab, "data": args.data or "random",
            "steps": args.steps, "warmup": args.warmup,
            "n_params": n, "n_params_padded": cfg.n_params(), "flops_per_token": per_token,
            "flops_count": "6N + 12 L T C per token, N without wte's padding rows",
            "tokens_per_s": tokens_per_s, "ms_per_step": 1000 * seconds / args.steps,
            "model_gflops_per_rank": tokens_per_s / world * per_token / 1e9,
            "loss_first": losses[0], "loss_last": losses[1],
            "max_rss_mib_rank0": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def print_json(result):
    print(json.dumps(result), flush=True)


def spawned(rank, world, args, init_method, queue):
    train(rank, world, args, init_method, queue.put)


def outside_launcher():
    """(rank, world, init method) when torchrun or mpirun started this process, else None."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), "env://"
    if "OMPI_COMM_WORLD_RANK" in env:
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), env.get("MASTER_PORT", "29517")
        return (int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]),
                f"tcp://{addr}:{port}")
    return None


def parse():
    p = argparse.ArgumentParser(description="GPT-2 trained with PyTorch DDP over gloo on the CPU")
    p.add_argument("--ranks", type=int, default=2, help="processes to start (without a launcher)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--data", help="llm.c token shards (a glob pattern); random tokens without it")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="global-norm clipping (0: none)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.channels % args.heads:
        p.error("need --steps >= 1, --warmup >= 0 and channels divisible by heads")
    return args


def main():
    args = parse()
    launched = outside_launcher()
    if launched:
        rank, world, init_method = launched
        return train(rank, world, args, init_method, print_json)
    port = 29500 + os.getpid() % 2000
    queue = mp.get_context("spawn").Queue()
    mp.spawn(spawned, args=(args.ranks, args, f"tcp://127.0.0.1:{port}", queue), nprocs=args.ranks,
             join=True)
    print_json(queue.get())


if __name__ == "__main__":
    main()
