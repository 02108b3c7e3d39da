#include "h5.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "h5zstd.h"

/* HDF5 1.10 registers H5_term_library with atexit() when it initialises; that handler
 * closes every file id still in its table. When H5Fclose() fails (a full disk while the
 * metadata cache is flushed), 1.10's H5F__dest() frees the file anyway but leaves its id
 * behind (HDFGroup/hdf5#2257, fixed in 1.14 by PR #2291), so the handler walks freed
 * memory and the process dies with SIGSEGV (exit 139) instead of the tool's exit code.
 * ftk closes every file it opens itself and removes the temporary of a failed one, so
 * nothing needs the handler: it is declined before anything can initialise the library
 * (a constructor runs before main; H5dont_atexit() only works before the first call). */
__attribute__((constructor)) static void h5_no_atexit(void) { H5dont_atexit(); }

/* H5Ewalk2 callback: keeps the system's text from an I/O error ("... errno = 28, error
 * message = 'No space left on device' ...", HDF5's sec2 driver), else the innermost
 * description. */
typedef struct {
    char *buf;
    size_t n;
    int sys;
} reason_t;

static herr_t reason_cb(unsigned i, const H5E_error2_t *e, void *op)
{
    (void)i;
    reason_t *r = op;
    if (r->sys || !e->desc)
        return 0;
    const char *m = strstr(e->desc, "error message = '");
    if (m) {
        m += strlen("error message = '");
        const char *end = strchr(m, '\'');
        size_t len = end ? (size_t)(end - m) : strlen(m);
        if (len >= r->n)
            len = r->n - 1;
        memcpy(r->buf, m, len);
        r->buf[len] = 0;
        r->sys = 1;
    } else {
        snprintf(r->buf, r->n, "%s", e->desc);
    }
    return 0;
}

const char *h5_err_reason(char *buf, size_t n)
{
    reason_t r = {buf, n, 0};
    snprintf(buf, n, "unknown HDF5 error");
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, reason_cb, &r);
    return buf;
}

int h5_init(void)
{
    /* HDF5's automatic error printing is per thread in a thread-safe build (each thread's
     * default error stack starts with it on): it is turned off on every thread that comes
     * here, and h5_create/h5_open come here, so a background writer (engine/bgsave.c)
     * gives ftk's one-line message, not HDF5's 42-line stack. The filter is registered
     * once, by the first caller (the main thread, before any other uses HDF5). */
    static _Thread_local int quiet;
    static int registered;
    if (!quiet) {
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        quiet = 1;
    }
    if (registered)
        return 0;
    if (h5zstd_register() < 0)
        return -1;
    registered = 1;
    return 0;
}

hid_t h5_f16_type(void)
{
    /* HDF5 1.10 has no predefined half type; this is the IEEE binary16 layout h5py
     * recognises as numpy float16. Created once, never closed. */
    static hid_t t = H5I_INVALID_HID;
    if (t < 0) {
        hid_t x = H5Tcopy(H5T_IEEE_F32LE);
        if (x < 0 || H5Tset_fields(x, 15, 10, 5, 0, 10) < 0 || H5Tset_size(x, 2) < 0 || H5Tset_precision(x, 16) < 0 ||
            H5Tset_ebias(x, 15) < 0) {
            ftk_err_set("cannot make the HDF5 float16 type");
            return H5I_INVALID_HID;
        }
        t = x;
    }
    return t;
}

/* The little-endian file type for a native memory type. */
static hid_t file_type_of(hid_t memtype)
{
    H5T_class_t c = H5Tget_class(memtype);
    size_t size = H5Tget_size(memtype);
    if (c == H5T_FLOAT)
        return size == 8 ? H5T_IEEE_F64LE : size == 4 ? H5T_IEEE_F32LE : size == 2 ? h5_f16_type() : H5I_INVALID_HID;
    if (c == H5T_INTEGER) {
        int sgn = H5Tget_sign(memtype) == H5T_SGN_2;
        switch (size) {
        case 1: return sgn ? H5T_STD_I8LE : H5T_STD_U8LE;
        case 2: return sgn ? H5T_STD_I16LE : H5T_STD_U16LE;
        case 4: return sgn ? H5T_STD_I32LE : H5T_STD_U32LE;
        case 8: return sgn ? H5T_STD_I64LE : H5T_STD_U64LE;
        }
    }
    return H5I_INVALID_HID;
}

