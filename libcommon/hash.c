#include "hash.h"

/* On x86-64, libxxhash's dispatching entry points pick the widest vector unit the CPU has
 * (AVX-512, AVX2, else SSE2) at the first call; the plain ones are built for SSE2, half the
 * speed or less (7.8 against 18 GB/s here), and every weights load and checkpoint read
 * hashes each byte it reads. The value is the same whichever unit computes it. The header
 * is installed only where the library was built with the dispatcher (xxHash's DISPATCH=1,
 * as Debian does); FTK_NO_XXH_DISPATCH turns it off. */
#if defined(__x86_64__) && defined(__has_include) && !defined(FTK_NO_XXH_DISPATCH)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

uint64_t hash_bytes(const void *data, size_t len) { return XXH3_64bits(data, len); }

hash_state_t *hash_new(void)
{
    hash_state_t *s = XXH3_createState();
    if (s)
        XXH3_64bits_reset(s);
    return s;
}

void hash_update(hash_state_t *s, const void *data, size_t len) { XXH3_64bits_update(s, data, len); }
uint64_t hash_digest(const hash_state_t *s) { return XXH3_64bits_digest(s); }
void hash_free(hash_state_t *s) { XXH3_freeState(s); }

int hash_file(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return -1;
    }
    hash_state_t *s = hash_new();
    if (!s) {
        fclose(f);
        ftk_err_set("out of memory");
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        hash_update(s, buf, n);
    int bad = ferror(f);
    fclose(f);
    *out = hash_digest(s);
    hash_free(s);
    if (bad) {
        ftk_err_set("%s: read error", path);
        return -1;
    }
    return 0;
}

void hash_hex(uint64_t h, char buf[17]) { snprintf(buf, 17, "%016llx", (unsigned long long)h); }
