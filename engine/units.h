/* units.h — the unit of communication: which consecutive units of the shard map one
 * collective moves (ftk-train --units; FSDP's auto-wrap policies are the analogy).
 *
 * The shard map (formats/checkpoint.h) stays one storage unit per block: "embed",
 * "layer.L", "head", each cut into S slices, rank r owning slice r of each. A policy
 * groups consecutive blocks into communication units:
 *   block        one block per unit (what ftk did before policies: FSDP's
 *                transformer_auto_wrap_policy over the decoder layer);
 *   group:M      M consecutive blocks per unit (the last group may hold fewer);
 *   size:BYTES   consecutive blocks while their parameters, in the compute dtype and
 *                unpadded, stay within BYTES (at least one block: FSDP's
 *                size_based_auto_wrap_policy, whose min_num_params is a lower bound
 *                where this is an upper one).
 * The embedding and the head are units of their own under every policy. A group's
 * all-gather moves its blocks' owned slices in one collective, laid out [rank][block]
 * [slice] in a staging buffer, and units_interleave() puts each block's flat vector
 * together where the model reads it; its gradients take the reverse way (one
 * reduce-scatter). Every element's arithmetic is that of block: each rank owns the same
 * slices, and the reduce-scatter adds the same ranks' contributions per element (on two
 * ranks a+b whatever the algorithm; docs/communication.md "Unit policies" says what
 * holds on more).
 *
 * Functions return 0, or -1 with ftk_err_msg() set.
 */
#ifndef FTK_UNITS_H
#define FTK_UNITS_H
#include <stddef.h>
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../kernels/backend.h"

typedef struct {
    int kind;    /* CKPT_UNITS_BLOCK, _GROUP or _SIZE (formats/checkpoint.h) */
    int64_t arg; /* M, or BYTES */
} units_policy_t;

/* Text to policy (ckpt_units_policy_parse: "block", "group:M", "size:512MiB"); "" or NULL
 * is block. The message says what is allowed; the caller names the option. */
int units_parse(const char *text, units_policy_t *p);
/* The canonical text, as the manifest records it ("size:" in bytes). */
void units_name(const units_policy_t *p, char out[32]);

/* The communication units of a shard map: unit c holds storage units first[c] …
 * first[c] + count[c] − 1; of[u] is the communication unit of storage unit u. Arrays
 * malloc'd (units_map_free). */
typedef struct {
    int n, *first, *count, *of;
} units_map_t;
/* elem_bytes: bytes of one parameter as gathered (the compute dtype); S: the shard count.
 * Refuses group:M with M above the model's blocks, and a group whose per-rank part
 * (count × padded/S elements) passes the 2^31 − 1 elements one collective moves. */
int units_map(const units_policy_t *p, const ckpt_unit_t *units, int n_units, size_t elem_bytes, int64_t S,
              units_map_t *m);
void units_map_free(units_map_t *m);

/* Between the layouts of a group of n blocks of S slices of part_bytes each:
 * to_blocks: src [rank][block][slice] → dst [block][rank][slice] (after an all-gather);
 * else:      src [block][rank][slice] → dst [rank][block][slice] (before a reduce-scatter).
 * n·S copies of part_bytes through be->copy, in the backend's stream order. */
void units_interleave(backend_t *be, void *dst, const void *src, int n, int64_t S, size_t part_bytes, int to_blocks);

#endif
