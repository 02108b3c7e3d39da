/* rng.h — a small, seedable, portable PRNG (xoshiro256** seeded through splitmix64).
 *
 * Every random choice ftk makes (data shuffles, packing order, initialisation) goes
 * through this, so a seed gives the same result on every machine and compiler. State is
 * four uint64 words, which a checkpoint can store as they are.
 */
#ifndef FTK_RNG_H
#define FTK_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} rng_t;

static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void rng_seed(rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = rng_splitmix64(&seed);
}

static inline uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, n), n > 0, without modulo bias (rejection). */
static inline uint64_t rng_below(rng_t *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = rng_next(r);
    while (x >= limit);
    return x % n;
}

/* Fisher–Yates shuffle of n int64 values. */
static inline void rng_shuffle_i64(rng_t *r, int64_t *v, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(r, i);
        int64_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

#endif
