/* gpt2_mfu.h - the GPT's model FLOPs as llm.c counts them, accelerators' peaks, and the model FLOPs
 * utilisation (MFU). Pure functions: no device, no I/O. */
#ifndef GPT2_MFU_H
#define GPT2_MFU_H

#include <stdint.h>

#include "gpt2.h"

/* Which of an accelerator's peaks a run is measured against. */
typedef enum mfu_precision {
    MFU_16BIT = 0, /* bf16 or fp16 inputs on tensor cores, fp32 accumulation, dense */
    MFU_TF32,      /* fp32 GEMMs on TF32 tensor cores (--tf32), dense */
    MFU_FP32       /* fp32 without tensor cores */
} mfu_precision;

/* Parameters with wte's padding rows (Vp x C, not V x C): llm.c's num_parameters, which its MFU
 * counts (d12: 124,475,904). */
uint64_t mfu_gpt2_n_params_padded(const gpt2_config *cfg);

/* Model FLOPs per trained token at sequence length T, llm.c's gpt2_estimate_mfu: 6 N + 6 L C T,
 * N from mfu_gpt2_n_params_padded (forward and backward of every weight, and of the attention's
 * two T-long products). d12 at T 1024: 803,478,528. */
uint64_t mfu_gpt2_flops_per_token(const gpt2_config *cfg, int T);

/* The peak of device `name` (as cudaGetDeviceProperties names it, e.g. "NVIDIA H100 80GB HBM3")
 * in TFLOP/s for precision p, from NVIDIA's datasheets; matched by model name within `name`.
 * Returns -1 for a device not in the table, a precision it lacks, or a NULL or empty name
 * (llm.c's "don't know", which it prints as -100 %). */
double mfu_peak_tflops(const char *name, mfu_precision p);

/* The model FLOPs utilisation, a fraction: tokens_per_s_per_device x flops_per_token over
 * peak_tflops x 1e12. Returns -1 when the peak is unknown (not positive) or the rate is not a
 * positive finite number. */
double mfu_value(double tokens_per_s_per_device, double flops_per_token, double peak_tflops);

#endif /* GPT2_MFU_H */
