/* safetensors.h — reading and writing Hugging Face safetensors files.
 *
 * ## On disk (https://github.com/huggingface/safetensors, "Format")
 *
 *     [8 bytes]  N, uint64 little-endian: the header's length in bytes
 *     [N bytes]  header: a UTF-8 JSON object, optionally padded with spaces (0x20)
 *     [rest]     data section: the tensors' bytes, little-endian, row-major
 *
 * The header maps each tensor name to {"dtype": "F32", "shape": [d0, d1, …],
 * "data_offsets": [begin, end]}; offsets are relative to the start of the data section.
 * The optional key "__metadata__" maps to an object of string → string (transformers
 * writes {"format": "pt"}). dtypes: BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32
 * F32 F64 I64 U64.
 *
 * ## The reader is a security boundary
 * Model files come from the internet. st_parse_buffer() accepts a file only when all of
 * these hold, and otherwise fails naming the offending tensor:
 *  - the file holds the 8-byte length; N ≤ ST_MAX_HEADER and 8 + N ≤ file size;
 *  - the header is valid UTF-8 JSON (strict parser, json.h), an object, nested at most
 *    3 deep, starting with '{' and followed only by spaces;
 *  - "__metadata__", if present, is an object whose values are strings;
 *  - every other member is an object with exactly the keys dtype, shape, data_offsets;
 *    dtype is one of the names above; shape is an array of at most ST_MAX_RANK integers
 *    in [0, 2^53); data_offsets is two integers with begin ≤ end;
 *  - element count × element size, computed without overflow, equals end − begin;
 *  - the tensors, in offset order, tile the data section exactly: no overlap, no gap,
 *    nothing after the last one (the reference implementation's rule);
 *  - names are non-empty and hold no NUL byte (the JSON parser already refuses
 *    duplicate names).
 * Only after that are byte ranges handed out (st_data), so no offset is ever trusted
 * before it is checked against the real file size.
 *
 * ## Conventions
 * Functions return 0 or -1 with ftk_err_msg() set ("tensor \"NAME\": what"; st_open
 * prefixes the path). The structs own their memory; free with st_header_free/st_close.
 */
#ifndef FTK_SAFETENSORS_H
#define FTK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../libcommon/buf.h"
#include "../libcommon/dtype.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference implementation's limit */
#define ST_MAX_RANK 8

typedef struct {
    char *name;
    char dtype[12];   /* as written: "F32", "BF16", … */
    dtype_t dt;       /* DT_F32/DT_F16/DT_BF16, or DT_INVALID for the other dtypes */
    size_t elem_size; /* bytes per element */
    int rank;
    int64_t shape[ST_MAX_RANK];
    uint64_t n_elems;
    uint64_t begin, end; /* byte range in the data section */
} st_tensor_t;

typedef struct {
    st_tensor_t *tensors; /* in data-offset order */
    size_t n;
    uint64_t header_len; /* N */
    uint64_t data_len;   /* bytes of the data section */
} st_header_t;

/* Validates a whole file's bytes (everything above). buf is not kept. */
int st_parse_buffer(const uint8_t *buf, size_t size, st_header_t *out);
void st_header_free(st_header_t *h);

typedef struct {
    char *path;
    const uint8_t *map; /* the whole file, read-only */
    size_t size;
    st_header_t h;
} st_file_t;

/* Opens and validates path (mmap). */
int st_open(st_file_t *f, const char *path);
void st_close(st_file_t *f);
const st_tensor_t *st_find(const st_file_t *f, const char *name);
/* The tensor's bytes inside the mapping (valid until st_close). */
static inline const void *st_data(const st_file_t *f, const st_tensor_t *t)
{
    return f->map + 8 + f->h.header_len + t->begin;
}

/* ---- Writing ----------------------------------------------------------------------
 * The header of a file holding n tensors, in this order and packed back to back:
 * appends the 8-byte length and the JSON (with "__metadata__": {"format": "pt"}, padded
 * with spaces to a multiple of 8 bytes, as the reference writer does) to out. The caller
 * then writes each tensor's bytes in the same order. *data_len gets the data section's
 * size. */
typedef struct {
    const char *name;
    dtype_t dt;
    int rank;
    const int64_t *shape;
} st_entry_t;

int st_build_header(buf_t *out, const st_entry_t *e, size_t n, uint64_t *data_len);

#endif
