/* test_switches.c - the switches of models/ops/switches.h (each change to the default bf16 path
 * since run 4, turned off by its environment variable set to 0) and the kernel configurations of
 * models/ops/device_limits.h, on the CPU: the values taken and refused, the start-up line, the
 * fused ops left out of a table, and the choices made from each architecture's shared memory.
 * The model's side (the fallbacks the GPT then takes) is test_gpt2's; the CUDA kernels' own,
 * test_cuda_gpt's check_switches_off (GPU).
 */
#include <stdlib.h>
#include <string.h>

#include "device_limits.h"
#include "switches.h"
#include "testutil.h"

static void unset_all(void)
{
    for (int i = 0; i < OPS_SW_COUNT; i++)
        unsetenv(ops_switch_info((ops_switch)i)->var);
    unsetenv("DDP_FLASH_LOADS");
}

/* Every row filled, every variable a distinct DDP_ name. */
static void check_table(void)
{
    for (int i = 0; i < OPS_SW_COUNT; i++) {
        const ops_switch_desc *d = ops_switch_info((ops_switch)i);
        CHECK(d && d->var && !strncmp(d->var, "DDP_", 4) && d->commit && *d->commit && d->change &&
                  *d->change && d->restores && *d->restores,
              "switch %d: an incomplete row", i);
        for (int j = 0; d && j < i; j++)
            CHECK(strcmp(d->var, ops_switch_info((ops_switch)j)->var) != 0, "%s twice", d->var);
    }
    CHECK(ops_switch_info(OPS_SW_COUNT) == NULL, "no row past the table");
}

static void check_values(void)
{
    unset_all();
    const char *var = ops_switch_info(OPS_SW_ENC_SEG)->var;
    CHECK(ops_switch_on(OPS_SW_ENC_SEG), "unset: on");
    CHECK(ops_switches_check() == DDP_OK && !*ops_switches_describe(), "unset: nothing to say");
    setenv(var, "0", 1);
    CHECK(!ops_switch_on(OPS_SW_ENC_SEG), "%s=0: off", var);
    CHECK(ops_switch_on(OPS_SW_LT_BIAS16), "%s=0 turns only its own change off", var);
    CHECK(ops_switches_check() == DDP_OK, "0 is taken");
    const char *text = ops_switches_describe();
    CHECK(strstr(text, "DDP_ENC_SEG=0 (encoder_dwte_kernel") != NULL,
          "the start-up line names the switch and the path it restores: '%s'", text);
    setenv("DDP_FLASH_LOADS", "plain", 1);
    text = ops_switches_describe();
    CHECK(strstr(text, "DDP_ENC_SEG=0") && strstr(text, ", DDP_FLASH_LOADS=plain"),
          "the older variables too: '%s'", text);
    setenv(var, "1", 1);
    CHECK(ops_switch_on(OPS_SW_ENC_SEG) && ops_switches_check() == DDP_OK, "1: on");
    setenv(var, "", 1);
    CHECK(ops_switch_on(OPS_SW_ENC_SEG) && ops_switches_check() == DDP_OK, "empty: on");
    setenv(var, "off", 1);
    CHECK(ops_switches_check() == DDP_ERR_INVALID_ARG, "%s=off refused", var);
    ops_handle *ops = NULL;
    CHECK(ops_open(NULL, 1, &ops) == DDP_ERR_INVALID_ARG && !ops, "ops_open refuses it too");
    unset_all();
}

static ddp_status fake_gelu_fwd(const ops_handle *o, ddp_dtype p, const void *x, const void *w,
                                const float *b, int batch, int in, int out, void *pre, void *y)
{
    (void)o, (void)p, (void)x, (void)w, (void)b, (void)batch, (void)in, (void)out, (void)pre;
    (void)y;
    return DDP_OK;
}

static ddp_status fake_gelu_bwd(const ops_handle *o, ddp_dtype p, const void *w, const void *dy,
                                const void *pre, int batch, int in, int out, void *dx)
{
    (void)o, (void)p, (void)w, (void)dy, (void)pre, (void)batch, (void)in, (void)out, (void)dx;
    return DDP_OK;
}

static ddp_status fake_add_ln(const ops_handle *o, ddp_dtype act, float *y, const float *a,
                              const void *b, void *out, float *mean, float *rstd, const float *w,
                              const float *bias, int rows, int C)
{
    (void)o, (void)act, (void)y, (void)a, (void)b, (void)out, (void)mean, (void)rstd, (void)w;
    (void)bias, (void)rows, (void)C;
    return DDP_OK;
}

