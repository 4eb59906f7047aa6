/* test_mfu.c - models/gpt2_mfu.c against llm.c's numbers: the parameter count with wte's padding rows
 * and 6N + 6LCT per token for GPT-2 d12 and d48, the peak table by device name and precision
 * (unknown names are -1, llm.c's -100 %), and the MFU of a known rate. */
#include <stdint.h>

#include "check.h"
#include "gpt2.h"
#include "gpt2_mfu.h"

/* N from GPT-2's tensor shapes as llm.c lays them out: wte (Vp, C), wpe (maxT, C); per layer
 * ln1 w, b (C), qkv w (3C, C) b (3C), attproj w (C, C) b (C), ln2 w, b (C), fc w (4C, C) b (4C),
 * fcproj w (C, 4C) b (C); lnf w, b (C). */
static uint64_t shapes_n_params(uint64_t Vp, uint64_t maxT, uint64_t L, uint64_t C)
{
    uint64_t layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                     (4 * C * C + C);
    return Vp * C + maxT * C + L * layer + 2 * C;
}

static void check_preset(const char *name, uint64_t want_n, uint64_t want_flops)
{
    gpt2_config cfg;
    CHECK(gpt2_config_preset(name, &cfg) == DDP_OK, "preset %s", name);
    CHECK(gpt2_config_check(&cfg) == DDP_OK && cfg.padded_vocab == 50304, "%s: Vp %d", name,
          cfg.padded_vocab);
    uint64_t n = mfu_gpt2_n_params_padded(&cfg);
    uint64_t shapes = shapes_n_params(50304, 1024, (uint64_t)cfg.layers, (uint64_t)cfg.channels);
    CHECK(n == want_n, "%s: N %llu, want %llu", name, (unsigned long long)n,
          (unsigned long long)want_n);
    CHECK(shapes == want_n, "%s: N from the shapes %llu, want %llu", name,
          (unsigned long long)shapes, (unsigned long long)want_n);
    uint64_t f = mfu_gpt2_flops_per_token(&cfg, 1024);
    CHECK(f == want_flops, "%s: FLOPs per token %llu, want %llu", name, (unsigned long long)f,
          (unsigned long long)want_flops);
    uint64_t by_formula = 6 * want_n + 6ull * (uint64_t)cfg.layers * (uint64_t)cfg.channels * 1024;
    CHECK(f == by_formula, "%s: not 6N + 6LCT", name);
}

static void check_peaks(void)
{
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H100 80GB HBM3", MFU_16BIT), 989.4, 0, 1e-12, "H100 SXM");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H200", MFU_16BIT), 989.4, 0, 1e-12, "H200");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H100 PCIe", MFU_16BIT), 756.5, 0, 1e-12, "H100 PCIe");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H100 NVL", MFU_16BIT), 835.5, 0, 1e-12, "H100 NVL");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA A100-SXM4-80GB", MFU_16BIT), 312.0, 0, 1e-12, "A100");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA A100-PCIE-40GB", MFU_TF32), 156.0, 0, 1e-12, "A100 TF32");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA A10", MFU_16BIT), 125.0, 0, 1e-12, "A10 (not A100)");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H100 80GB HBM3", MFU_TF32), 494.7, 0, 1e-12, "H100 TF32");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA H100 80GB HBM3", MFU_FP32), 67.0, 0, 1e-12, "H100 fp32");
    CHECK_CLOSE(mfu_peak_tflops("NVIDIA GeForce RTX 4090", MFU_16BIT), 165.2, 0, 1e-12, "4090");
    CHECK(mfu_peak_tflops("NVIDIA GeForce RTX 4090 Laptop GPU", MFU_16BIT) < 0, "4090 laptop");
    CHECK(mfu_peak_tflops("NVIDIA A10G", MFU_16BIT) < 0, "A10G is not an A10");
    CHECK(mfu_peak_tflops("NVIDIA GB200", MFU_16BIT) < 0, "GB200 is not a B200");
    CHECK(mfu_peak_tflops("Tesla T4", MFU_16BIT) < 0, "an unknown GPU");
    CHECK(mfu_peak_tflops("", MFU_16BIT) < 0 && mfu_peak_tflops(NULL, MFU_16BIT) < 0, "no name");
}

static void check_mfu(void)
{
    /* llm.c's d12 run on an H100 SXM at 400,000 tokens/s: 803,478,528 x 4e5 = 321.4 TFLOP/s. */
    double peak = mfu_peak_tflops("NVIDIA H100 80GB HBM3", MFU_16BIT);
    CHECK_CLOSE(mfu_value(4e5, 803478528.0, peak), 4e5 * 803478528.0 / 989.4e12, 0, 1e-12,
                "MFU of d12 at 400k tokens/s");
    /* --peak-tflops 1 on the CPU: the MFU is the model TFLOP/s itself. */
    CHECK_CLOSE(mfu_value(1234.5, 1e6, 1.0), 1234.5e6 / 1e12, 0, 1e-12, "MFU against 1 TFLOP/s");
    CHECK(mfu_value(4e5, 803478528.0, -1.0) < 0, "unknown peak: unknown MFU");
    CHECK(mfu_value(0.0, 803478528.0, 989.4) < 0, "no rate: unknown MFU");
}

int main(void)
{
    /* llm.c: d12 N = 124,475,904, 6N + 6LCT = 803.5 MFLOP per token at T 1024 */
    check_preset("d12", 124475904ull, 803478528ull);
    /* d48 (L 48, NH 25, C 1600): N = 1,557,686,400; 9.818 GFLOP per token at T 1024 */
    check_preset("d48", 1557686400ull, 9817977600ull);
    check_peaks();
    check_mfu();
    return CHECK_DONE();
}
