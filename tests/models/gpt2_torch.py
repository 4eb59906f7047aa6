#!/usr/bin/python3
"""gpt2_torch.py - a GPT-2 in PyTorch (1.13) that the tests hold ddp's C model (models/gpt2.h)
against: the same weights from an llm.c model file, the same batch, then the loss, every
parameter's gradient and the parameters after a few AdamW steps, written to one file.

The model: token + position embeddings, L pre-LayerNorm blocks (causal multi-head self-attention
as an explicit softmax of q k^T / sqrt(hs) under a causal mask, a GELU (tanh) MLP of 4C), a final
LayerNorm (eps 1e-5 everywhere) and an LM head tied to wte. wte has Vp >= V rows; the logits of the
padding columns are sliced off before the loss, so the padding rows get a zero gradient.

Files (little-endian):
  model  llm.c's: 256 int32 (magic 20240326, version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp),
         then the parameters in llm.c's tensor-major order (FLAT_ORDER below).
  batch  int32 B, T, then B*T input tokens, then B*T target tokens.
  out    float32: the mean loss, the gradient of every parameter (model file order and size), then
         with --steps K > 0 the parameters after K AdamW steps on that batch.
ref prints "loss L grad_norm G" (G the global norm of the unclipped gradients), then a line
"step k: loss L grad_norm G" per AdamW step. --double computes in fp64 (the output stays fp32).

Usage:
  gpt2_torch.py ref --model M.bin --batch X.bin --out O.bin [--steps K] [--lr 1e-3] [--wd 0.1]
                    [--clip 1.0] [--beta2 0.95] [--double]
  gpt2_torch.py init --config L,NH,C,maxT,V --seed S [--out M.bin]
                     [--batch-out X.bin --B b --T t]
  gpt2_torch.py selftest

Exits 1 on failure (a selftest check, a bad file), and 77 (meson's "skipped") where PyTorch or
numpy is missing.
"""
import argparse
import math
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as missing:  # no python3-torch here: meson's "skipped"
    print(f"gpt2_torch: {missing}; skipped", file=sys.stderr)
    sys.exit(77)

torch.set_default_dtype(torch.float32)

MODEL_MAGIC = 20240326
VERSION_FP32, VERSION_BF16 = 3, 5
HEADER_INTS = 256
LN_EPS = 1e-5
PER_LAYER = ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
             "fcw", "fcb", "fcprojw", "fcprojb")
FLAT_ORDER = ("wte", "wpe") + PER_LAYER + ("lnfw", "lnfb")
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}  # the 2-D weights


class Config:
    """maxT, V, L, NH, C, Vp as in the model file's header."""

    def __init__(self, max_seq, vocab, layers, heads, channels, padded_vocab=0):
        self.max_seq, self.vocab, self.layers = max_seq, vocab, layers
        self.heads, self.channels = heads, channels
        self.padded_vocab = padded_vocab or (vocab + 127) // 128 * 128
        if min(max_seq, vocab, layers, heads, channels) < 1 or channels % heads or \
                self.padded_vocab < vocab:
            raise ValueError(f"bad configuration {self.header()}")

    def header(self):
        return [self.max_seq, self.vocab, self.layers, self.heads, self.channels, self.padded_vocab]

    def n_params(self, padded=True):
        """Elements of the flat buffer (padded=False: wte without its padding rows)."""
        C, L = self.channels, self.layers
        rows = self.padded_vocab if padded else self.vocab
        return (rows + self.max_seq) * C + L * (12 * C * C + 13 * C) + 2 * C


