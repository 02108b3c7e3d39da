/* bgsave.h — one rank's checkpoint shard written in the background (ftk-train --async-save;
 * the protocol around it is trainer.h's).
 *
 * The snapshot is a host copy of this rank's shard: the parameters (fp32 master weights,
 * or the bf16 weights of bf16-true) and both AdamW moments of every unit, in the state
 * dtype, padded/S elements per unit and kind — the arrays of its shard file — and under
 * --compress-grads each unit's error-feedback residual (shard_get_residual). It is
 * allocated once (bgsave_new) through the backend's host_alloc, page-locked on a GPU, else
 * malloc. bgsave_snapshot() fills it from the shards (shard_get_slice: a device-to-host
 * copy, a memcpy on the CPU backend); that copy is all the training loop waits for. The
 * step, data position, RNG seed and schedule state are in the ckpt_meta_t given to
 * bgsave_start(), copied there.
 *
 * bgsave_start() starts a thread that writes the shard file from the snapshot through
 * bgsave_write_shard(), the write the synchronous save (trainer_save) makes too
 * (ckpt_shard_create/put/finish: every array checksummed, the file fsynced, then hashed
 * whole), so both write the same bytes. The thread runs 10 nice levels below the process
 * (Linux: per thread), so that on the CPU backend it takes the cycles training leaves
 * rather than a share of every step.
 *
 * Threads: the writer thread makes HDF5 and file-system calls only — no MPI (MPI is
 * initialised FUNNELED) and no backend call. HDF5 must then be the thread-safe build
 * (Debian's libhdf5 is: it serialises every call behind one lock); bgsave_supported()
 * asks the library, and the trainer saves synchronously where it says no. While a write
 * runs the snapshot is the thread's: bgsave_snapshot() and bgsave_start() only after
 * bgsave_wait(). The handle itself belongs to one (the main) thread.
 *
 * Fault point (libcommon/fault.h) "bgsave.write": before each array the thread writes, so
 * that a fault test's kill, failure or stretch lands in a background write.
 *
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set.
 */
#ifndef FTK_BGSAVE_H
#define FTK_BGSAVE_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"
#include "shard.h"

typedef struct bgsave bgsave_t;

/* Bytes of the snapshot for this shard map: 3 · Σ padded/S · the dtype's size, and with
 * residual (--compress-grads, shard.h) the residuals after them: Σ padded · 4, from a
 * multiple of 16 bytes. The memory plan reports it (engine/plan.h). */
int64_t bgsave_bytes(const ckpt_unit_t *units, int n_units, int64_t S, dtype_t dt, int residual);
/* The HDF5 library may be called from two threads. */
int bgsave_supported(void);

/* The snapshot buffers on be's host memory (units must outlive the handle). */
bgsave_t *bgsave_new(backend_t *be, const ckpt_unit_t *units, int n_units, int64_t S, dtype_t dt, int residual);
/* Waits for a write still running (its result is dropped), then frees. NULL: no-op. */
void bgsave_free(bgsave_t *b);

/* This rank's state into the snapshot (blocks until the copy is complete). */
int bgsave_snapshot(bgsave_t *b, shard_t *sh);
/* Starts the thread that writes shard `index` of meta's checkpoint into dir (a
 * ckpt_begin() directory) from the snapshot; tok_src (or -1): the weights file whose
 * tokenizer files shard 1 carries (read by the thread). */
int bgsave_start(bgsave_t *b, const char *dir, const ckpt_meta_t *meta, int64_t index, hid_t tok_src);
/* The snapshot's bytes (bgsave_bytes of them), for a caller that sends or fills them as they
 * are (memory snapshots, engine/snapshot.h: the same shard map gives the same layout on
 * every rank). Only between writes. */
void *bgsave_buffer(bgsave_t *b, int64_t *bytes);
/* After the next write, the thread also takes the XXH3-64 of the snapshot's bytes (for
 * bgsave_raw_hash after bgsave_wait). */
void bgsave_hash_raw(bgsave_t *b, int on);
uint64_t bgsave_raw_hash(const bgsave_t *b);
/* A write was started and not yet waited for. */
int bgsave_running(const bgsave_t *b);
/* The write has ended (or none runs): bgsave_wait() will not block. Never blocks. */
int bgsave_done(const bgsave_t *b);
/* Joins the thread: 0 with the shard file's size and checksum in *sum and the thread's
 * seconds in *write_s, or -1 with the write's failure in ftk_err_msg(). */
int bgsave_wait(bgsave_t *b, ckpt_shard_sum_t *sum, double *write_s);

/* The one write of a shard file, both saves': shard `index` of meta's checkpoint into dir,
 * every array in file order (kind, then unit) as array(ctx, kind, unit) gives it (NULL:
 * the array could not be had, ftk_err_msg() set; the write stops there), with
 * meta->compress_grads kind CKPT_KINDS after them (unit u's residual, padded float32:
 * ckpt_shard_put_residual), then finished
 * with tok_src's tokenizer files (or -1). Returns 0 with the file's size and checksum in
 * *sum, or -1. Makes no MPI or backend call of its own: the background writer's thread
 * runs it. */
typedef const void *(*bgsave_array_fn)(void *ctx, int kind, int unit);
int bgsave_write_shard(const char *dir, const ckpt_meta_t *meta, const ckpt_unit_t *units, int n_units, int64_t index,
                       hid_t tok_src, bgsave_array_fn array, void *ctx, ckpt_shard_sum_t *sum);

#endif
