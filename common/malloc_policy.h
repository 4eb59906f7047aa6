/* malloc_policy.h - keeps large buffers in glibc's heap for ddp-train and ddp-allreduce-bench.
 *
 * Open MPI allocates scratch buffers as large as (a share of) the message for each all-reduce and
 * frees them after. From 32 MiB (glibc's largest dynamic mmap threshold) glibc maps fresh pages for each
 * buffer and unmaps them on free; below it, freed memory at the top of the heap past the trim
 * threshold goes back to the kernel too. Either way every all-reduce pays page faults on memory
 * it just had: measured on one host, 2 ranks, 32-128 MiB all-reduces at 0.5 GB/s instead of
 * 4.7-6.1 GB/s with the thresholds below (benchmarks/allreduce_bench.c, fp32 sums).
 */
#ifndef COMMON_MALLOC_POLICY_H
#define COMMON_MALLOC_POLICY_H

/* Sets glibc's mmap threshold to 256 MiB and its trim threshold to 1 GiB (mallopt), each unless the
 * environment sets it already (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_: the user's choice).
 * Call first in main(). */
void malloc_policy(void);
/* What malloc_policy() did, for start-up reports. */
const char *malloc_describe(void);

#endif /* COMMON_MALLOC_POLICY_H */
