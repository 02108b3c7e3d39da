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
 * Why 16 random bits are exactly enough: fp32 has 23 fraction bits and bf16 7, with the
 * same sign and exponent fields, so every finite fp32 (subnormals included: bf16's
 * subnormals are fp32's with the low 16 bits cut) lies on a grid of 2¹⁶ steps between
 * its two bf16 neighbours. The cut fraction is c/2¹⁶ for an integer c, and a uniform r of
 * 16 bits carries into bit 16 exactly when r ≥ 2¹⁶ − c: probability c/2¹⁶, with no bias
 * at all. More bits could change nothing (x has no more to cut); fewer would round the
 * probability itself, biasing updates smaller than the lost resolution.
 *
 * Bits: bk_sround_hash(key, i) is a 64-bit hash of (key, i) (SplitMix64's finaliser
 * applied to a Weyl sequence), so element i of any slice gets the same bits without a
 * generator state: the result is independent of how elements are spread over ranks or
 * threads. AdamW draws one hash per element and cuts it in three 16-bit fields, one per
 * state it stores (bk_sround_field: bits 63…48 for p, 47…32 for m, 31…16 for v).
 * key = bk_sround_key(seed, step, tensor) names one tensor's draw at one optimizer step.
 *
 * BK_SROUND_HASH3 is the rule before 2026-11-28, a hash per stored state (bk_sround_bits3,
 * 3·i + w with w = 0, 1, 2 for p, m, v): kept selectable (bk_adamw_t.stochastic,
 * FTK_SROUND_HASHES=3) so a GPU can time the two; its loop takes about twice the integer
 * instructions for the rounding (docs/gpu.md).
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

/* How bf16 stores of AdamW round (bk_adamw_t.stochastic). */
enum {
    BK_ROUND_NEAREST = 0, /* to nearest even */
    BK_SROUND = 1,        /* stochastically, one hash per element (16 bits a state) */
    BK_SROUND_HASH3 = 2   /* stochastically, one hash per stored state (for comparison) */
};

BK_HD uint64_t bk_sround_hash(uint64_t key, int64_t i)
{
    return bk_mix64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
}

/* State w's (0 p, 1 m, 2 v) 16 random bits of its element's hash h. */
BK_HD uint32_t bk_sround_field(uint64_t h, int w) { return (uint32_t)(h >> (48 - 16 * w)) & 0xffffu; }

/* BK_SROUND_HASH3's bits of state w of element i (the low 16 bits are used). */
BK_HD uint32_t bk_sround_bits3(uint64_t key, int64_t i, int w)
{
    return (uint32_t)(bk_sround_hash(key, 3 * i + w) >> 32);
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
