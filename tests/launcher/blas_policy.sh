#!/bin/sh
# blas_policy.sh - ddp-launch and models/ops take the same OpenBLAS kernel decision: for each simulated
# CPU feature set (DDP_SIMULATE_CPU_FEATURES), the OPENBLAS_CORETYPE ddp-launch exports equals the
# one models/ops sets (blas_probe), both equal the policy's table, and where this CPU really has the
# features, OpenBLAS then runs that core. A preset OPENBLAS_CORETYPE is kept by both and reported.
# Usage: blas_policy.sh DDP_LAUNCH BLAS_PROBE
launch=$1
probe=$2
fails=0
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo)

check() {
    if [ "$2" != "$3" ]; then echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); else echo "ok   $1: $2"; fi
}

# has_all FEATURES: this CPU has every feature of the comma-separated list (cpuinfo spells
# avx512bf16 as avx512_bf16).
has_all() {
    for f in $(echo "$1" | tr ',' ' ' | sed 's/avx512bf16/avx512_bf16/'); do
        [ "$f" = none ] && continue
        case " ${cpu_flags#*:} " in *" $f "*) ;; *) return 1 ;; esac
    done
}

# The policy, as documented in ddp.h and ddp-launch --help; "-": leave the choice to OpenBLAS.
skx=avx512f,avx512bw,avx512vl,avx512dq
for row in "none -" "avx512f -" "avx512f,avx512bw,avx512vl -" "avx512bw,avx512vl,avx512dq,avx512bf16 -" \
    "$skx SkylakeX" "$skx,avx512bf16 Cooperlake" "avx512bf16,$skx Cooperlake"; do
    feats=${row% *}
    want=${row#* }
    # shellcheck disable=SC2016  # for the program's shell
    by_launch=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_SIMULATE_CPU_FEATURES="$feats" \
        "$launch" sh -c 'echo "${OPENBLAS_CORETYPE:--}"')
    lib=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_SIMULATE_CPU_FEATURES="$feats" "$probe")
    by_lib=$(echo "$lib" | sed -n 's/^coretype=\([^ ]*\) .*/\1/p')
    check "[$feats] ddp-launch exports" "$by_launch" "$want"
    check "[$feats] models/ops sets" "$by_lib" "$want"
    if [ "$want" != - ] && has_all "$feats"; then
        check "[$feats] OpenBLAS runs (models/ops alone)" "$(echo "$lib" | sed -n 's/.* core=\([^ ]*\) .*/\1/p')" "$want"
        lib=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_SIMULATE_CPU_FEATURES="$feats" \
            "$launch" "$probe")
        check "[$feats] OpenBLAS runs (under ddp-launch)" "$(echo "$lib" | sed -n 's/.* core=\([^ ]*\) .*/\1/p')" "$want"
        check "[$feats] set by" "$(echo "$lib" | sed -n 's/.* by=\([^ ]*\) .*/\1/p')" ddp-launch
    fi
done

# A preset is the user's choice: neither side changes it, and models/ops's report says so.
# shellcheck disable=SC2016
check "preset kept by ddp-launch" "$(OPENBLAS_CORETYPE=Haswell DDP_SIMULATE_CPU_FEATURES="$skx" \
    "$launch" sh -c 'echo "$OPENBLAS_CORETYPE"')" Haswell
lib=$(OPENBLAS_CORETYPE=Haswell DDP_SIMULATE_CPU_FEATURES="$skx" "$launch" "$probe")
check "preset kept by models/ops" "$(echo "$lib" | sed -n 's/^coretype=\([^ ]*\) .*/\1/p')" Haswell
case $lib in
    *"OPENBLAS_CORETYPE=Haswell preset by the user (policy for this CPU: SkylakeX)"*) check "preset reported" yes yes ;;
    *) check "preset reported" "$lib" "... preset by the user (policy for this CPU: SkylakeX)" ;;
esac