/* ops_switches_apply leaves exactly the switched-off fused ops out. */
static void check_apply(void)
{
    ops_handle full = {0};
    full.linear_gelu_fwd = fake_gelu_fwd;
    full.linear_bwd_input_gelu = fake_gelu_bwd;
    full.add_layernorm_fwd = fake_add_ln;
    ops_handle t = full;
    unset_all();
    ops_switches_apply(&t);
    CHECK(t.linear_gelu_fwd && t.linear_bwd_input_gelu && t.add_layernorm_fwd, "unset: kept");
    setenv("DDP_LT_EPILOGUES", "0", 1);
    ops_switches_apply(&t);
    CHECK(!t.linear_gelu_fwd && !t.linear_bwd_input_gelu && t.add_layernorm_fwd,
          "DDP_LT_EPILOGUES=0: the GELU epilogues out, the add + LayerNorm kept");
    unset_all();
    t = full;
    setenv("DDP_ADD_LN_FUSED", "0", 1);
    ops_switches_apply(&t);
    CHECK(t.linear_gelu_fwd && !t.add_layernorm_fwd, "DDP_ADD_LN_FUSED=0: only it out");
    unset_all();
    ops_switches_apply(NULL);
}

/* The choices on each architecture's shared memory (the guide's numbers, device_limits.h), and the
 * device's own numbers replacing them. */
static void check_limits(void)
{
    dev_limits a100 = dev_limits_default(8, 0), ada = dev_limits_default(8, 9);
    dev_limits h100 = dev_limits_default(9, 0), ga102 = dev_limits_default(8, 6);
    CHECK(h100.smem_block_optin == 227 * 1024 && h100.smem_sm == 228 * 1024, "sm_90: 227/228 KiB");
    CHECK(a100.smem_block_optin == 163 * 1024 && ada.smem_block_optin == 99 * 1024,
          "sm_80 163 KiB, sm_89 99 KiB a block");
    /* LayerNorm's fused backward: 8 warps x 2 x C floats (d12 768: 48 KiB; d48 1600: 100 KiB;
     * 2560: 160 KiB) */
    CHECK(dev_ln_bwd_fused_fits(&ga102, 8, 768) && dev_ln_bwd_fused_fits(&h100, 8, 768),
          "d12's width fits everywhere");
    CHECK(!dev_ln_bwd_fused_fits(&ga102, 8, 1600) && !dev_ln_bwd_fused_fits(&ada, 8, 1600),
          "d48's 100 KiB does not fit sm_86/89's 99 KiB: the two kernels");
    CHECK(dev_ln_bwd_fused_fits(&a100, 8, 2560) && dev_ln_bwd_fused_fits(&h100, 8, 2560),
          "160 KiB fits sm_80 and sm_90");
    CHECK(!dev_ln_bwd_fused_fits(&h100, 8, 4000) && !dev_ln_bwd_fused_fits(&h100, 8, 0),
          "wider than the device, or no width: the two kernels");
    /* async3: three dK/dV blocks of 56,320 bytes (+ 1 KiB reserved each) */
    size_t kv = 56320;
    CHECK(dev_blocks_per_sm(&h100, kv) == 4 && dev_blocks_per_sm(&a100, kv) == 2 &&
              dev_blocks_per_sm(&ga102, kv) == 1,
          "dK/dV blocks per SM by shared memory: sm_90 4, sm_80 2, sm_86 1");
    CHECK(dev_flash_loads(&h100, 2, kv) == 2, "sm_90 keeps async3");
    CHECK(dev_flash_loads(&a100, 2, kv) == 1 && dev_flash_loads(&ga102, 2, kv) == 1,
          "sm_80 and sm_86 run async instead");
    CHECK(dev_flash_loads(&a100, 0, kv) == 0 && dev_flash_loads(&a100, 1, kv) == 1,
          "plain and async as asked");
    dev_limits read = dev_limits_make(8, 0, 200 * 1024, 240 * 1024, 0, true);
    CHECK(read.smem_block_optin == 200 * 1024 && read.smem_sm == 240 * 1024 &&
              read.smem_reserved == 0 && dev_flash_loads(&read, 2, kv) == 2,
          "the device's own numbers win over the table");
    dev_limits unread = dev_limits_make(8, 0, 0, 0, 0, false);
    CHECK(unread.smem_sm == a100.smem_sm && unread.smem_reserved == 1024, "unread: the table's");
    dev_limits later = dev_limits_default(12, 0);
    CHECK(later.smem_block_optin == 99 * 1024, "an architecture not in the table: the smallest");
}

int main(void)
{
    check_table();
    check_values();
    check_apply();
    check_limits();
    if (CHECK_DONE())
        return 1;
    printf("test_switches: passed\n");
    return 0;
}
