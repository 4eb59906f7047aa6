#!/bin/sh
# minimal.sh - libddp as outside C code adopts it: installs this build into a temporary root
# (meson install --destdir), builds examples/minimal with its own Makefile against the INSTALLED
# header and library found through pkg-config (ddp.pc), then runs it with 1 rank (batch 32) and
# under mpirun with 2 ranks (batch 16 each). Passes when the three public headers are installed
# and each compiles alone, the example includes nothing of libddp but ddp.h, its flags name no
# path of the source or build tree, it runs on the installed
# libddp, the loss falls below 1e-3, both ranks end identical, and 2 ranks equal 1 rank with the
# same global batch (relative difference <= 1e-5: the same samples per step, float rounding apart).
# Usage: minimal.sh MESON MPIRUN     (environment: DDP_TEST_SRCDIR, DDP_TEST_BUILDDIR)
meson=$1
mpirun=$2
src=$DDP_TEST_SRCDIR
build=$DDP_TEST_BUILDDIR
tmp=$(mktemp -d /tmp/ddp-example.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

others=$(grep -h '^#include' "$src"/examples/minimal/*.c | grep -v -e '<ddp.h>' -e '<std[a-z]*.h>' -e '<math.h>' -e '<string.h>')
[ -z "$others" ] || fail "the example includes more than ddp.h and the C library: $others"

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "meson install --destdir failed"; }
pc=$(find "$tmp/root" -name ddp.pc)
[ -n "$pc" ] || fail "no ddp.pc installed under $tmp/root"
for h in ddp.h ddp_checkpoint.h ddp_trace.h ddp_straggler.h; do
    [ -n "$(find "$tmp/root" -name "$h")" ] || fail "$h not installed"
done
echo "installed: ${pc#"$tmp/root"}"
# The .pc names the final prefix; PKG_CONFIG_SYSROOT_DIR puts the temporary root in front of its paths.
export PKG_CONFIG_PATH="${pc%/ddp.pc}" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
flags=$(pkg-config --cflags --libs ddp) || fail "pkg-config --cflags --libs ddp failed"
echo "pkg-config --cflags --libs ddp: $flags"
case $flags in *"$src"* | *"$build"*) fail "pkg-config's flags name the source or build tree" ;; esac
# Each installed header compiles alone (a sub-header includes ddp.h itself).
for h in ddp.h ddp_checkpoint.h ddp_trace.h ddp_straggler.h; do
    printf '#include <%s>\nint main(void) { return 0; }\n' "$h" |
        ${CC:-cc} -std=c17 -Wall -Wextra -Werror $(pkg-config --cflags ddp) -x c -fsyntax-only - ||
        fail "the installed $h does not compile alone"
done

cp -r "$src/examples/minimal" "$tmp/minimal"
make -C "$tmp/minimal" >"$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "make failed"; }
libdir=$(pkg-config --variable=libdir ddp)
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
used=$(ldd "$tmp/minimal/train" | sed -n 's/.*libddp.so[.0-9]* => \([^ ]*\).*/\1/p')
echo "libddp used: $used"
case $used in "$tmp/root"/*) ;; *) fail "the example does not run on the installed libddp" ;; esac

(cd "$tmp" && ./minimal/train 32 5) >"$tmp/one.out" 2>&1 || { cat "$tmp/one.out"; fail "1 rank failed"; }
(cd "$tmp" && "$mpirun" --oversubscribe --bind-to none -np 2 -x LD_LIBRARY_PATH ./minimal/train 16 5) \
    >"$tmp/two.out" 2>&1 || { cat "$tmp/two.out"; fail "mpirun -np 2 failed"; }
grep -h '^final' "$tmp/one.out" "$tmp/two.out"
python3 - "$tmp/one.out" "$tmp/two.out" <<'PY' || fail "results differ (see above)"
import re, sys
def finals(path):
    rows = [dict(kv.split("=") for kv in l.split()[1:]) for l in open(path) if l.startswith("final ")]
    return {int(r["rank"]): {k: float(v) for k, v in r.items() if k not in ("rank", "world")} for r in rows}
one, two = finals(sys.argv[1]), finals(sys.argv[2])
errors = []
if sorted(one) != [0] or sorted(two) != [0, 1]:
    errors.append(f"final lines from ranks {sorted(one)} and {sorted(two)}, want [0] and [0, 1]")
else:
    if two[0] != two[1]:
        errors.append(f"the 2 ranks differ: {two[0]} vs {two[1]}")
    for k, v in one[0].items():
        if abs(two[0][k] - v) > 1e-5 * max(abs(v), 1e-3):
            errors.append(f"{k}: 2 ranks {two[0][k]} vs 1 rank {v}")
    if one[0]["loss"] >= 1e-3:
        errors.append(f"loss {one[0]['loss']} did not fall below 1e-3")
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PY
echo "ok: built against the installed libddp via pkg-config; 2 ranks equal 1 rank with the same batch"
