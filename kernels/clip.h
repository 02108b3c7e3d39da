/* clip.h — torch's gradient-norm clipping coefficient, defined once for the host
 * (engine/optim.c, where ranks sum Σg² first), the CPU backend's clip_coef and the CUDA
 * kernel's, so that the three give the same bits: total is Σg² over every unit,
 * coef = max_norm / (√total + 1e-6), used where it is below 1; max_norm ≤ 0 (no clipping)
 * and a NaN total give 1. The sum, square root and division are in double, nothing that a
 * compiler may contract. */
#ifndef FTK_CLIP_H
#define FTK_CLIP_H
#include <math.h>

#ifdef __CUDACC__
#define BK_CLIP_HD static __host__ __device__ __forceinline__
#else
#define BK_CLIP_HD static inline
#endif

BK_CLIP_HD float bk_clip_coef(double total, double max_norm)
{
    double c = max_norm / (sqrt(total) + 1e-6);
    return max_norm > 0 && c < 1.0 ? (float)c : 1.0f;
}

#endif
