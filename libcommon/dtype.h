/* dtype.h — the floating-point element types of model weights, and exact conversions.
 *
 * ftk stores weights as float32, float16 (IEEE binary16) or bfloat16 (the top 16 bits of
 * a float32). Names follow PyTorch's torch_dtype spelling ("float32", "float16",
 * "bfloat16"); safetensors spells them F32, F16, BF16.
 *
 * Conversions:
 *  - widening (f16 → f32, bf16 → f32) is exact;
 *  - narrowing rounds to nearest, ties to even (what PyTorch's .to() and numpy's astype
 *    do); values too large for f16 become ±inf; f16 subnormals are produced; NaN stays
 *    NaN (quiet) and keeps its sign;
 *  - f16 ↔ bf16 goes through f32, so it rounds once (f32 holds both exactly).
 * dtype_convert() never fails for the three types; it works on any number of elements
 * and the regions must not overlap.
 */
#ifndef FTK_DTYPE_H
#define FTK_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum { DT_INVALID = 0, DT_F32, DT_F16, DT_BF16 } dtype_t;

static inline size_t dtype_size(dtype_t t) { return t == DT_F32 ? 4 : t == DT_INVALID ? 0 : 2; }

/* "float32" | "float16" | "bfloat16", and the short forms fp32/f32, fp16/f16/half,
 * bf16. DT_INVALID for anything else. */
dtype_t dtype_parse(const char *s);
const char *dtype_name(dtype_t t); /* "float32", … */

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even; overflow correctly gives inf */
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* Converts n elements from src (type from) to dst (type to); same type is a copy. */
void dtype_convert(void *dst, dtype_t to, const void *src, dtype_t from, size_t n);

/* Counts NaN and infinite values among n elements. */
void dtype_count_nonfinite(const void *p, dtype_t t, size_t n, uint64_t *nan, uint64_t *inf);

#endif