class Block(nn.Module):
    """One pre-LayerNorm transformer block."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg.channels
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(C, eps=LN_EPS), nn.LayerNorm(C, eps=LN_EPS)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2)  # (B, NH, T, hs)
                   for t in self.qkv(x).split(C, dim=2))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, T, C)
        return self.attproj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.zeros(cfg.padded_vocab, cfg.channels))  # (Vp, C)
        self.wpe = nn.Parameter(torch.zeros(cfg.max_seq, cfg.channels))       # (maxT, C)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lnf = nn.LayerNorm(cfg.channels, eps=LN_EPS)

    def forward(self, tokens, targets=None):
        """Logits (B, T, V) without targets; the mean cross-entropy with them."""
        T = tokens.shape[1]
        x = F.embedding(tokens, self.wte) + self.wpe[:T]
        for block in self.h:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte)[..., :self.cfg.vocab]  # padding columns dropped
        if targets is None:
            return logits
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 under autocast
        return F.cross_entropy(wide.reshape(-1, self.cfg.vocab), targets.reshape(-1))

    def tensors(self, name):
        """The parameter tensors of one entry of FLAT_ORDER (one per layer for per-layer ones)."""
        if name in ("wte", "wpe"):
            return [getattr(self, name)]
        if name in ("lnfw", "lnfb"):
            return [self.lnf.weight if name == "lnfw" else self.lnf.bias]
        module, attr = name[:-1], "weight" if name[-1] == "w" else "bias"  # "qkvw": qkv.weight
        return [getattr(getattr(b, module), attr) for b in self.h]

    def flat_tensors(self):
        """Every parameter tensor in the model file's order."""
        return [t for name in FLAT_ORDER for t in self.tensors(name)]

    def param_groups(self, weight_decay):
        """AdamW groups: weight decay on the 2-D weights only."""
        decay = [t for n in FLAT_ORDER if n in DECAYED for t in self.tensors(n)]
        rest = [t for n in FLAT_ORDER if n not in DECAYED for t in self.tensors(n)]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]

    def get_flat(self, grads=False):
        """The parameters (or gradients; zero where None) as one flat float64 numpy array."""
        parts = []
        for t in self.flat_tensors():
            src = t.grad if grads else t
            parts.append(np.zeros(t.numel()) if src is None else
                         src.detach().reshape(-1).double().numpy())
        return np.concatenate(parts)

    @torch.no_grad()
    def set_flat(self, flat):
        """Loads a flat array of n_params() elements in the model file's order."""
        if flat.size != self.cfg.n_params():
            raise ValueError(f"{flat.size} values for a model of {self.cfg.n_params()}")
        offset = 0
        for t in self.flat_tensors():
            n = t.numel()
            t.copy_(torch.from_numpy(np.ascontiguousarray(flat[offset:offset + n])).view(t.shape))
            offset += n

    @torch.no_grad()
    def init_gpt2(self, seed):
        """GPT-2's initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2L)),
        LayerNorm weights 1, biases 0, wte's padding rows 0."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name in FLAT_ORDER:
            for t in self.tensors(name):
                if name in DECAYED:
                    std = residual_std if name in ("attprojw", "fcprojw") else 0.02
                    t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64) * std)
                else:
                    t.fill_(1.0 if name.endswith("w") else 0.0)
        self.wte[self.cfg.vocab:] = 0.0


# ---- files ----------------------------------------------------------------------------------

def read_model(path):
    """(Config, flat float32 numpy array) from an llm.c model file (fp32 or bf16, widened)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(4 * HEADER_INTS), dtype="<i4")
        body = f.read()
    if header.size != HEADER_INTS or header[0] != MODEL_MAGIC:
        raise ValueError(f"{path}: not an llm.c model file (magic)")
    if header[1] not in (VERSION_FP32, VERSION_BF16):
        raise ValueError(f"{path}: version {header[1]} (3 = fp32 and 5 = bf16 are read)")
    cfg = Config(*(int(v) for v in header[2:8]))
    if header[1] == VERSION_FP32:
        flat = np.frombuffer(body, dtype="<f4")
    else:
        flat = (np.frombuffer(body, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    if flat.size != cfg.n_params():
        raise ValueError(f"{path}: {flat.size} parameters, the header says {cfg.n_params()}")
    return cfg, flat.astype(np.float32)


def to_bf16_bits(flat):
    """fp32 values rounded to nearest even bf16, as uint16 bit patterns."""
    bits = np.asarray(flat, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def write_model(path, cfg, flat, version=VERSION_FP32):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, version] + cfg.header()
    body = np.asarray(flat, dtype="<f4") if version == VERSION_FP32 else to_bf16_bits(flat)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())


def read_batch(path):
    """(inputs, targets) as int64 tensors (B, T)."""
    data = np.fromfile(path, dtype="<i4")
    B, T = int(data[0]), int(data[1])
    if B < 1 or T < 1 or data.size != 2 + 2 * B * T:
        raise ValueError(f"{path}: not a batch file (B {B}, T {T}, {data.size} int32)")
    x = torch.from_numpy(data[2:2 + B * T].astype(np.int64)).view(B, T)
    y = torch.from_numpy(data[2 + B * T:].astype(np.int64)).view(B, T)
    return x, y


def write_batch(path, x, y):
    B, T = x.shape
    np.concatenate([[B, T], x.reshape(-1), y.reshape(-1)]).astype("<i4").tofile(path)


def random_batch(vocab, B, T, seed):
    """B sequences of T + 1 uniform tokens: inputs the first T, targets the last T."""
    seq = np.random.default_rng([seed, 1]).integers(0, vocab, size=(B, T + 1))
    return seq[:, :T], seq[:, 1:]


# ---- the reference run ----------------------------------------------------------------------

def make_model(cfg, flat, double):
    model = GPT2(cfg)
    if double:
        model.double()
    model.set_flat(flat)
    return model


def loss_and_grads(model, x, y):
    """Zeroes the gradients, runs forward and backward; returns the loss."""
    model.zero_grad(set_to_none=False)
    loss = model(x, y)
    loss.backward()
    return loss.item()


def grad_norm(model):
    return math.sqrt(sum(float(t.grad.double().pow(2).sum()) for t in model.flat_tensors()))


def adamw_steps(model, x, y, steps, args):
    """args.steps AdamW steps on one batch, clipping by the global norm when args.clip > 0."""
    opt = torch.optim.AdamW(model.param_groups(args.wd), lr=args.lr, betas=(0.9, args.beta2),
                            eps=1e-8)
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=False)
        loss = model(x, y)
        loss.backward()
        if args.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        else:
            norm = grad_norm(model)
        opt.step()
        print(f"step {step}: loss {loss.item():.7f} grad_norm {norm:.7f}")


