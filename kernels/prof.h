/* prof.h — where a backend instance's time goes: its ops timed one by one (FTK_PROFILE).
 *
 * bk_prof_attach() puts a timing wrapper in front of every op entry of an instance: the
 * byte moves (upload, download, zero, copy) and every op of backend.h's list (BK_OPS) but
 * those it marks BK_OP_UNTIMED (clip_coef); the optional fused entries that are NULL stay
 * NULL. The instance stays the same one (its context, memory,
 * streams and events are untouched), so what runs and what it computes do not change:
 * only the time each call takes is recorded.
 *
 * Rows. A call is counted under a row named for the op and for what decides its speed:
 *   matmul     its transposes (N/T for A and B), M×N×K, the operands' dtype, "+=" when it
 *              adds into C (beta ≠ 0) and C's dtype: "matmul NT 4096x11008x4096 bf16 += f32"
 *   attn_*     dtype, head dim, query and key/value heads: "attn_fwd bf16 hd128 32/32"
 *   the rest   the dtypes they read and store: "add_rmsnorm_fwd bf16", "convert f32→bf16"
 * Each row sums its calls, its time and its work: floating-point operations for the
 * products (2·M·N·K) and attention (4·hd per head and causal (query, key) pair forward, 8
 * backward: gpu_opbench's count), and for the memory-bound ops the fewest bytes they must
 * move (every operand read once, every result written once; embed_bwd and attn_cached: none
 * counted). TFLOP/s and GB/s per row follow; the second is what to hold against the device's
 * copy bandwidth.
 *
 * Timing. Where the backend has timer events (backend.h timer_new: the CUDA backend), a
 * pair of them brackets each call on the stream it is issued on, and the pairs are read
 * when sync() returns (ftk-train syncs once a step; at most 32768 pairs wait for a read, then
 * the wrapper syncs). A stream that waits for an event (a gathered unit) has passed the wait
 * before the first of the pair is stamped, so waits fall outside every row; a device that
 * waits for the host to issue the next kernel (launch-bound) counts that wait in the op whose
 * kernel it waits for. Elsewhere (the CPU backend, whose ops have finished when they return)
 * the host's clock times each call.
 *
 * Ownership and errors: the profile belongs to the instance and ends with backend_free().
 * Functions returning int give 0, or -1 with ftk_err_msg() set.
 */
#ifndef FTK_PROF_H
#define FTK_PROF_H
#include <stdint.h>
#include <stdio.h>

#include "backend.h"

/* Starts timing be's ops (-1: out of memory, or be has it already). */
int bk_prof_attach(backend_t *be);
/* Forgets what was timed so far (after a warm-up step, whose first calls pay for cuBLASLt's
 * heuristics and the kernels' loading). Waits for be first (sync), so that no pair in flight
 * is read into the new count. */
void bk_prof_reset(backend_t *be);
/* Waits for be (sync), then writes one line naming the device and the totals, and two
 * markdown tables, per op (the rows' first words) and per row, longest total first.
 * wall_s > 0: the host seconds the timed work took (ftk-train: from the end of its first
 * step to the end of the run), so the line says which share of it the ops fill.
 * -1: a device error reported by sync (the table is written all the same), or the write
 * failed. */
int bk_prof_write(backend_t *be, FILE *f, double wall_s);
/* One row's totals, or with label NULL every row's; untimed: calls not timed (no row left
 * among 2048, no timer); secs of the calls timed. */
typedef struct {
    uint64_t calls, untimed;
    double secs, flops, bytes;
} bk_prof_row_t;
/* Waits for be (sync), then the totals of the row named label as the table names it (or of
 * all, label NULL): 0, or -1 when no call made that row or be is not profiled. */
int bk_prof_row(backend_t *be, const char *label, bk_prof_row_t *out);
/* Ends the profile (backend_free calls it); NULL or no profile: nothing. */
void bk_prof_free(backend_t *be);

#endif
