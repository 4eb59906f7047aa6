/* switches.h - environment switches that turn off, one by one, the changes made to the default
 * bf16 path since its last measurement on a GPU (docs/perf/gpu-gpt2.md's run 4, commit 218ed66),
 * each back to the path that run measured; for a GPU window where one of them fails at step 1.
 *
 * A switch is an environment variable set to 0 (the change off) or 1 (on, as unset). The model
 * and the backends read ops_switch_on() when a handle or a model is made (ops_open, gpt2_create,
 * optim_create), so a test can make one with a switch off and one without. The table, with the
 * commit each change came in and what its 0 restores, is ops_switch_info(); docs/running.md lists
 * the same, and benchmarks/gpu_gpt.sh turns them all off (and bisects them) when the default
 * fails.
 */
#ifndef OPS_SWITCHES_H
#define OPS_SWITCHES_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ops.h"

typedef enum ops_switch {
    OPS_SW_LT_BIAS16,     /* DDP_LT_BIAS16: bf16 outputs on cuBLASLt's bias epilogue */
    OPS_SW_LT_EPILOGUES,  /* DDP_LT_EPILOGUES: the MLP's GELU in cuBLASLt's epilogues */
    OPS_SW_LOGITS16,      /* DDP_GPT_LOGITS16: bf16 logits, the cross-entropy in place */
    OPS_SW_ADD_LN,        /* DDP_ADD_LN_FUSED: the residual add and ln_2 in one kernel */
    OPS_SW_LN_BWD_FUSED,  /* DDP_LN_BWD_FUSED: LayerNorm's backward in one pass */
    OPS_SW_ENC_SEG,       /* DDP_ENC_SEG: the embedding's backward in segments */
    OPS_SW_FLASH_BF16OUT, /* DDP_FLASH_BF16_OUT: the attention kernels' bf16 outputs in rows */
    OPS_SW_CLIP_DEVICE,   /* DDP_CLIP_DEVICE: the clip factor computed on the device */
    OPS_SW_READ_COPY,     /* DDP_GPT_READ_COPY: the passes read the 16-bit copy, widened */
    OPS_SW_CUDNN_DET,     /* DDP_CUDNN_DETERMINISTIC: cuDNN's attention backward deterministic
                           * (not of the default path: cuDNN's attention is DDP_CUDA_ATTENTION's) */
    OPS_SW_COUNT
} ops_switch;

typedef struct ops_switch_desc {
    const char *var;      /* the environment variable */
    const char *commit;   /* the commit that made the change */
    const char *change;   /* what the change is (on, the default) */
    const char *restores; /* what 0 runs instead: the path of run 4 */
    bool default_path;    /* a change to the default bf16 path since run 4 */
} ops_switch_desc;

/* The switch's row of the table (NULL for a value outside the enum). */
const ops_switch_desc *ops_switch_info(ops_switch s);

/* Whether change s is on: its variable unset, empty or 1; false when it is 0. Another value
 * counts as on here (ops_switches_check refuses it first). */
bool ops_switch_on(ops_switch s);

/* DDP_OK when every switch's variable is unset, empty, 0 or 1; otherwise DDP_ERR_INVALID_ARG,
 * logged with the variable, its value and the two values it takes. */
ddp_status ops_switches_check(void);

/* One line naming the switches that are set (0 or 1) and the older variables that choose a path
 * (DDP_CUDA_ATTENTION, DDP_FLASH_IMPL, DDP_FLASH_LOADS, DDP_GPT_ACTIVATIONS,
 * DDP_CUDNN_BENCHMARK) when set, e.g. "DDP_LT_EPILOGUES=0 (GELU in
 * kernels of its own), DDP_FLASH_LOADS=plain"; "" when none is. For the start-up report; the
 * text lives until the next call. */
const char *ops_switches_describe(void);

/* Clears the optional fused ops of ops whose switch is 0 (linear_gelu_fwd and
 * linear_bwd_input_gelu for DDP_LT_EPILOGUES, add_layernorm_fwd for DDP_ADD_LN_FUSED), so that the
 * model composes them from the plain ops. The backends' open functions call it; NULL is ignored. */
void ops_switches_apply(ops_handle *ops);

#ifdef __cplusplus
}
#endif

#endif /* OPS_SWITCHES_H */