def run_ref(args):
    cfg, flat = read_model(args.model)
    x, y = read_batch(args.batch)
    if x.shape[1] > cfg.max_seq or int(min(x.min(), y.min())) < 0 or \
            int(max(x.max(), y.max())) >= cfg.vocab:
        raise ValueError(f"{args.batch}: T above maxT or a token outside [0, {cfg.vocab})")
    model = make_model(cfg, flat, args.double)
    loss = loss_and_grads(model, x, y)
    print(f"loss {loss:.7f} grad_norm {grad_norm(model):.7f}")
    parts = [np.array([loss]), model.get_flat(grads=True)]
    if args.steps > 0:
        adamw_steps(model, x, y, args.steps, args)
        parts.append(model.get_flat())
    np.concatenate(parts).astype("<f4").tofile(args.out)


def run_init(args):
    L, NH, C, max_seq, V = (int(v) for v in args.config.split(","))
    cfg = Config(max_seq, V, L, NH, C)
    if args.out:
        model = GPT2(cfg)
        model.init_gpt2(args.seed)
        write_model(args.out, cfg, model.get_flat())
    if args.batch_out:
        if not 1 <= args.T <= max_seq or args.B < 1:
            raise ValueError(f"--B {args.B} --T {args.T}: need B >= 1 and 1 <= T <= maxT {max_seq}")
        write_batch(args.batch_out, *random_batch(V, args.B, args.T, args.seed))


# ---- selftest -------------------------------------------------------------------------------

def rel_err(a, b):
    """max |a - b| / max |b| (0 when both are 0)."""
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a).max())


