/* mma_sync.cuh — the warp-level tensor-core primitives of flash_mma.cuh, as PTX (sm_80+).
 *
 * Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix"); lane = g·4 + t
 * (g = lane / 4, t = lane % 4); each 32-bit register holds two bf16, the lower-indexed
 * element in the low half:
 *  - A, 16 × 16 row-major, 4 registers: a0 (row g, columns 2t, 2t+1), a1 (row g+8, the same
 *    columns), a2 (row g, columns 2t+8, 2t+9), a3 (row g+8, columns 2t+8, 2t+9);
 *  - B, 16 × 8 (k × n), 2 registers: b0 (k = 2t, 2t+1 of column n = g), b1 (k = 2t+8, 2t+9);
 *  - C/D, 16 × 8 fp32, 4 floats: c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8).
 *    Two C tiles side by side (columns 0–7, 8–15), rounded to bf16 in pairs, are the A
 *    fragment of the same 16 × 16 block: {c0c1, c2c3} of the first, then of the second.
 *  - ldmatrix .x4 loads four 8 × 8 matrices of 16-bit elements from shared memory: lanes
 *    8i … 8i+7 give the addresses of matrix i's rows (16-byte aligned), and register i of
 *    lane g·4+t receives row g, columns 2t, 2t+1 of matrix i; with .trans, rows 2t, 2t+1 of
 *    column g (the matrix transposed).
 * tests/gpu/flash_emu.cc defines the same functions on the host, from the same
 * specification, and runs flash_mma.cuh's kernels with them against the CPU backend. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace fm {

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* r[i] = this lane's part of matrix i; p: the row this lane addresses. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* d += a · b (16 × 16 bf16 times 16 × 8 bf16, fp32 accumulation). */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as bf16 (nearest even), lo in the low half. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* 16 bytes from global to shared memory without passing through registers; bytes = 0
 * writes zeros (src is then not read, but must still be a valid address). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Plain shared-memory loads and stores of a float, named so that the emulator sees them
 * (its race check follows every shared access: the primitives above and these). */
__device__ __forceinline__ void st_shared(float *p, float v) { *p = v; }
__device__ __forceinline__ float ld_shared(const float *p) { return *p; }

} /* namespace fm */