# A bad simulated list is refused by ddp-launch with the valid names.
out=$(DDP_SIMULATE_CPU_FEATURES=avx512x "$launch" true 2>&1)
check "bad feature list: exit status" "$?" 1
case $out in *"unknown feature 'avx512x'"*avx512bf16*) check "bad feature list: message" named named ;;
    *) check "bad feature list: message" "$out" "unknown feature 'avx512x' ... avx512bf16" ;; esac
# DDP_CPU_ISA caps the features both sides see: below AVX-512 the cap's own core (Haswell, or Prescott
# for the baseline), so OpenBLAS's choice on the real CPU cannot exceed it; a cap at or above what the
# CPU has changes nothing ("-").
for row in "avx2 $skx,avx512bf16,avx2,fma,f16c Haswell" "baseline $skx,avx2,fma,f16c Prescott" \
    "avx512 $skx,avx512bf16 SkylakeX" "avx2 avx2,fma,f16c -" "native $skx SkylakeX"; do
    set -- $row
    by_launch=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_SIMULATE_CPU_FEATURES="$2" \
        DDP_CPU_ISA="$1" "$launch" sh -c 'echo "${OPENBLAS_CORETYPE:--}"')
    lib=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_SIMULATE_CPU_FEATURES="$2" DDP_CPU_ISA="$1" "$probe")
    check "[DDP_CPU_ISA=$1 $2] ddp-launch exports" "$by_launch" "$3"
    check "[DDP_CPU_ISA=$1 $2] models/ops sets" "$(echo "$lib" | sed -n 's/^coretype=\([^ ]*\) .*/\1/p')" "$3"
done
# On this CPU itself: capped to AVX2 where it has AVX-512, OpenBLAS then runs the Haswell kernels.
if has_all "$skx,avx2,fma"; then
    lib=$(env -u OPENBLAS_CORETYPE -u DDP_OPENBLAS_CORETYPE_BY DDP_CPU_ISA=avx2 "$launch" "$probe")
    check "[DDP_CPU_ISA=avx2, this CPU] OpenBLAS runs" "$(echo "$lib" | sed -n 's/.* core=\([^ ]*\) .*/\1/p')" Haswell
fi
# A cap replaces a preset above it (the preset would run kernels the cap excludes), and says so.
lib=$(OPENBLAS_CORETYPE=SkylakeX DDP_SIMULATE_CPU_FEATURES="$skx,avx2,fma,f16c" DDP_CPU_ISA=avx2 "$probe")
check "cap over preset: models/ops sets" "$(echo "$lib" | sed -n 's/^coretype=\([^ ]*\) .*/\1/p')" Haswell
# shellcheck disable=SC2016
check "cap over preset: ddp-launch exports" "$(OPENBLAS_CORETYPE=SkylakeX DDP_SIMULATE_CPU_FEATURES="$skx,avx2,fma,f16c" \
    DDP_CPU_ISA=avx2 "$launch" sh -c 'echo "$OPENBLAS_CORETYPE"')" Haswell
# A DDP_CPU_ISA that is not a level is refused by both, naming the levels.
out=$(DDP_CPU_ISA=avx3 "$launch" true 2>&1)
check "bad DDP_CPU_ISA: ddp-launch exit status" "$?" 1
case $out in *"DDP_CPU_ISA='avx3'"*"baseline, avx2, avx512 or native"*) check "bad DDP_CPU_ISA: message" named named ;;
    *) check "bad DDP_CPU_ISA: message" "$out" "DDP_CPU_ISA='avx3' ... baseline, avx2, avx512 or native" ;; esac
DDP_CPU_ISA=avx3 "$probe" >/dev/null 2>&1
check "bad DDP_CPU_ISA: models/ops exit status" "$?" 2
# A preset at or below the cap is the user's choice and stays.
lib=$(OPENBLAS_CORETYPE=Prescott DDP_SIMULATE_CPU_FEATURES="$skx,avx2,fma,f16c" DDP_CPU_ISA=avx2 "$probe")
check "preset below the cap kept" "$(echo "$lib" | sed -n 's/^coretype=\([^ ]*\) .*/\1/p')" Prescott
exit $((fails > 0))
