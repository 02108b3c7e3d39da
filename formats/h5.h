/* h5.h — the HDF5 conventions every ftk file follows (docs/design.md "File format conventions").
 *
 * ## On disk
 *  - Root attributes `ftk_format` (string: "tokens", "weights", "checkpoint-shard", …) and
 *    `ftk_format_version` (int64). h5_open() refuses another format or a newer version.
 *  - Every dataset carries `xxh3_64` (uint64): XXH3-64 (seed 0) of its logical contents as
 *    little-endian bytes in row-major order, before any compression. h5w_* computes it
 *    while writing; h5_verify_dataset() recomputes it.
 *  - Numbers are stored little-endian (H5T_STD_*LE, H5T_IEEE_F*LE). bf16 is stored as
 *    uint16 with a dataset attribute dtype = "bfloat16" (HDF5 has no bfloat16).
 *  - String attributes are variable-length UTF-8 (h5py reads them as str).
 *  - Optional compression: the zstd filter 32015 (h5zstd.h) on chunks of about 1 MiB;
 *    uncompressed datasets are contiguous.
 *
 * ## Conventions of this module
 * Functions return 0 (or a valid hid_t) on success and -1 (or H5I_INVALID_HID) with
 * ftk_err_msg() set on failure. HDF5's own error printing is turned off by h5_init(),
 * which every function calls; ftk reports errors itself. The caller owns every hid_t
 * returned and closes it (H5Fclose / h5_close).
 */
#ifndef FTK_H5_H
#define FTK_H5_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ftk's checksums assume a little-endian host"
#endif

int h5_init(void);
/* Why the last HDF5 call failed, for messages: the system's error text when HDF5 records
 * one (an I/O error: "No space left on device"), else HDF5's innermost description. Call it
 * right after the failing call (the next API call clears HDF5's error stack). Returns buf.
 *
 * Messages of this module name the dataset or attribute and the reason; the caller adds
 * the file's name (ftk_err_prefix). */
const char *h5_err_reason(char *buf, size_t n);

/* Creates (truncating) path and writes the root format attributes. */
hid_t h5_create(const char *path, const char *format, int64_t version);
/* Opens path read-only. format: required ftk_format, or NULL for any ftk file. Refuses a
 * version above max_version. *format_out (may be NULL) gets a malloc'd copy of the format. */
hid_t h5_open(const char *path, const char *format, int64_t max_version, char **format_out, int64_t *version_out);
int h5_close(hid_t file);
/* A group without modification times, so that the same inputs give the same bytes. */
hid_t h5_group_create(hid_t loc, const char *name);

int h5_attr_set_str(hid_t loc, const char *name, const char *value);
int h5_attr_set_i64(hid_t loc, const char *name, int64_t v);
int h5_attr_set_u64(hid_t loc, const char *name, uint64_t v);
int h5_attr_set_f64(hid_t loc, const char *name, double v);
int h5_attr_exists(hid_t loc, const char *name);
/* *out is malloc'd; the caller frees it. */
int h5_attr_get_str(hid_t loc, const char *name, char **out);
int h5_attr_get_i64(hid_t loc, const char *name, int64_t *v);
int h5_attr_get_u64(hid_t loc, const char *name, uint64_t *v);

/* ---- Writing datasets ---------------------------------------------------------------
 * A stream writes a dataset of fixed shape in row-major order, whole rows (dims[1..]
 * elements) at a time, hashing as it goes; h5w_close() checks that every row was written
 * and stores xxh3_64. memtype: H5T_NATIVE_INT32, H5T_NATIVE_UINT8, H5T_NATIVE_INT64,
 * H5T_NATIVE_UINT16, H5T_NATIVE_FLOAT, …; the file type is its little-endian standard twin. */
typedef struct {
    int zstd_level; /* 0: uncompressed */
} h5w_opts_t;

typedef struct h5w_stream h5w_stream_t;

h5w_stream_t *h5w_open(hid_t loc, const char *name, hid_t memtype, int rank, const hsize_t *dims,
                       const h5w_opts_t *opts);
/* Writes the next n_rows rows. An uncompressed dataset goes in H5Dwrite calls of at most
 * 4 MiB, so that another thread's HDF5 call never waits behind a whole large write (the
 * library runs one call at a time; docs/design.md, "Asynchronous save"). */
int h5w_append(h5w_stream_t *s, const void *data, hsize_t n_rows);
/* Always releases s. Returns -1 if anything failed, including earlier appends. The
 * checksum stored goes to *sum when sum is not NULL. */
int h5w_close(h5w_stream_t *s, uint64_t *sum);
/* The dataset being written (for extra attributes); owned by the stream. */
hid_t h5w_dataset(h5w_stream_t *s);
/* Whole dataset in one call; sum as for h5w_close(). */
int h5w_write_tensor(hid_t loc, const char *name, hid_t memtype, int rank, const hsize_t *dims, const void *data,
                     const h5w_opts_t *opts, uint64_t *sum);

/* The tools' --compress value: "none" (level 0), "zstd" (level 3) or "zstd:L" (1..22).
 * Returns 0, or -1 for anything else. */
int h5_parse_compress(const char *s, int *level);

/* ---- Reading ---------------------------------------------------------------------- */
/* Shape of a dataset: rank returned (or -1), dims filled up to 8. */
int h5r_shape(hid_t loc, const char *name, hsize_t dims[8]);
/* Whether dataset `name` is stored with memtype's class, size and (integers) sign, as its
 * format header says; byte order may differ. 0, or -1 with ftk_err_msg() naming the
 * dataset, its type and the expected one (a float32 loss_mask would otherwise be
 * converted silently: 0.9 becomes 0). */
int h5r_check_type(hid_t loc, const char *name, hid_t memtype);
/* Reads a whole dataset of n elements (must match) into out, converting to memtype. */
int h5r_read(hid_t loc, const char *name, hid_t memtype, void *out, size_t n);
/* Reads rows [row0, row0+n) (along the first dimension, whole rows) into out. */
int h5r_read_rows(hid_t loc, const char *name, hid_t memtype, hsize_t row0, hsize_t n, void *out);

/* IEEE binary16, little-endian (HDF5 1.10 has no predefined one); shared, do not close. */
hid_t h5_f16_type(void);

/* Recomputes the checksum of dataset `name` (reading it in blocks) and compares it with
 * its xxh3_64 attribute. Returns 0 when equal, 1 on mismatch (or no attribute: *stored
 * then 0 and *has_attr 0), -1 on read failure. */
int h5_verify_dataset(hid_t loc, const char *name, uint64_t *stored, uint64_t *computed, int *has_attr);

/* Calls fn for every dataset of the file (full path, "/train/tokens"), in name order.
 * fn returns 0 to go on, non-zero to stop (that value is returned). */
typedef int (*h5_dataset_fn)(hid_t file, const char *path, void *ctx);
int h5_each_dataset(hid_t file, h5_dataset_fn fn, void *ctx);

/* Human-readable type name of a dataset ("int32", "uint8", "float32", "bfloat16", …). */
void h5_type_name(hid_t dset, char *out, size_t n);

#endif
