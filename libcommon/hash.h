/* hash.h — XXH3-64 helpers (libxxhash), the checksum of every ftk dataset and file.
 *
 * The value is XXH3_64bits with seed 0 over the logical bytes, little-endian, row-major
 * (docs/design.md "File format conventions"). Printed as 16 lowercase hex digits.
 */
#ifndef FTK_HASH_H
#define FTK_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

typedef XXH3_state_t hash_state_t;

uint64_t hash_bytes(const void *data, size_t len);

/* Streaming: hash_new() returns NULL on out-of-memory; hash_free() accepts NULL. */
hash_state_t *hash_new(void);
void hash_update(hash_state_t *s, const void *data, size_t len);
uint64_t hash_digest(const hash_state_t *s);
void hash_free(hash_state_t *s);

/* XXH3 of a whole file. Returns 0, or -1 with ftk_err_msg() set. */
int hash_file(const char *path, uint64_t *out);

/* Writes 16 hex digits and a NUL into buf[17]. */
void hash_hex(uint64_t h, char buf[17]);

#endif
