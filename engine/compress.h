/* compress.h — compressed collectives of the shard engine (docs/communication.md,
 * "Compressed collectives"), off by default.
 *
 * --compress-weights int8 (COMPRESS_INT8): where a unit's slices are all-gathered (full,
 * grad-op, hybrid's shard group; not with one shard), each rank turns its owned slice of
 * the compute-dtype weights into int8 codes with an fp32 scale per block of
 * COMPRESS_BLOCK elements (kernels/backend.h quant_i8), the packed parts are all-gathered
 * as bytes, and every rank turns every part back (dequant_i8) into the gathered unit, its
 * own part included: all ranks compute with the same weights, and the master weights and
 * the optimizer never see the codes. A unit of P elements then moves P·(1 + 4/B) bytes
 * (rounded up to 16 per part) where it moved P·4 (fp32) or P·2 (bf16 modes).
 *
 * One rank's part of a slice of len elements, packed (compress_part_bytes() bytes, a
 * multiple of 16, so that every part's scales are aligned in the gathered buffer):
 *   scales  ceil(len / B) float32, block b's absmax / 127
 *   codes   len int8
 *   zeros   up to the multiple of 16
 * The blocks are the slice's own (block b is its elements [b·B, (b+1)·B)), so the codes of
 * a unit depend on the shard count S: a run is reproducible at the same S.
 *
 * --compress-grads bf16 (COMPRESS_BF16; full and grad-op, fp32 gradients): a unit's
 * gradient is reduce-scattered in bf16 (half the bytes of f32; the sum adds each pair in
 * fp32 and rounds, comm.h) with error feedback: the rank keeps a residual e of the whole
 * unit in f32, sends q = bf16(g + e) and keeps e = (g + e) − q for its next reduce-scatter
 * of the unit (the next micro-batch's or step's), so that what rounding cut off is sent
 * later rather than lost. The residual costs 4 bytes per parameter on every rank (the
 * whole model, not a slice) and is part of the training state: the checkpoint keeps it
 * (formats/checkpoint.h, /grad_residual), so that a resume on the same ranks is bit-exact.
 *
 * Functions do not fail (the backend's ops record their failures, backend.h); the parse
 * function returns 0, or -1 with ftk_err_msg() set. */
#ifndef FTK_COMPRESS_H
#define FTK_COMPRESS_H
#include <stdint.h>

#include "../kernels/backend.h"

enum { COMPRESS_OFF, COMPRESS_INT8, COMPRESS_BF16 };
#define COMPRESS_BLOCK 256

/* "off" | "int8" into *mode (COMPRESS_*). */
int compress_parse_weights(const char *s, int *mode);
const char *compress_weights_name(int mode);

/* "off" | "bf16" into *mode. */
int compress_parse_grads(const char *s, int *mode);
const char *compress_grads_name(int mode);

/* Error feedback over n elements: e += g; q = bf16(e) (nearest even); e −= q (exact).
 * q bf16, e and g f32, backend memory. */
void compress_feedback(backend_t *be, void *q, void *e, const void *g, int64_t n);

/* The packed bytes of one rank's part of a slice of len elements (see above). */
int64_t compress_part_bytes(int64_t len);
/* src[len] (f32 or bf16) packed into part (backend memory, compress_part_bytes(len)). */
void compress_pack(backend_t *be, void *part, bk_buf_t src, int64_t len);
/* The S parts of packed (one after another, compress_part_bytes(len) apart) unpacked into
 * full[S·len], part k into elements [k·len, (k+1)·len). */
void compress_unpack(backend_t *be, bk_buf_t full, const void *packed, int64_t len, int64_t S);

#endif
