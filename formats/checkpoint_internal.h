/* checkpoint_internal.h — what checkpoint.c, checkpoint_write.c and checkpoint_read.c share;
 * not part of the API (checkpoint.h is). */
#ifndef FTK_CHECKPOINT_INTERNAL_H
#define FTK_CHECKPOINT_INTERNAL_H

#include <stddef.h>

#include "../libcommon/buf.h"
#include "checkpoint.h"

/* The manifest's last member, on a line of its own: its value, 16 hex digits, follows. */
#define CKPT_SEAL_KEY "  \"manifest_xxh3\": \""

/* "a/b" as a new string (a's trailing slashes dropped); NULL with the error set when out of
 * memory. The caller frees it. */
char *ckpt_join(const char *a, const char *b);

/* The manifest's "units" array, as written (its hash is the shard files' units_xxh3).
 * Appends to b; nonzero when out of memory. */
int ckpt_units_json(buf_t *b, const ckpt_unit_t *units, int n_units);

/* The range checks of a parsed manifest's metadata: 0, or -1 with the error set. The writer
 * runs them too, so it never commits a manifest that readers refuse. */
int ckpt_check_meta(const ckpt_meta_t *m);

#endif
