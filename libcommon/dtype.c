#include "dtype.h"


dtype_t dtype_parse(const char *s)
{
    static const struct {
        const char *name;
        dtype_t t;
    } names[] = {{"float32", DT_F32}, {"fp32", DT_F32},  {"f32", DT_F32},   {"float", DT_F32},
                 {"float16", DT_F16}, {"fp16", DT_F16},  {"f16", DT_F16},   {"half", DT_F16},
                 {"bfloat16", DT_BF16}, {"bf16", DT_BF16}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0)
            return names[i].t;
    return DT_INVALID;
}

const char *dtype_name(dtype_t t)
{
    switch (t) {
    case DT_F32: return "float32";
    case DT_F16: return "float16";
    case DT_BF16: return "bfloat16";
    default: return "invalid";
    }
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        float f = (float)m * 0x1p-24f; /* subnormal (or zero): exact in f32 */
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* ≥ 65520 (halfway above the largest half, 65504) rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* Below the smallest normal half (2^-14): adding 0.5, whose ulp is 2^-24 (the
         * subnormal step), makes the FPU round to nearest even at exactly that step. */
        float t;
        memcpy(&t, &a, 4);
        t += 0.5f;
        uint32_t tu;
        memcpy(&tu, &t, 4);
        return (uint16_t)(sign | (tu - 0x3f000000u));
    }
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u)); /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

void dtype_convert(void *dst, dtype_t to, const void *src, dtype_t from, size_t n)
{
    if (to == from) {
        memcpy(dst, src, n * dtype_size(to));
        return;
    }
    const uint16_t *s16 = src;
    const float *s32 = src;
    uint16_t *d16 = dst;
    float *d32 = dst;
    if (to == DT_F32 && from == DT_BF16) { /* the weights load's widening: a loop the compiler vectorises */
        for (size_t i = 0; i < n; i++)
            d32[i] = bf16_to_f32(s16[i]);
    } else if (to == DT_F32) { /* from f16 (to == from is the copy above) */
        for (size_t i = 0; i < n; i++)
            d32[i] = f16_to_f32(s16[i]);
    } else if (from == DT_F32) {
        for (size_t i = 0; i < n; i++)
            d16[i] = to == DT_BF16 ? f32_to_bf16(s32[i]) : f32_to_f16(s32[i]);
    } else {
        for (size_t i = 0; i < n; i++) {
            float x = from == DT_BF16 ? bf16_to_f32(s16[i]) : f16_to_f32(s16[i]);
            d16[i] = to == DT_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        }
    }
}

void dtype_count_nonfinite(const void *p, dtype_t t, size_t n, uint64_t *nan, uint64_t *inf)
{
    uint64_t cn = 0, ci = 0;
    if (t == DT_F32) {
        const uint32_t *u = p;
        for (size_t i = 0; i < n; i++) {
            uint32_t a = u[i] & 0x7fffffffu;
            cn += a > 0x7f800000u;
            ci += a == 0x7f800000u;
        }
    } else {
        const uint16_t *u = p;
        uint16_t exp = t == DT_BF16 ? 0x7f80u : 0x7c00u;
        for (size_t i = 0; i < n; i++) {
            uint16_t a = u[i] & 0x7fffu;
            cn += a > exp;
            ci += a == exp;
        }
    }
    *nan += cn;
    *inf += ci;
}
