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
exit $((fails > 0))
