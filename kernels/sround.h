/* sround.h — stochastic rounding of fp32 to bf16 and its counter-based random bits, the
 * same functions on the host and in CUDA kernels (bf16-true's AdamW, docs/design.md
 * "Precision modes").
 *
 * Rounding: a float32 x is bf16 plus 16 cut bits; adding 16 random bits r to the cut
 * bits and truncating rounds x up with probability (cut bits)/2¹⁶ — the fraction of an
 * ulp that was cut — and down otherwise, so the stored value is x in expectation. NaN and
 * ±inf round to nearest even (they have nothing to cut); a finite value that rounds up
 * past the largest bf16 becomes inf, as round-to-nearest would for values that close.
 *
 * Bits: bk_sround_bits(key, i) is a hash of (key, i) (SplitMix64's finaliser applied to
 * a Weyl sequence), so element i of any slice gets the same bits without a generator
 * state: the result is independent of how elements are spread over ranks or threads.
 * key = bk_sround_key(seed, step, tensor) names one tensor's draw at one optimizer step.
 */
#ifndef FTK_SROUND_H
#define FTK_SROUND_H
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define BK_HD static __host__ __device__ __forceinline__
#else
#define BK_HD static inline
#endif

BK_HD uint64_t bk_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* tensor: the tensor's index in the model's canonical order (unit·16 + position). */
BK_HD uint64_t bk_sround_key(uint64_t seed, int64_t step, int64_t tensor)
{
    return bk_mix64(bk_mix64(bk_mix64(seed ^ 0x66746b2d73726e64ull) + (uint64_t)step) + (uint64_t)tensor);
}

BK_HD uint32_t bk_sround_bits(uint64_t key, int64_t i)
{
    return (uint32_t)(bk_mix64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) >> 32);
}

/* x rounded to bf16 with the low 16 bits of r deciding (see above). */
BK_HD uint16_t bk_sround_bf16(float x, uint32_t r)
{
    uint32_t u;
#ifdef __CUDA_ARCH__
    u = __float_as_uint(x);
#else
    memcpy(&u, &x, 4);
#endif
    if ((u & 0x7f800000u) == 0x7f800000u) { /* inf or NaN: nearest even */
        if (u & 0x007fffffu)
            return (uint16_t)((u >> 16) | 0x40);
        return (uint16_t)(u >> 16);
    }
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

#endif