hid_t h5_create(const char *path, const char *format, int64_t version)
{
    if (h5_init() < 0)
        return H5I_INVALID_HID;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    /* 1.8 format or later: compact attribute storage, and h5py 2.x+ can read it. */
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_obj_track_times(fcpl, 0); /* the root group too: same inputs, same bytes */
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    char why[256];
    if (f < 0)
        h5_err_reason(why, sizeof why);
    H5Pclose(fcpl);
    H5Pclose(fapl);
    if (f < 0) {
        ftk_err_set("%s: cannot create HDF5 file: %s", path, why);
        return H5I_INVALID_HID;
    }
    if (h5_attr_set_str(f, "ftk_format", format) < 0 || h5_attr_set_i64(f, "ftk_format_version", version) < 0) {
        H5Fclose(f);
        return H5I_INVALID_HID;
    }
    return f;
}

hid_t h5_open(const char *path, const char *format, int64_t max_version, char **format_out, int64_t *version_out)
{
    if (h5_init() < 0)
        return H5I_INVALID_HID;
    /* HDF5 says "not an HDF5 file" of a path that does not exist or cannot be read: ask the
     * system first, so the message gives the real reason. */
    struct stat st;
    if (stat(path, &st) != 0 || access(path, R_OK) != 0) {
        ftk_err_set("%s: %s", path, strerror(errno));
        return H5I_INVALID_HID;
    }
    if (S_ISDIR(st.st_mode)) {
        ftk_err_set("%s: is a directory, not an HDF5 file", path);
        return H5I_INVALID_HID;
    }
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        ftk_err_set("%s: not an HDF5 file (or truncated)", path);
        return H5I_INVALID_HID;
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        ftk_err_set("%s: cannot open HDF5 file", path);
        return H5I_INVALID_HID;
    }
    char *fmt = NULL;
    int64_t ver = 0;
    if (h5_attr_get_str(f, "ftk_format", &fmt) < 0 || h5_attr_get_i64(f, "ftk_format_version", &ver) < 0) {
        ftk_err_set("%s: not an ftk file (no ftk_format/ftk_format_version attributes)", path);
        free(fmt);
        H5Fclose(f);
        return H5I_INVALID_HID;
    }
    if (format && strcmp(fmt, format) != 0) {
        ftk_err_set("%s: is an ftk \"%s\" file, \"%s\" expected", path, fmt, format);
        goto fail;
    }
    if (max_version > 0 && ver > max_version) {
        ftk_err_set("%s: %s format version %lld is newer than this ftk reads (%lld); upgrade ftk", path, fmt,
                    (long long)ver, (long long)max_version);
        goto fail;
    }
    if (format_out)
        *format_out = fmt;
    else
        free(fmt);
    if (version_out)
        *version_out = ver;
    return f;
fail:
    free(fmt);
    H5Fclose(f);
    return H5I_INVALID_HID;
}

