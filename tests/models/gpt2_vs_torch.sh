#!/bin/sh
# gpt2_vs_torch.sh - ddp's GPT-2 (gpt2_dump, C) against PyTorch's (gpt2_torch.py) on the same
# llm.c model file and batch, in fp32: the loss, every parameter slice's gradient, and every slice
# after 3 AdamW steps (clipping by the global norm, weight decay on the 2-D weights) agree to
# 1e-4 relative, per slice: ||ddp - torch|| / ||torch|| (2-norms; a slice whose reference is 0
# must be within 1e-7 of 0; the key third of c_attn's bias, whose gradient is 0 but for rounding,
# is checked apart after the steps: see key_bias_apart). Three cases: clipping inactive (clip 1e3)
# and active (clip 0.05) on a vocabulary of 300, and GPT-2's 50,257 (padded to 50,304).
# Exits 77 (skipped) only when PyTorch is missing.
# Usage: gpt2_vs_torch.sh GPT2_DUMP GPT2_TORCH_PY
set -eu
dump=$1
ref=$2
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "gpt2_vs_torch: skipped: python3-torch is not installed"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# compare CONFIG_MODEL DDP_OUT TORCH_OUT: per-slice relative errors, exit 1 above 1e-4.
compare() {
    "$py" - "$@" <<'EOF'
import sys
import numpy as np

model, ours, theirs = sys.argv[1:4]
h = np.fromfile(model, dtype="<i4", count=256)
maxT, V, L, NH, C, Vp = (int(v) for v in h[2:8])
per_layer = [("ln_1.weight", C), ("ln_1.bias", C), ("attn.c_attn.weight", 3 * C * C),
             ("attn.c_attn.bias", 3 * C), ("attn.c_proj.weight", C * C), ("attn.c_proj.bias", C),
             ("ln_2.weight", C), ("ln_2.bias", C), ("mlp.c_fc.weight", 4 * C * C),
             ("mlp.c_fc.bias", 4 * C), ("mlp.c_proj.weight", 4 * C * C), ("mlp.c_proj.bias", C)]
slices = [("wte.weight", Vp * C), ("wpe.weight", maxT * C)]
slices += [(f"h.{l}.{name}", n) for name, n in per_layer for l in range(L)]
slices += [("ln_f.weight", C), ("ln_f.bias", C)]
n = sum(k for _, k in slices)
a, b = np.fromfile(ours, dtype="<f4"), np.fromfile(theirs, dtype="<f4")
if a.size != b.size or a.size not in (1 + n, 1 + 2 * n):
    sys.exit(f"sizes differ: ddp {a.size}, torch {b.size}, want 1 + {n} (x2 with steps)")
bad = []
def rel(x, y):
    ny = np.linalg.norm(y.astype(np.float64))
    d = np.linalg.norm(x.astype(np.float64) - y)
    return d / ny if ny > 0 else (0.0 if d <= 1e-7 else np.inf)
def key_bias_apart(name, x, y, gx, gy):
    """The key third of c_attn's bias has a zero gradient in exact arithmetic (the softmax over
    keys ignores q.b, the same for every key): both sides hold rounding noise there, which AdamW
    divides by its eps (1e-8), so its values after the steps are noise. Checked apart: gradients
    below 1e-8 and values below 1e-4 on both sides; the query and value thirds are returned."""
    key = slice(C, 2 * C)
    if max(abs(gx[key]).max(), abs(gy[key]).max()) > 1e-8 or \
            max(abs(x[key]).max(), abs(y[key]).max()) > 1e-4:
        bad.append(f"{name}: the key bias's gradient or value is not noise-sized")
    return np.delete(x, np.s_[key]), np.delete(y, np.s_[key])
r = abs(float(a[0]) - float(b[0])) / abs(float(b[0]))
print(f"loss ddp {a[0]:.7f} torch {b[0]:.7f} rel {r:.2e}")
if r > 1e-4:
    bad.append("loss")
for part, off in (("grad", 1), ("param after 3 steps", 1 + n))[: (a.size - 1) // n]:
    worst = (0.0, "")
    for name, k in slices:
        x, y = a[off:off + k], b[off:off + k]
        if part != "grad" and name.endswith("c_attn.bias"):
            x, y = key_bias_apart(name, x, y, a[off - n:off - n + k], b[off - n:off - n + k])
        e = rel(x, y)
        worst = max(worst, (e, name))
        if e > 1e-4:
            bad.append(f"{part} {name}: {e:.2e}")
        off += k
    print(f"{part}: worst slice {worst[1]} rel {worst[0]:.2e}")
for line in bad[:20]:
    print("MISMATCH", line)
sys.exit(1 if bad else 0)
EOF
}

status=0
# L,NH,C,maxT,V and the clipping norm: inactive (1e3), active (0.05), GPT-2's vocabulary (1.0).
for case in 2,4,64,16,300:1000 2,4,64,16,300:0.05 1,2,64,16,50257:1.0; do
    config=${case%:*}
    clip=${case#*:}
    echo "== config $config, clip $clip"
    "$py" "$ref" init --config "$config" --seed 7 --out "$tmp/m.bin" \
        --batch-out "$tmp/x.bin" --B 2 --T 16 >/dev/null
    "$py" "$ref" ref --model "$tmp/m.bin" --batch "$tmp/x.bin" --out "$tmp/torch.bin" \
        --steps 3 --lr 1e-3 --wd 0.1 --clip "$clip" >/dev/null
    "$dump" --model "$tmp/m.bin" --batch "$tmp/x.bin" --out "$tmp/ddp.bin" \
        --steps 3 --lr 1e-3 --wd 0.1 --clip "$clip" >/dev/null
    compare "$tmp/m.bin" "$tmp/ddp.bin" "$tmp/torch.bin" || status=1
done
exit $status
