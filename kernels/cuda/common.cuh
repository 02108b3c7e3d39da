/* common.cuh — device helpers shared by the CUDA backend's files (cuda_internal.cuh) and the
 * attention kernels attention.cu includes (flash_attn.cuh, flash_mma.cuh); plain C++ apart
 * from the __device__ qualifiers, so that tests/gpu/flash_emu.cc compiles them on the host
 * too. Inline: every file of the backend has its own copy (no relocatable device code). */
#pragma once
#include <stdint.h>

/* libcommon/dtype.h f32_to_bf16: nearest even; NaN keeps its sign and becomes quiet. */
__device__ __forceinline__ uint16_t f32_to_bf16_dev(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* The segment holding token i: the last s with seg[s] <= i. */
static __device__ inline int64_t seg_start(const int64_t *seg, int64_t n_seg, int64_t i, int64_t *end)
{
    int64_t lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (seg[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    *end = seg[lo + 1];
    return seg[lo];
}
