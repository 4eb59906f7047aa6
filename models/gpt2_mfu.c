/* gpt2_mfu.c - the GPT's model FLOPs per token (llm.c's count), the peak table, the MFU
 * (gpt2_mfu.h). */
#include "gpt2_mfu.h"

#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

uint64_t mfu_gpt2_n_params_padded(const gpt2_config *cfg)
{
    uint64_t pad_rows = (uint64_t)(cfg->padded_vocab - cfg->vocab);
    return (uint64_t)gpt2_config_n_params(cfg) + pad_rows * (uint64_t)cfg->channels;
}

uint64_t mfu_gpt2_flops_per_token(const gpt2_config *cfg, int T)
{
    uint64_t lct = (uint64_t)cfg->layers * (uint64_t)cfg->channels * (uint64_t)T;
    return 6 * mfu_gpt2_n_params_padded(cfg) + 6 * lct;
}

/* One row of the peak table: a model name and its dense peaks in TFLOP/s (-1: none known). */
typedef struct mfu_device {
    const char *model;
    double tflops[3]; /* indexed by mfu_precision: 16-bit tensor, TF32 tensor, FP32 */
} mfu_device;

/* Dense peaks (the datasheets print the 16-bit and TF32 tensor figures "with sparsity", twice
 * these) at the boost clock, fp32 accumulation for 16 bits. The first row whose model occurs in the
 * device's name as a whole word wins, so variants come before their family:
 *   H100 SXM, PCIe, NVL: NVIDIA H100 Tensor Core GPU datasheet (1,979 / 1,513 / 1,671 bf16 and
 *     989 / 756 / 835 TF32 TFLOP/s with sparsity; fp32 67 / 51 / 60).
 *   H200 SXM, NVL: NVIDIA H200 Tensor Core GPU datasheet (as H100 SXM / NVL).
 *   GH200: NVIDIA GH200 Grace Hopper Superchip datasheet (its GPU is an H100 SXM's).
 *   A100 (SXM4 and PCIe, 40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet (312 bf16, 156 TF32,
 *     19.5 fp32).
 *   L40S: NVIDIA L40S datasheet (362.05 bf16, 183 TF32, 91.6 fp32).
 *   A10: NVIDIA A10 Tensor Core GPU datasheet (125 bf16, 62.5 TF32, 31.2 fp32).
 *   GeForce RTX 4090: NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A (165.2 bf16 with
 *     fp32 accumulation, 82.6 TF32, 82.6 fp32); its laptop part and the 4090 D have other core
 *     counts and clocks and are left unknown.
 *   B200: NVIDIA HGX B200 datasheet, per GPU of 8 (36 PFLOP/s bf16 and 18 TF32 with sparsity, 600
 *     TFLOP/s fp32 per board).
 * llm.c's mfu.h gives 989.4 (H100 SXM and H200), 756 (H100 PCIe) and 312 (A100) in bf16. */
static const mfu_device mfu_devices[] = {
    {"H100 PCIe", {756.5, 378.0, 51.0}},
    {"H100 NVL", {835.5, 417.5, 60.0}},
    {"H100", {989.4, 494.7, 67.0}},
    {"H200 NVL", {835.5, 417.5, 60.0}},
    {"H200", {989.4, 494.7, 67.0}},
    {"GH200", {989.4, 494.7, 67.0}},
    {"A100", {312.0, 156.0, 19.5}},
    {"L40S", {362.05, 183.0, 91.6}},
    {"A10", {125.0, 62.5, 31.2}},
    {"RTX 4090 Laptop", {-1.0, -1.0, -1.0}},
    {"RTX 4090 D", {-1.0, -1.0, -1.0}},
    {"RTX 4090", {165.2, 82.6, 82.6}},
    {"B200", {2250.0, 1125.0, 75.0}},
};

/* Whether `word` occurs in `name` (case ignored) with no letter or digit right before or after. */
static int mfu_has_word(const char *name, const char *word)
{
    size_t n = strlen(name), w = strlen(word);
    for (size_t i = 0; i + w <= n; i++) {
        size_t k = 0;
        while (k < w && tolower((unsigned char)name[i + k]) == tolower((unsigned char)word[k]))
            k++;
        int before = i > 0 && isalnum((unsigned char)name[i - 1]);
        int after = i + w < n && isalnum((unsigned char)name[i + w]);
        if (k == w && !before && !after)
            return 1;
    }
    return 0;
}

double mfu_peak_tflops(const char *name, mfu_precision p)
{
    if (!name || !*name || p < MFU_16BIT || p > MFU_FP32)
        return -1.0;
    for (size_t i = 0; i < sizeof mfu_devices / sizeof mfu_devices[0]; i++)
        if (mfu_has_word(name, mfu_devices[i].model))
            return mfu_devices[i].tflops[p];
    return -1.0;
}

double mfu_value(double tokens_per_s_per_device, double flops_per_token, double peak_tflops)
{
    if (!(peak_tflops > 0.0) || !isfinite(peak_tflops) || !(tokens_per_s_per_device > 0.0) ||
        !isfinite(tokens_per_s_per_device))
        return -1.0;
    return tokens_per_s_per_device * flops_per_token / (peak_tflops * 1e12);
}
