/* fake_nccl.h - what the test-only NCCL (fake_nccl.c) adds to nccl.h: its version code and
 * marker. Tests include it; libddp does not (it looks the marker up with dlsym). */
#ifndef FAKE_NCCL_H
#define FAKE_NCCL_H

#include <nccl.h>

/* ncclGetVersion's answer: the NCCL built against with patch level 99 (22899 for 2.28.x), a
 * patch level no NCCL release has used. */
#define FAKE_NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + 99)

/* Exported by the fake with the value FAKE_NCCL_VERSION_CODE; absent from every real NCCL. */
extern const int fake_nccl_marker;

#endif /* FAKE_NCCL_H */
