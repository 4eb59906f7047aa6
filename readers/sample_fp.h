/* sample_fp.h - the fingerprint of the samples a training step reads: the sum (mod 2^64) of a
 * 64-bit hash (SplitMix64's finaliser) of each sample's index in the data set (MNIST: the image;
 * GPT-2: the token window). A sum does not depend on the order of the samples or on which rank read
 * which, so a step's fingerprint summed over the ranks is the same at every world size that reads
 * the same global batch, and differs (but for a 2^-64 chance) when a sample is skipped, repeated or
 * replaced. Header-only. */
#ifndef READERS_SAMPLE_FP_H
#define READERS_SAMPLE_FP_H

#include <stdint.h>

static inline uint64_t sample_fp(uint64_t index)
{
    uint64_t z = index + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif /* READERS_SAMPLE_FP_H */
