#include "h5zstd.h"

#include <hdf5.h>
#include <stdlib.h>
#include <zstd.h>

/* Decompressed chunks are bounded by HDF5's 4 GiB chunk limit; refuse more, so that a
 * hostile frame header cannot make us allocate without bound. */
#define MAX_CHUNK ((unsigned long long)4 << 30)

static size_t decompress_stream(size_t nbytes, size_t *buf_size, void **buf)
{
    ZSTD_DStream *ds = ZSTD_createDStream();
    if (!ds)
        return 0;
    size_t cap = nbytes * 4 + 4096, used = 0;
    char *out = malloc(cap);
    ZSTD_inBuffer in = {*buf, nbytes, 0};
    size_t ret = 1;
    while (out && ret != 0) {
        if (used == cap) {
            if (cap >= MAX_CHUNK)
                goto fail;
            char *n = realloc(out, cap * 2);
            if (!n)
                goto fail;
            out = n;
            cap *= 2;
        }
        ZSTD_outBuffer ob = {out + used, cap - used, 0};
        ret = ZSTD_decompressStream(ds, &ob, &in);
        if (ZSTD_isError(ret))
            goto fail;
        used += ob.pos;
        if (ret != 0 && in.pos == in.size && ob.pos < ob.size)
            goto fail; /* truncated frame */
    }
    ZSTD_freeDStream(ds);
    if (!out)
        return 0;
    free(*buf);
    *buf = out;
    *buf_size = cap;
    return used;
fail:
    ZSTD_freeDStream(ds);
    free(out);
    return 0;
}

static size_t zstd_filter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[], size_t nbytes,
                          size_t *buf_size, void **buf)
{
    if (flags & H5Z_FLAG_REVERSE) {
        unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
        if (n == ZSTD_CONTENTSIZE_ERROR)
            return 0;
        if (n == ZSTD_CONTENTSIZE_UNKNOWN)
            return decompress_stream(nbytes, buf_size, buf);
        if (n > MAX_CHUNK)
            return 0;
        void *out = malloc(n ? (size_t)n : 1);
        if (!out)
            return 0;
        size_t r = ZSTD_decompress(out, (size_t)n, *buf, nbytes);
        if (ZSTD_isError(r) || r != n) {
            free(out);
            return 0;
        }
        free(*buf);
        *buf = out;
        *buf_size = n ? (size_t)n : 1;
        return (size_t)n;
    }
    int level = cd_nelmts > 0 ? (int)cd_values[0] : ZSTD_CLEVEL_DEFAULT;
    size_t bound = ZSTD_compressBound(nbytes);
    void *out = malloc(bound);
    if (!out)
        return 0;
    size_t r = ZSTD_compress(out, bound, *buf, nbytes, level);
    if (ZSTD_isError(r)) {
        free(out);
        return 0;
    }
    free(*buf);
    *buf = out;
    *buf_size = bound;
    return r;
}

static const H5Z_class2_t h5z_zstd[1] = {{
    H5Z_CLASS_T_VERS,
    (H5Z_filter_t)H5Z_FILTER_ZSTD,
    1, /* encoder present */
    1, /* decoder present */
    "Zstandard compression (ftk): http://www.zstd.net",
    NULL,
    NULL,
    (H5Z_func_t)zstd_filter,
}};

#ifdef H5ZSTD_PLUGIN
#include <H5PLextern.h>
H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
const void *H5PLget_plugin_info(void) { return h5z_zstd; }
#else
#include "../libcommon/log.h"
int h5zstd_register(void)
{
    htri_t avail = H5Zfilter_avail(H5Z_FILTER_ZSTD);
    if (avail > 0)
        return 0;
    if (H5Zregister(h5z_zstd) < 0) {
        ftk_err_set("cannot register the zstd HDF5 filter");
        return -1;
    }
    return 0;
}
#endif
