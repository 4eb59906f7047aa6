/* blas_probe.c - the models' side of the OpenBLAS policy test: applies ops_blas_prefer_fast_kernels
 * (which may re-execute this program) and prints what the library decided and what OpenBLAS runs:
 * "coretype=<OPENBLAS_CORETYPE or -> by=<who set it or -> blas=<ops_blas_describe()>". */
#include <stdio.h>
#include <stdlib.h>

#include "ops.h"

static const char *or_dash(const char *s)
{
    return s ? s : "-";
}

int main(int argc, char **argv)
{
    (void)argc;
    if (ops_blas_prefer_fast_kernels(argv) != 0)
        return 2;
    printf("coretype=%s by=%s blas=%s\n", or_dash(getenv("OPENBLAS_CORETYPE")),
           or_dash(getenv("DDP_OPENBLAS_CORETYPE_BY")), ops_blas_describe());
    return 0;
}
