/* blas.c - the CPU's kernel selection at start-up: the DDP_CPU_ISA cap handed to oneDNN, OpenBLAS
 * re-executed with the OPENBLAS_CORETYPE that ddp's one policy in common/blas_policy.c gives (unless
 * the user preset one), and a one-line description of the BLAS in use.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "blas_policy.h"
#include "cpu_isa.h"
#include "ops.h"

/* The policy's decision for this process; 0, or -1 after writing what is wrong (a bad simulated
 * feature list or DDP_CPU_ISA value) into err. */
static int blas_decide_here(struct blas_decision *d, char *err, size_t errlen)
{
    return blas_policy_decide(getenv("OPENBLAS_CORETYPE"), getenv(BLAS_SETTER_ENV), getenv(BLAS_SIMULATE_ENV),
                              getenv(CPU_ISA_ENV), d, err, errlen);
}

int ops_blas_prefer_fast_kernels(char **argv)
{
    char err[512];
    const char *skip = getenv("DDP_NO_BLAS_REEXEC");
    struct blas_decision d;
    if (cpu_isa_check(err, sizeof err) != 0) {
        DDP_ERROR("%s", err);
        return -1;
    }
    cpu_isa_export();
    if (blas_decide_here(&d, err, sizeof err) != 0) {
        DDP_WARN("%s; leaving OpenBLAS's kernel choice alone", err);
        return 0;
    }
    if ((skip && strcmp(skip, "1") == 0) || !argv || !argv[0] || !d.apply)
        return 0;
    const char *have = openblas_get_corename();
    if (setenv("OPENBLAS_CORETYPE", d.core, 1) != 0 || setenv(BLAS_SETTER_ENV, "models", 1) != 0) {
        DDP_WARN("cannot set OPENBLAS_CORETYPE=%s; keeping OpenBLAS core %s", d.core, have);
        return 0;
    }
    if (have && strcasecmp(have, d.core) == 0)
        return 0; /* already the policy's core: the variable now tells child processes */
    DDP_DEBUG("OpenBLAS chose core %s; re-executing with OPENBLAS_CORETYPE=%s", have, d.core);
    execv("/proc/self/exe", argv);
    DDP_WARN("re-exec with OPENBLAS_CORETYPE=%s failed; keeping OpenBLAS core %s", d.core, have);
    return 0;
}

const char *ops_blas_describe(void)
{
    static char text[768];
    char policy[256] = "";
    struct blas_decision d;
    const char *config = openblas_get_config();
    const char *core = openblas_get_corename();
    char err[256];
    if (blas_decide_here(&d, err, sizeof err) == 0)
        blas_decision_describe(&d, getenv(BLAS_SETTER_ENV), policy, sizeof policy);
    snprintf(text, sizeof text, "%s core=%s threads=%d; %s", config ? config : "OpenBLAS",
             core ? core : "unknown", openblas_get_num_threads(), policy);
    return text;
}
