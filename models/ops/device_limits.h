/* device_limits.h - kernel configurations chosen from a GPU's own limits: shared memory per block
 * (opt-in) and per SM, read from the device (cudaDevAttrMaxSharedMemoryPerBlockOptin,
 * cudaDevAttrMaxSharedMemoryPerMultiprocessor, cudaDevAttrReservedSharedMemoryPerBlock) or, where
 * the driver does not say, the defaults of the compute capability (CUDA C++ Programming Guide,
 * the technical specifications per compute capability). Pure host functions of plain numbers, so
 * the CPU tests check the choices for every architecture (test_device_limits).
 */
#ifndef OPS_DEVICE_LIMITS_H
#define OPS_DEVICE_LIMITS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dev_limits {
    int cc_major, cc_minor;
    size_t smem_block_optin; /* the most dynamic shared memory one block may opt in to */
    size_t smem_sm;          /* shared memory of one SM, for all its resident blocks */
    size_t smem_reserved;    /* shared memory the system reserves per block */
} dev_limits;

/* The limits of compute capability major.minor, in KiB per block (opt-in) and per SM: 7.0 and 7.2
 * 96 and 96, 7.5 64 and 64 (nothing reserved); 8.0 and 8.7 163 and 164; 8.6 and 8.9 99 and 100;
 * 9.0 227 and 228; from 8.0 on 1 KiB reserved per block. Other majors (10, 12, newer) are not
 * assumed: they take the smallest of the 8.x rows (99 and 100), which only makes a choice more
 * careful; the device's own numbers replace these wherever it gives them. */
static inline dev_limits dev_limits_default(int major, int minor)
{
    dev_limits l = {major, minor, 0, 0, 1024};
    size_t kib = 1024, block = 99, sm = 100;
    if (major == 7) {
        block = sm = minor == 5 ? 64 : 96;
        l.smem_reserved = 0;
    } else if (major == 8 && (minor == 0 || minor == 7)) {
        block = 163, sm = 164;
    } else if (major == 9) {
        block = 227, sm = 228;
    } else if (major < 7) {
        block = sm = 48;
        l.smem_reserved = 0;
    }
    l.smem_block_optin = block * kib;
    l.smem_sm = sm * kib;
    return l;
}

/* The limits read from the device where it gave them (a value 0: not read), else
 * dev_limits_default's. */
static inline dev_limits dev_limits_make(int major, int minor, size_t block_optin, size_t per_sm,
                                         size_t reserved, bool reserved_read)
{
    dev_limits l = dev_limits_default(major, minor);
    if (block_optin)
        l.smem_block_optin = block_optin;
    if (per_sm)
        l.smem_sm = per_sm;
    if (reserved_read)
        l.smem_reserved = reserved;
    return l;
}

/* How many blocks of `bytes` dynamic shared memory share one SM by shared memory alone (0: one
 * block does not fit). */
static inline int dev_blocks_per_sm(const dev_limits *l, size_t bytes)
{
    if (bytes > l->smem_block_optin)
        return 0;
    return (int)(l->smem_sm / (bytes + l->smem_reserved));
}

/* LayerNorm's fused backward (cuda_gpt.cu layernorm_bwd_fused_kernel) takes 2 x warps x C floats
 * of shared memory: whether that fits one block of this device (else the two-kernel path). */
static inline bool dev_ln_bwd_fused_fits(const dev_limits *l, int warps, int C)
{
    size_t bytes = 2 * (size_t)warps * (size_t)C * sizeof(float);
    return C > 0 && warps > 0 && dev_blocks_per_sm(l, bytes) >= 1;
}

/* The attention kernels' loads as run (cuda_flash.cu's LOADS_*: 0 plain, 1 async, 2 async3) for
 * the mode asked for: async3 builds the dK/dV kernel for three blocks per SM, which only pays
 * where three of its blocks (kv_bytes of shared memory each) fit an SM's shared memory; elsewhere
 * (sm_80: 164 KiB for 3 x 56 KiB) async, the same bits. */
static inline int dev_flash_loads(const dev_limits *l, int asked, size_t kv_bytes)
{
    if (asked == 2 && dev_blocks_per_sm(l, kv_bytes) < 3)
        return 1;
    return asked;
}

#endif /* OPS_DEVICE_LIMITS_H */
