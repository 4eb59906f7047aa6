#!/usr/bin/env bash
# check_exports.sh - libddp.so exports exactly the functions its public headers (ddp.h and the
# sub-headers ddp_checkpoint.h, ddp_trace.h, ddp_metrics.h, ddp_straggler.h) declare with DDP_API
# (nothing internal leaks: gnu_symbol_visibility hidden), and links no compute library (the models
# own GEMM and convolutions: no OpenBLAS, oneDNN, cuBLAS or cuDNN).
# Usage: check_exports.sh LIBDDP_SO DDP_H [SUB_HEADER...]
set -euo pipefail
lib=$1
shift
declared=$(cat "$@" | grep -E '^DDP_API' | grep -oE '\bddp_[a-z0-9_]+\(' | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWDBRV]$/ {print $3}' | sort -u)
status=0
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$extra" ]; then
  echo "FAIL: libddp exports symbols the public headers do not declare with DDP_API (make them static or hidden):"
  echo "$extra" | sed 's/^/  /'
  status=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: the public headers declare functions libddp does not export:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $NF}' | tr -d '[]')
if echo "$needed" | grep -qiE 'openblas|blas|dnnl|cublas|cudnn'; then
  echo "FAIL: libddp links a compute library: $(echo "$needed" | grep -iE 'openblas|blas|dnnl|cublas|cudnn' | tr '\n' ' ')"
  status=1
fi
echo "libddp exports $(echo "$exported" | wc -l) functions; the public headers declare $(echo "$declared" | wc -l); links: $(echo "$needed" | tr '\n' ' ')"
exit $status
