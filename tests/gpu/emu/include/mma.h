/* tests/gpu/emu: WMMA on the host (emu.h). A fragment's layout across a warp's lanes is
 * unspecified; here element e = 16·row + column of a 16 × 16 tile belongs to lane e % 32
 * (slot e / 32), so, as on the GPU, a load or store moves only the lane's own elements and
 * orders nothing between lanes (a lane reading what another wrote needs __syncwarp), and a
 * product is warp-wide: the lanes exchange their A and B elements through the warp and
 * each sums its own outputs' 16 terms in fp32 in order (the tensor cores' order differs:
 * last bits). */
#pragma once
#include "../emu.h"
#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16 x 16 x 16 only");
    float v[8]; /* elements lane + 32·i, i < 8 */
};

static inline float emu_val(const __nv_bfloat16 &b) { return bf16_to_f32(b.x); }
static inline float emu_val(float f) { return f; }
static inline int emu_lane() { return emu::cur & 31; }

template <typename Use, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm)
{
    bool row = std::is_same<L, row_major>::value;
    for (int i = 0; i < 8; i++) {
        int e = emu_lane() + 32 * i, r = e / 16, c = e % 16;
        f.v[i] = emu_val(row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
    }
}
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t l)
{
    for (int i = 0; i < 8; i++) {
        int e = emu_lane() + 32 * i, r = e / 16, c = e % 16;
        f.v[i] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t l)
{
    for (int i = 0; i < 8; i++) {
        int e = emu_lane() + 32 * i, r = e / 16, c = e % 16;
        (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.v[i];
    }
}
template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v)
{
    for (int i = 0; i < 8; i++)
        f.v[i] = v;
}
template <typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    emu::xch &x = emu::slot();
    int lane = emu_lane();
    for (int i = 0; i < 8; i++)
        x.a[lane + 32 * i] = a.v[i], x.b[lane + 32 * i] = b.v[i];
    emu::wait(emu::AT_WARP);
    for (int i = 0; i < 8; i++) {
        int e = lane + 32 * i, r = e / 16, col = e % 16;
        float s = 0;
        for (int k = 0; k < 16; k++)
            s += x.a[16 * r + k] * x.b[16 * k + col];
        d.v[i] = c.v[i] + s;
    }
}
} /* namespace wmma */
} /* namespace nvcuda */