def check(ok, what, failures):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def selftest_precision(cfg, flat, x, y, failures):
    """fp32 against fp64: loss and every tensor's gradient (relative to the tensor's max)."""
    m32, m64 = make_model(cfg, flat, False), make_model(cfg, flat, True)
    l32, l64 = loss_and_grads(m32, x, y), loss_and_grads(m64, x, y)
    check(abs(l32 - l64) <= 1e-6 * abs(l64), f"fp32 loss {l32:.7f} vs fp64 {l64:.7f}", failures)
    worst = 0.0
    for name in FLAT_ORDER:
        for a, b in zip(m32.tensors(name), m64.tensors(name)):
            worst = max(worst, rel_err(a.grad.double().numpy(), b.grad.numpy()))
    check(worst <= 1e-4, f"fp32 gradients vs fp64: worst max|d|/max|g| over tensors {worst:.2e}",
          failures)
    pad = m64.wte.grad[cfg.vocab:]
    check(pad.numel() > 0 and bool((pad == 0).all()), "wte's padding rows have a zero gradient",
          failures)


def selftest_gradcheck(cfg, flat, x, y, failures):
    """A few entries of several tensors by central differences in fp64."""
    model = make_model(cfg, flat, True)
    loss_and_grads(model, x, y)
    gen = np.random.default_rng(7)
    worst = 0.0
    for name in ("wte", "wpe", "ln1w", "qkvw", "qkvb", "attprojw", "ln2b", "fcw", "fcprojw",
                 "fcprojb", "lnfw"):
        t = model.tensors(name)[-1]
        for _ in range(3):
            i = int(gen.integers(0, t.numel()))
            if name == "wte":
                i = int(x[0, 0]) * cfg.channels + int(gen.integers(0, cfg.channels))
            if name == "wpe":
                i = int(gen.integers(0, x.shape[1] * cfg.channels))
            worst = max(worst, fd_error(model, t, i, x, y))
    check(worst <= 1e-6, f"fp64 gradients vs central differences (h 1e-5): worst error {worst:.2e} "
          "(|g - fd| / max(|g|, 1e-3))", failures)


@torch.no_grad()
def fd_error(model, t, i, x, y, h=1e-5):
    view = t.view(-1)
    old = view[i].item()
    view[i] = old + h
    up = model(x, y).item()
    view[i] = old - h
    down = model(x, y).item()
    view[i] = old
    fd, g = (up - down) / (2 * h), t.grad.view(-1)[i].item()
    return abs(g - fd) / max(abs(g), 1e-3)


def selftest_files(cfg, flat, tmp, failures):
    """The model and batch files round trip; bf16 files widen to the rounded values."""
    path = os.path.join(tmp, "m.bin")
    write_model(path, cfg, flat)
    cfg2, flat2 = read_model(path)
    check(cfg2.header() == cfg.header() and np.array_equal(flat2, flat),
          "fp32 model file round trip", failures)
    write_model(path, cfg, flat, VERSION_BF16)
    _, wide = read_model(path)
    widened = (to_bf16_bits(flat).astype(np.uint32) << 16).view(np.float32)
    check(np.array_equal(wide, widened) and rel_err(wide, flat) <= 2 ** -8,
          "bf16 model file read and widened", failures)
    x, y = random_batch(cfg.vocab, 3, 5, 11)
    write_batch(os.path.join(tmp, "x.bin"), x, y)
    x2, y2 = read_batch(os.path.join(tmp, "x.bin"))
    check(np.array_equal(x2.numpy(), x) and np.array_equal(y2.numpy(), y), "batch file round trip",
          failures)


