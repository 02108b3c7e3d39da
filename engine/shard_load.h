/* shard_load.h — the initial weights of a rank's slices, read from a weights file
 * (formats/weights.h) into the backend's memory by several threads (shard.h
 * shard_load_weights is the shards' door to it).
 *
 * Each slice is the element range [lo, lo + len) of a unit's flat vector (ckpt_unit_t:
 * its tensors at their offsets), rounded to the state dtype; padding past the unit's
 * tensors is zeroed. Each tensor read whole is checked against its stored checksum (a
 * damaged file fails the load). The readers call HDF5 one at a time; the caller must not
 * use the weights file from another thread while a load runs.
 *
 * Nothing here prints. shard_load_read returns 0, or -1 with ftk_err_msg() set (the first
 * failing reader's message); it allocates nothing that outlives it.
 */
#ifndef FTK_SHARD_LOAD_H
#define FTK_SHARD_LOAD_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"

/* What a load took. */
typedef struct {
    int64_t bytes;   /* the file bytes this rank read */
    int readers;     /* reading threads */
    double read_cpu; /* CPU seconds the readers spent reading (their threads' clocks, summed) */
    double upload_s; /* without host_ptr (a GPU): seconds in the uploads, */
    double wait_s;   /* and seconds the uploading thread then took finishing the next unit with the readers */
} shard_load_stats_t;

/* A load: for each of n_units units, elements [lo[u], lo[u] + len[u]) of the unit into
 * dst[u], len[u] elements of dtype state in be's memory. The arrays are the caller's. */
typedef struct {
    backend_t *be;
    hid_t weights;
    dtype_t state;
    const ckpt_unit_t *units;
    int n_units;
    const int64_t *lo, *len;
    void *const *dst;
} shard_load_t;

/* Reads the slices. *st (may be NULL): what the load took, filled on success. */
int shard_load_read(const shard_load_t *s, shard_load_stats_t *st);

#endif
