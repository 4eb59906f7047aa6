#!/bin/bash
# check_symbols.sh LIBDDP LIBFAKENCCL - every nccl* function libddp imports is defined by the fake
# NCCL (else, under LD_PRELOAD, the real NCCL's would get the fake's communicators), and the fake
# exports nothing but nccl* functions and fake_nccl_marker.
set -euo pipefail
libddp=$1
fake=$2
needed=$(nm -D --undefined-only "$libddp" | awk '{print $NF}' | sed 's/@.*//' | grep '^nccl' | sort -u)
defined=$(nm -D --defined-only "$fake" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
missing=$(comm -23 <(echo "$needed") <(echo "$defined"))
extra=$(echo "$defined" | grep -v -e '^nccl' -e '^fake_nccl_marker$' -e '^_init$' -e '^_fini$' || true)
echo "libddp imports: $(echo $needed)"
status=0
if [ -z "$needed" ]; then
    echo "FAIL: libddp imports no nccl* function (built without NCCL?)"; status=1
fi
if [ -n "$missing" ]; then
    echo "FAIL: the fake NCCL lacks: $(echo $missing)"; status=1
fi
if [ -n "$extra" ]; then
    echo "FAIL: the fake NCCL also exports: $(echo $extra)"; status=1
fi
[ $status = 0 ] && echo "the fake NCCL defines all of them"
exit $status