def selftest_ref(tmp, failures):
    """The command line end to end: init, ref with steps, the output's size and contents."""
    m, xb, out = (os.path.join(tmp, n) for n in ("init.bin", "batch.bin", "out.bin"))
    main(["init", "--config", "2,2,32,16,200", "--seed", "3", "--out", m, "--batch-out", xb,
          "--B", "2", "--T", "8"])
    cfg, flat = read_model(m)
    main(["ref", "--model", m, "--batch", xb, "--out", out, "--steps", "3", "--clip", "0.5"])
    res = np.fromfile(out, dtype="<f4")
    n = cfg.n_params()
    check(res.size == 1 + 2 * n, f"ref output holds 1 + 2 x {n} values", failures)
    check(abs(res[0] - math.log(cfg.vocab)) < 0.1, f"initial loss {res[0]:.4f} ~ ln V "
          f"{math.log(cfg.vocab):.4f}", failures)
    moved = res[1 + n:] - flat
    pad = moved[cfg.vocab * cfg.channels:cfg.padded_vocab * cfg.channels]
    check(bool(np.all(pad == 0)) and np.abs(moved).max() > 1e-3,
          "AdamW moved the parameters, not wte's padding rows", failures)
    check(np.abs(moved).max() <= 2 * 3 * 1e-3, "no parameter moved more than 2 x steps x lr",
          failures)


def selftest_adamw(cfg, flat, x, y, failures):
    """torch.optim.AdamW with the two groups and clipping against the update written out."""
    args = argparse.Namespace(lr=1e-2, wd=0.1, clip=0.5, beta2=0.95)
    model = make_model(cfg, flat, True)
    loss_and_grads(model, x, y)
    g = model.get_flat(grads=True)
    scale = min(1.0, args.clip / (np.linalg.norm(g) + 1e-6))
    decay = np.concatenate([np.full(t.numel(), args.wd if n in DECAYED else 0.0)
                            for n in FLAT_ORDER for t in model.tensors(n)])
    m, v = 0.1 * g * scale, 0.05 * (g * scale) ** 2
    w = flat.astype(np.float64)
    want = w - args.lr * (m / 0.1 / (np.sqrt(v / 0.05) + 1e-8) + decay * w)
    adamw_steps(model, x, y, 1, args)
    check(rel_err(model.get_flat(), want) <= 1e-9, "one AdamW step (wd on 2-D weights only, "
          f"clipped by {scale:.3f}) equals the written-out update", failures)


def selftest():
    cfg = Config(max_seq=16, vocab=300, layers=2, heads=4, channels=32)
    model = GPT2(cfg)
    model.init_gpt2(5)
    flat = model.get_flat().astype(np.float32)
    x, y = (torch.from_numpy(a) for a in random_batch(cfg.vocab, 2, 12, 9))
    failures = []
    selftest_precision(cfg, flat, x, y, failures)
    selftest_gradcheck(cfg, flat, x, y, failures)
    selftest_adamw(cfg, flat, x, y, failures)
    with tempfile.TemporaryDirectory() as tmp:
        selftest_files(cfg, flat, tmp, failures)
        selftest_ref(tmp, failures)
    print(f"selftest: {len(failures)} failure(s)")
    return 1 if failures else 0


def parse(argv):
    p = argparse.ArgumentParser(description="GPT-2 reference in PyTorch for ddp's tests")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ref", help="loss, gradients and AdamW steps on one batch")
    r.add_argument("--model", required=True)
    r.add_argument("--batch", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=0)
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--wd", type=float, default=0.1)
    r.add_argument("--clip", type=float, default=1.0)
    r.add_argument("--beta2", type=float, default=0.95)
    r.add_argument("--double", action="store_true", help="compute in fp64 (the output stays fp32)")
    i = sub.add_parser("init", help="a GPT-2-initialised model file and/or a random batch file")
    i.add_argument("--config", required=True, help="L,NH,C,maxT,V")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--out")
    i.add_argument("--batch-out")
    i.add_argument("--B", type=int, default=2)
    i.add_argument("--T", type=int, default=16)
    sub.add_parser("selftest", help="checks this implementation; exits 1 on failure")
    args = p.parse_args(argv)
    if args.cmd == "init" and not (args.out or args.batch_out):
        p.error("init: give --out, --batch-out or both")
    return args


def main(argv=None):
    args = parse(argv)
    if args.cmd == "ref":
        if args.double:
            torch.set_default_dtype(torch.float64)
        run_ref(args)
        torch.set_default_dtype(torch.float32)
    elif args.cmd == "init":
        run_init(args)
    else:
        return selftest()
    return 0


if __name__ == "__main__":
    sys.exit(main())
