/* compress.c — compressed collectives (compress.h). */
#include "compress.h"

#include <string.h>

#include "../libcommon/log.h"

int compress_parse_weights(const char *s, int *mode)
{
    if (!strcmp(s, "off"))
        *mode = COMPRESS_OFF;
    else if (!strcmp(s, "int8"))
        *mode = COMPRESS_INT8;
    else {
        ftk_err_set("--compress-weights %s: need off or int8", s);
        return -1;
    }
    return 0;
}

const char *compress_weights_name(int mode) { return mode == COMPRESS_INT8 ? "int8" : "off"; }

int compress_parse_grads(const char *s, int *mode)
{
    if (!strcmp(s, "off"))
        *mode = COMPRESS_OFF;
    else if (!strcmp(s, "bf16"))
        *mode = COMPRESS_BF16;
    else {
        ftk_err_set("--compress-grads %s: need off or bf16", s);
        return -1;
    }
    return 0;
}

const char *compress_grads_name(int mode) { return mode == COMPRESS_BF16 ? "bf16" : "off"; }

void compress_feedback(backend_t *be, void *q, void *e, const void *g, int64_t n)
{
    bk_buf_t Q = bk_buf(q, DT_BF16), E = bk_buf(e, DT_F32);
    be->add(be, E, bk_buf((void *)g, DT_F32), n);
    be->convert(be, Q, E, n);
    /* e − q is exact in f32 (q is e rounded to fewer bits); the sign flips are exact too */
    be->scale(be, Q, -1.0f, n);
    be->add(be, E, Q, n);
    be->scale(be, Q, -1.0f, n);
}

static int64_t n_blocks(int64_t len) { return (len + COMPRESS_BLOCK - 1) / COMPRESS_BLOCK; }

int64_t compress_part_bytes(int64_t len)
{
    int64_t b = 4 * n_blocks(len) + len;
    return (b + 15) / 16 * 16;
}

void compress_pack(backend_t *be, void *part, bk_buf_t src, int64_t len)
{
    float *scales = part;
    int8_t *codes = (int8_t *)part + 4 * n_blocks(len);
    int64_t tail = compress_part_bytes(len) - 4 * n_blocks(len) - len;
    /* the padding travels too: zeros, so that a gathered buffer is the same bytes on every rank */
    if (tail)
        be->zero(be, codes + len, (size_t)tail);
    be->quant_i8(be, codes, scales, src, len, COMPRESS_BLOCK);
}

void compress_unpack(backend_t *be, bk_buf_t full, const void *packed, int64_t len, int64_t S)
{
    int64_t pb = compress_part_bytes(len);
    for (int64_t k = 0; k < S; k++) {
        const char *part = (const char *)packed + k * pb;
        be->dequant_i8(be, bk_at(full, k * len), (const int8_t *)(part + 4 * n_blocks(len)), (const float *)part,
                       len, COMPRESS_BLOCK);
    }
}
