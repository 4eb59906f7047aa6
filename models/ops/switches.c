/* switches.c - the table of switches.h: each change to the default bf16 path since run 4, its
 * environment variable, and the path its 0 restores.
 */
#include "switches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ops_switch_desc table[OPS_SW_COUNT] = {
    [OPS_SW_LT_BIAS16] = {"DDP_LT_BIAS16", "7fb11b5", "bf16 outputs on cuBLASLt's bias epilogue",
                          "bf16 outputs through fp32 scratch and bias_store_kernel", true},
    [OPS_SW_LT_EPILOGUES] = {"DDP_LT_EPILOGUES", "17c1dc0",
                             "the MLP's GELU in cuBLASLt's GELU_AUX_BIAS and DGELU epilogues",
                             "the GELU in kernels of its own after and before the GEMMs", true},
    [OPS_SW_LOGITS16] = {"DDP_GPT_LOGITS16", "18d25e2",
                         "bf16 logits, their gradient written in place by the cross-entropy",
                         "fp32 logits and cross-entropy, the gradient cast to bf16", true},
    [OPS_SW_ADD_LN] = {"DDP_ADD_LN_FUSED", "7c205f6",
                       "the residual add after attention and ln_2 in one kernel",
                       "add_kernel, then layernorm_fwd_kernel", true},
    [OPS_SW_LN_BWD_FUSED] = {"DDP_LN_BWD_FUSED", "23f4c85",
                             "LayerNorm's backward and its parameter sums in one pass",
                             "layernorm_dx_kernel, then layernorm_param_part/sum", true},
    [OPS_SW_ENC_SEG] = {"DDP_ENC_SEG", "27d2f35",
                        "the embedding's backward in 32-entry segments of the sorted tokens",
                        "encoder_dwte_kernel, a block per run of equal tokens", true},
    [OPS_SW_FLASH_BF16OUT] = {"DDP_FLASH_BF16_OUT", "b31485f",
                              "the attention kernels' bf16 outputs written in the model's rows",
                              "fp32 heads merged by heads_merge4, dout split for delta", true},
    [OPS_SW_CLIP_DEVICE] = {"DDP_CLIP_DEVICE", "e85b878",
                            "the gradient norm and clip factor kept on the device",
                            "the norm fetched by the host, which passes the factor", true},
    [OPS_SW_READ_COPY] = {"DDP_GPT_READ_COPY", "020df45",
                          "16-bit runs read wte, wpe, LayerNorm and biases from the 16-bit copy",
                          "the passes read them from the fp32 master (unsharded runs)", true},
    [OPS_SW_CUDNN_DET] = {"DDP_CUDNN_DETERMINISTIC", "(issue 42)",
                          "cuDNN's attention backward writes dQ by its matmul (deterministic)",
                          "dQ summed in an fp32 accumulator with atomics, then copied", false},
};

/* The older variables that choose a path, printed with the switches when set. */
static const char *const older[] = {"DDP_CUDA_ATTENTION", "DDP_FLASH_IMPL", "DDP_FLASH_LOADS",
                                    "DDP_GPT_ACTIVATIONS", "DDP_CUDNN_BENCHMARK"};

const ops_switch_desc *ops_switch_info(ops_switch s)
{
    return (int)s >= 0 && s < OPS_SW_COUNT ? &table[s] : NULL;
}

bool ops_switch_on(ops_switch s)
{
    const ops_switch_desc *d = ops_switch_info(s);
    const char *v = d ? getenv(d->var) : NULL;
    return !(v && strcmp(v, "0") == 0);
}

ddp_status ops_switches_check(void)
{
    for (int i = 0; i < OPS_SW_COUNT; i++) {
        const char *v = getenv(table[i].var);
        if (!v || !*v || !strcmp(v, "0") || !strcmp(v, "1"))
            continue;
        DDP_ERROR("%s=%s: use 0 (off: %s) or 1 (the default: %s); docs/running.md lists the "
                  "switches", table[i].var, v, table[i].restores, table[i].change);
        return DDP_ERR_INVALID_ARG;
    }
    return DDP_OK;
}

/* Appends "sep text" to buf (size n, used *len), cut at the end of the buffer. */
static void append(char *buf, size_t n, size_t *len, const char *text)
{
    int k = snprintf(buf + *len, n - *len, "%s%s", *len ? ", " : "", text);
    if (k > 0)
        *len = *len + (size_t)k < n ? *len + (size_t)k : n - 1;
}

const char *ops_switches_describe(void)
{
    static char text[1536];
    char item[256];
    size_t len = 0;
    text[0] = '\0';
    for (int i = 0; i < OPS_SW_COUNT; i++) {
        const char *v = getenv(table[i].var);
        if (!v || !*v)
            continue;
        snprintf(item, sizeof item, "%s=%s (%s)", table[i].var, v,
                 strcmp(v, "0") ? "the default" : table[i].restores);
        append(text, sizeof text, &len, item);
    }
    for (size_t i = 0; i < sizeof older / sizeof older[0]; i++) {
        const char *v = getenv(older[i]);
        if (!v || !*v)
            continue;
        snprintf(item, sizeof item, "%s=%s", older[i], v);
        append(text, sizeof text, &len, item);
    }
    return text;
}

void ops_switches_apply(ops_handle *ops)
{
    if (!ops)
        return;
    if (!ops_switch_on(OPS_SW_LT_EPILOGUES)) {
        ops->linear_gelu_fwd = NULL;
        ops->linear_bwd_input_gelu = NULL;
    }
    if (!ops_switch_on(OPS_SW_ADD_LN))
        ops->add_layernorm_fwd = NULL;
}
