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