hid_t h5_group_create(hid_t loc, const char *name)
{
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    H5Pset_obj_track_times(gcpl, 0);
    hid_t g = H5Gcreate2(loc, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    char why[256];
    if (g < 0)
        h5_err_reason(why, sizeof why);
    H5Pclose(gcpl);
    if (g < 0)
        ftk_err_set("cannot create group %s: %s", name, why);
    return g;
}

int h5_close(hid_t file)
{
    if (H5Fclose(file) < 0) {
        char why[256];
        ftk_err_set("closing HDF5 file failed: %s", h5_err_reason(why, sizeof why));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- attributes */

static int attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    if (H5Aexists(loc, name) > 0)
        H5Adelete(loc, name);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, mtype, v) >= 0 ? 0 : -1;
    char why[256];
    if (rc < 0)
        h5_err_reason(why, sizeof why);
    if (a >= 0 && H5Aclose(a) < 0 && rc == 0) {
        h5_err_reason(why, sizeof why);
        rc = -1;
    }
    H5Sclose(sp);
    if (rc < 0)
        ftk_err_set("cannot write attribute %s: %s", name, why);
    return rc;
}

int h5_attr_set_str(hid_t loc, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    int rc = attr_write(loc, name, t, t, &value);
    H5Tclose(t);
    return rc;
}

int h5_attr_set_i64(hid_t loc, const char *name, int64_t v)
{
    return attr_write(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}
int h5_attr_set_u64(hid_t loc, const char *name, uint64_t v)
{
    return attr_write(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}
int h5_attr_set_f64(hid_t loc, const char *name, double v)
{
    return attr_write(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

int h5_attr_exists(hid_t loc, const char *name) { return H5Aexists(loc, name) > 0; }

static hid_t attr_open(hid_t loc, const char *name)
{
    if (H5Aexists(loc, name) <= 0) {
        ftk_err_set("attribute %s is missing", name);
        return H5I_INVALID_HID;
    }
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        ftk_err_set("cannot open attribute %s", name);
    return a;
}

int h5_attr_get_str(hid_t loc, const char *name, char **out)
{
    hid_t a = attr_open(loc, name);
    if (a < 0)
        return -1;
    hid_t ft = H5Aget_type(a);
    int rc = -1;
    if (H5Tget_class(ft) != H5T_STRING) {
        ftk_err_set("attribute %s is not a string", name);
    } else if (H5Tis_variable_str(ft) > 0) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(ft));
        char *s = NULL;
        if (H5Aread(a, mt, &s) >= 0 && s) {
            *out = strdup(s);
            H5free_memory(s);
            rc = *out ? 0 : -1;
        }
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(ft);
        char *s = calloc(n + 1, 1);
        hid_t mt = H5Tcopy(ft);
        if (s && H5Aread(a, mt, s) >= 0) {
            *out = s;
            rc = 0;
        } else {
            free(s);
        }
        H5Tclose(mt);
    }
    if (rc < 0 && H5Tget_class(ft) == H5T_STRING)
        ftk_err_set("cannot read attribute %s", name);
    H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

static int attr_get_num(hid_t loc, const char *name, hid_t mt, void *v)
{
    hid_t a = attr_open(loc, name);
    if (a < 0)
        return -1;
    hid_t ft = H5Aget_type(a);
    hid_t sp = H5Aget_space(a);
    int rc = -1;
    H5T_class_t c = H5Tget_class(ft);
    if ((c == H5T_INTEGER || c == H5T_FLOAT) && H5Sget_simple_extent_npoints(sp) == 1 && H5Aread(a, mt, v) >= 0)
        rc = 0;
    else
        ftk_err_set("attribute %s is not a single number", name);
    H5Sclose(sp);
    H5Tclose(ft);
    H5Aclose(a);
    return rc;
}

int h5_attr_get_i64(hid_t loc, const char *name, int64_t *v) { return attr_get_num(loc, name, H5T_NATIVE_INT64, v); }
int h5_attr_get_u64(hid_t loc, const char *name, uint64_t *v) { return attr_get_num(loc, name, H5T_NATIVE_UINT64, v); }

/* ---------------------------------------------------------------- writing */

struct h5w_stream {
    hid_t dset, memtype;
    int rank;
    hsize_t dims[8];
    hsize_t row_elems, rows_done;
    hsize_t piece_rows; /* rows per H5Dwrite (h5w_append); 0: all at once */
    size_t elem_size;
    hash_state_t *hash;
    char *name;
    int failed;
};

/* The most bytes one H5Dwrite of a contiguous dataset moves. The thread-safe library runs
 * one call at a time, so another thread's HDF5 call (the step's data read during an
 * asynchronous save) waits behind at most this much of a write, not a whole checkpoint
 * array (404 MB for one 7B block in bf16); the file's bytes are the same. A compressed
 * dataset is written whole: a piece could end inside a chunk. */
enum { H5W_PIECE_BYTES = 4 << 20 };

h5w_stream_t *h5w_open(hid_t loc, const char *name, hid_t memtype, int rank, const hsize_t *dims,
                       const h5w_opts_t *opts)
{
    if (h5_init() < 0)
        return NULL;
    hid_t ftype = file_type_of(memtype);
    if (ftype < 0 || rank < 1 || rank > 8) {
        ftk_err_set("%s: unsupported type or rank", name);
        return NULL;
    }
    h5w_stream_t *s = calloc(1, sizeof *s);
    if (!s || !(s->hash = hash_new()) || !(s->name = strdup(name))) {
        if (s)
            hash_free(s->hash);
        free(s);
        ftk_err_set("out of memory");
        return NULL;
    }
    s->memtype = memtype;
    s->rank = rank;
    s->elem_size = H5Tget_size(memtype);
    s->row_elems = 1;
    hsize_t total = 1;
    for (int i = 0; i < rank; i++) {
        s->dims[i] = dims[i];
        total *= dims[i];
        if (i)
            s->row_elems *= dims[i];
    }
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0); /* same inputs, same bytes */
    if (opts && opts->zstd_level > 0 && total > 0) {
        /* Chunks of about 1 MiB, whole rows. */
        hsize_t chunk[8];
        hsize_t row_bytes = s->row_elems * s->elem_size;
        hsize_t rows = row_bytes ? (1u << 20) / row_bytes : 1;
        if (rows < 1)
            rows = 1;
        if (rows > dims[0])
            rows = dims[0];
        chunk[0] = rows;
        for (int i = 1; i < rank; i++)
            chunk[i] = dims[i] ? dims[i] : 1;
        unsigned level = (unsigned)opts->zstd_level;
        H5Pset_chunk(dcpl, rank, chunk);
        H5Pset_filter(dcpl, H5Z_FILTER_ZSTD, H5Z_FLAG_MANDATORY, 1, &level);
    } else {
        hsize_t row_bytes = s->row_elems * s->elem_size;
        s->piece_rows = row_bytes ? H5W_PIECE_BYTES / row_bytes : 0;
        if (row_bytes && s->piece_rows < 1)
            s->piece_rows = 1;
    }
    hid_t space = H5Screate_simple(rank, dims, NULL);
    s->dset = H5Dcreate2(loc, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    char why[256];
    if (s->dset < 0)
        h5_err_reason(why, sizeof why);
    H5Sclose(space);
    H5Pclose(dcpl);
    if (s->dset < 0) {
        ftk_err_set("%s: cannot create dataset: %s", name, why);
        hash_free(s->hash);
        free(s->name);
        free(s);
        return NULL;
    }
    return s;
}

int h5w_append(h5w_stream_t *s, const void *data, hsize_t n_rows)
{
    if (s->failed)
        return -1;
    if (n_rows == 0)
        return 0;
    if (s->rows_done + n_rows > s->dims[0]) {
        ftk_err_set("%s: more rows written than the dataset holds", s->name);
        s->failed = 1;
        return -1;
    }
    size_t row_bytes = (size_t)s->row_elems * s->elem_size;
    for (hsize_t r = 0; r < n_rows;) {
        hsize_t start[8] = {0}, count[8];
        start[0] = s->rows_done;
        count[0] = s->piece_rows && n_rows - r > s->piece_rows ? s->piece_rows : n_rows - r;
        for (int i = 1; i < s->rank; i++)
            count[i] = s->dims[i];
        const char *piece = (const char *)data + (size_t)r * row_bytes;
        hid_t fs = H5Dget_space(s->dset);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        hid_t ms = H5Screate_simple(s->rank, count, NULL);
        herr_t e = H5Dwrite(s->dset, s->memtype, ms, fs, H5P_DEFAULT, piece);
        char why[256];
        if (e < 0)
            h5_err_reason(why, sizeof why);
        H5Sclose(ms);
        H5Sclose(fs);
        if (e < 0) {
            ftk_err_set("%s: write failed: %s", s->name, why);
            s->failed = 1;
            return -1;
        }
        hash_update(s->hash, piece, (size_t)count[0] * row_bytes);
        s->rows_done += count[0];
        r += count[0];
    }
    return 0;
}

hid_t h5w_dataset(h5w_stream_t *s) { return s->dset; }

int h5w_close(h5w_stream_t *s, uint64_t *sum)
{
    int rc = s->failed ? -1 : 0;
    if (rc == 0 && s->rows_done != s->dims[0]) {
        ftk_err_set("%s: %llu of %llu rows written", s->name, (unsigned long long)s->rows_done,
                    (unsigned long long)s->dims[0]);
        rc = -1;
    }
    uint64_t digest = hash_digest(s->hash);
    if (rc == 0 && h5_attr_set_u64(s->dset, "xxh3_64", digest) < 0)
        rc = -1;
    if (sum)
        *sum = digest;
    if (H5Dclose(s->dset) < 0 && rc == 0) {
        char why[256];
        ftk_err_set("%s: close failed: %s", s->name, h5_err_reason(why, sizeof why));
        rc = -1;
    }
    hash_free(s->hash);
    free(s->name);
    free(s);
    return rc;
}

int h5w_write_tensor(hid_t loc, const char *name, hid_t memtype, int rank, const hsize_t *dims, const void *data,
                     const h5w_opts_t *opts, uint64_t *sum)
{
    h5w_stream_t *s = h5w_open(loc, name, memtype, rank, dims, opts);
    if (!s)
        return -1;
    h5w_append(s, data, dims[0]);
    return h5w_close(s, sum);
}

/* ---------------------------------------------------------------- reading */

int h5r_shape(hid_t loc, const char *name, hsize_t dims[8])
{
    if (H5Lexists(loc, name, H5P_DEFAULT) <= 0) {
        ftk_err_set("dataset %s is missing", name);
        return -1;
    }
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("cannot open dataset %s", name);
        return -1;
    }
    hid_t sp = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(sp);
    if (rank > 8)
        rank = -1;
    else if (rank >= 0)
        H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    H5Dclose(d);
    if (rank < 0)
        ftk_err_set("dataset %s: unsupported shape", name);
    return rank;
}

int h5r_read(hid_t loc, const char *name, hid_t memtype, void *out, size_t n)
{
    hsize_t dims[8];
    int rank = h5r_shape(loc, name, dims);
    if (rank < 0)
        return -1;
    hsize_t total = 1;
    for (int i = 0; i < rank; i++)
        total *= dims[i];
    if (total != n) {
        ftk_err_set("dataset %s has %llu elements, %zu expected", name, (unsigned long long)total, n);
        return -1;
    }
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    herr_t e = n ? H5Dread(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) : 0;
    H5Dclose(d);
    if (e < 0) {
        ftk_err_set("dataset %s: read failed (corrupt file, or compressed without the zstd filter)", name);
        return -1;
    }
    return 0;
}

int h5r_read_rows(hid_t loc, const char *name, hid_t memtype, hsize_t row0, hsize_t n, void *out)
{
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("cannot open dataset %s", name);
        return -1;
    }
    hid_t fs = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(fs);
    hsize_t dims[8] = {0}, start[8] = {0}, count[8];
    herr_t e = -1;
    if (rank >= 1 && rank <= 8) {
        H5Sget_simple_extent_dims(fs, dims, NULL);
        if (row0 + n <= dims[0]) {
            start[0] = row0;
            count[0] = n;
            for (int i = 1; i < rank; i++)
                count[i] = dims[i];
            hid_t ms = H5Screate_simple(rank, count, NULL);
            e = n == 0 ? 0 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
            if (e >= 0 && n > 0)
                e = H5Dread(d, memtype, ms, fs, H5P_DEFAULT, out);
            H5Sclose(ms);
        }
    }
    H5Sclose(fs);
    H5Dclose(d);
    if (e < 0)
        ftk_err_set("dataset %s: cannot read rows %llu..%llu (corrupt file, or compressed without the zstd filter)",
                    name, (unsigned long long)row0, (unsigned long long)(row0 + n));
    return e < 0 ? -1 : 0;
}

int h5_verify_dataset(hid_t loc, const char *name, uint64_t *stored, uint64_t *computed, int *has_attr)
{
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("cannot open dataset %s", name);
        return -1;
    }
    int rc = -1;
    hid_t ft = H5Dget_type(d);
    /* A half float has no native twin (HDF5 would widen it to float and change the
     * checksum); being little-endian like the host, it is read as stored. */
    hid_t mt = H5Tget_class(ft) == H5T_FLOAT && H5Tget_size(ft) == 2 ? H5Tcopy(ft) : H5Tget_native_type(ft, H5T_DIR_ASCEND);
    hid_t sp = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[8] = {0};
    hash_state_t *h = hash_new();
    char *buf = NULL;
    *has_attr = H5Aexists(d, "xxh3_64") > 0;
    *stored = 0;
    if (*has_attr && attr_get_num(d, "xxh3_64", H5T_NATIVE_UINT64, stored) < 0)
        goto out;
    H5T_class_t cls = H5Tget_class(ft);
    if (cls != H5T_INTEGER && cls != H5T_FLOAT) {
        ftk_err_set("dataset %s: type not checksummed by ftk", name);
        goto out;
    }
    if (rank < 0 || rank > 8 || !h) {
        ftk_err_set("dataset %s: unsupported shape", name);
        goto out;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    size_t esz = H5Tget_size(mt);
    hsize_t row = 1;
    for (int i = 1; i < rank; i++)
        row *= dims[i];
    hsize_t n_rows = rank == 0 ? 1 : dims[0];
    hsize_t block = (row * esz) != 0 ? (8u << 20) / (row * esz) : 1;
    if (block < 1)
        block = 1;
    buf = malloc((size_t)((block < n_rows ? block : n_rows) * row * esz) + 1);
    if (!buf) {
        ftk_err_set("out of memory");
        goto out;
    }
    for (hsize_t r = 0; r < n_rows; r += block) {
        hsize_t cnt = n_rows - r < block ? n_rows - r : block;
        if (rank == 0) {
            if (H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
                goto readfail;
        } else {
            hsize_t start[8] = {0}, count[8];
            start[0] = r;
            count[0] = cnt;
            for (int i = 1; i < rank; i++)
                count[i] = dims[i];
            hid_t fs = H5Dget_space(d);
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
            hid_t ms = H5Screate_simple(rank, count, NULL);
            herr_t e = H5Dread(d, mt, ms, fs, H5P_DEFAULT, buf);
            H5Sclose(ms);
            H5Sclose(fs);
            if (e < 0)
                goto readfail;
        }
        hash_update(h, buf, (size_t)(cnt * row * esz));
    }
    *computed = hash_digest(h);
    rc = (*has_attr && *computed == *stored) ? 0 : 1;
    goto out;
readfail:
    ftk_err_set("dataset %s: read failed (corrupt data, or compressed without the zstd filter)", name);
out:
    free(buf);
    hash_free(h);
    H5Sclose(sp);
    H5Tclose(mt);
    H5Tclose(ft);
    H5Dclose(d);
    return rc;
}

typedef struct {
    char **paths;
    size_t n, cap;
} path_list_t;

static herr_t collect(hid_t obj, const char *name, const H5O_info_t *info, void *op)
{
    (void)obj;
    path_list_t *l = op;
    if (info->type != H5O_TYPE_DATASET)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **p = realloc(l->paths, cap * sizeof *p);
        if (!p)
            return -1;
        l->paths = p;
        l->cap = cap;
    }
    size_t len = strlen(name) + 2;
    l->paths[l->n] = malloc(len);
    if (!l->paths[l->n])
        return -1;
    snprintf(l->paths[l->n], len, "/%s", name);
    l->n++;
    return 0;
}

int h5_each_dataset(hid_t file, h5_dataset_fn fn, void *ctx)
{
    path_list_t l = {0};
    int rc = 0;
    if (H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC, collect, &l) < 0) {
        ftk_err_set("cannot walk the file's objects (corrupt file?)");
        rc = -1;
    }
    for (size_t i = 0; i < l.n && rc == 0; i++)
        rc = fn(file, l.paths[i], ctx);
    for (size_t i = 0; i < l.n; i++)
        free(l.paths[i]);
    free(l.paths);
    return rc;
}

void h5_type_name(hid_t dset, char *out, size_t n)
{
    hid_t t = H5Dget_type(dset);
    H5T_class_t c = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    char *dt = NULL;
    if (H5Aexists(dset, "dtype") > 0 && h5_attr_get_str(dset, "dtype", &dt) == 0) {
        snprintf(out, n, "%s", dt);
        free(dt);
    } else if (c == H5T_INTEGER) {
        snprintf(out, n, "%sint%zu", H5Tget_sign(t) == H5T_SGN_2 ? "" : "u", size * 8);
    } else if (c == H5T_FLOAT) {
        snprintf(out, n, "float%zu", size * 8);
    } else if (c == H5T_STRING) {
        snprintf(out, n, "string");
    } else {
        snprintf(out, n, "other");
    }
    H5Tclose(t);
}

int h5r_check_type(hid_t loc, const char *name, hid_t memtype)
{
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0) {
        ftk_err_set("cannot open dataset %s", name);
        return -1;
    }
    hid_t t = H5Dget_type(d);
    H5T_class_t wc = H5Tget_class(memtype);
    size_t ws = H5Tget_size(memtype);
    int ok = t >= 0 && H5Tget_class(t) == wc && H5Tget_size(t) == ws &&
             (wc != H5T_INTEGER || H5Tget_sign(t) == H5Tget_sign(memtype));
    if (t >= 0)
        H5Tclose(t);
    if (!ok) {
        char have[64];
        h5_type_name(d, have, sizeof have);
        if (wc == H5T_INTEGER)
            ftk_err_set("%s: type %s, the format says %sint%zu", name, have,
                        H5Tget_sign(memtype) == H5T_SGN_2 ? "" : "u", ws * 8);
        else
            ftk_err_set("%s: type %s, the format says float%zu", name, have, ws * 8);
    }
    H5Dclose(d);
    return ok ? 0 : -1;
}

int h5_parse_compress(const char *s, int *level)
{
    if (strcmp(s, "none") == 0) {
        *level = 0;
        return 0;
    }
    if (strcmp(s, "zstd") == 0) {
        *level = 3;
        return 0;
    }
    char *end;
    if (strncmp(s, "zstd:", 5) == 0) {
        long l = strtol(s + 5, &end, 10);
        if (*end == 0 && end != s + 5 && l >= 1 && l <= 22) {
            *level = (int)l;
            return 0;
        }
    }
    return -1;
}
