/* emu_mma_sync.h — kernels/cuda/mma_sync.cuh's primitives on the host (emu.h), from the
 * specification in that header (PTX ISA fragment layouts): ldmatrix, mma.sync and the
 * shuffles exchange the lanes' registers through the warp, element by element; mma sums
 * its 16 products in fp32 in order (the tensor cores' order differs: last bits); cp.async
 * lands when its thread waits for its group (cp.async.wait_group), not before. Every
 * shared access made through these is checked (emu.h: bounds, alignment, races). */
#pragma once
#include "emu.h"

#include "../../../kernels/cuda/common.cuh"

namespace fm {

static inline void ldsm(uint32_t r[4], const uint16_t *p, bool trans)
{
    if (emu::check_smem(p, 16, trans ? "ldmatrix.trans" : "ldmatrix"))
        emu::smem_read(p, 16);
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31, g = lane >> 2, t = lane & 3;
    x.p[lane] = p;
    emu::wait(emu::AT_WARP);
    for (int i = 0; i < 4; i++)
        r[i] = trans ? x.p[8 * i + 2 * t][g] | (uint32_t)x.p[8 * i + 2 * t + 1][g] << 16
                     : x.p[8 * i + g][2 * t] | (uint32_t)x.p[8 * i + g][2 * t + 1] << 16;
}
static inline void ldsm_x4(uint32_t r[4], const uint16_t *p) { ldsm(r, p, false); }
static inline void ldsm_x4_t(uint32_t r[4], const uint16_t *p) { ldsm(r, p, true); }

/* element `half` (0: the low 16 bits) of a register holding two bf16 */
static inline float bf16_half(uint32_t reg, int half) { return bf16_to_f32((uint16_t)(reg >> (16 * half))); }

static long mma_count; /* warp-wide mma.sync issued: the work the kernels do */

static inline void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    mma_count += (emu::cur & 31) == 0;
    emu::xch &x = emu::slot();
    int lane = emu::cur & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++)
        x.u[lane][i] = a[i];
    x.u[lane][4] = b0;
    x.u[lane][5] = b1;
    emu::wait(emu::AT_WARP);
    for (int c = 0; c < 4; c++) {
        int row = g + 8 * (c >> 1), col = 2 * t + (c & 1);
        float s = 0;
        for (int k = 0; k < 16; k++) {
            /* A(row, k): lane (row % 8)·4 + (k % 8)/2, register row/8 + 2·(k/8); B(k, col):
             * lane col·4 + (k % 8)/2, register b0 or b1 by k/8; element k % 2 of the pair */
            float av = bf16_half(x.u[(row & 7) * 4 + ((k & 7) >> 1)][(row >> 3) + 2 * (k >> 3)], k & 1);
            float bv = bf16_half(x.u[col * 4 + ((k & 7) >> 1)][4 + (k >> 3)], k & 1);
            s += av * bv;
        }
        d[c] += s;
    }
}

static inline uint32_t pack_bf16(float lo, float hi)
{
    return f32_to_bf16_dev(lo) | (uint32_t)f32_to_bf16_dev(hi) << 16;
}

/* Issued now, landing at this thread's cp_async_wait that covers its group. */
static inline void cp_async16(void *dst, const void *src, int bytes)
{
    if ((uintptr_t)src % 16)
        emu::failf("cp.async: source not 16-byte aligned");
    int t = emu::cur;
    if (!emu::check_smem(dst, 16, "cp.async"))
        return;
    if (emu::n_pend[t] == emu::MAX_PEND) {
        emu::failf("more than 64 cp.async in flight in one thread (the emulator's limit)");
        return;
    }
    emu::smem_write(dst, 16);
    emu::pend[t][emu::n_pend[t]++] = {(unsigned char *)dst, (const unsigned char *)src, bytes, emu::commits[t]};
    for (size_t i = emu::word_of(dst), e = i + 4; i < e; i++)
        emu::shadow[i].pend_thread = t;
}
static inline void cp_async_commit() { emu::commits[emu::cur]++; }
/* The copies of every group but the N newest committed ones land. */
template <int N> static inline void cp_async_wait()
{
    int t = emu::cur, k = 0;
    for (int i = 0; i < emu::n_pend[t]; i++) {
        emu::pending c = emu::pend[t][i];
        if (c.group < emu::commits[t] - N) {
            if (c.bytes == 16)
                memcpy(c.dst, c.src, 16);
            else
                memset(c.dst, 0, 16);
            emu::smem_written(c.dst, 16);
        } else {
            emu::pend[t][k++] = c;
        }
    }
    emu::n_pend[t] = k;
}

static inline void st_shared(float *p, float v)
{
    if (!emu::check_smem(p, 4, "st.shared"))
        return;
    emu::smem_write(p, 4);
    *p = v;
    emu::smem_written(p, 4);
}
static inline float ld_shared(const float *p)
{
    if (emu::check_smem(p, 4, "ld.shared"))
        emu::smem_read(p, 4);
    return *p;
}
} /* namespace fm */
