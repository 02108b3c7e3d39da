#include "protobuf.h"

#include <string.h>

int pb_varint(pb_t *b, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end)
            return -1;
        unsigned char c = *b->p++;
        x |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

int pb_field(pb_t *b, uint64_t *field, int *wt, uint64_t *v, pb_t *sub)
{
    uint64_t key;
    if (pb_varint(b, &key) < 0)
        return -1;
    *field = key >> 3;
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0:
        return pb_varint(b, v);
    case 1:
        if (b->end - b->p < 8)
            return -1;
        memcpy(v, b->p, 8);
        b->p += 8;
        return 0;
    case 2:
        if (pb_varint(b, v) < 0 || *v > (uint64_t)(b->end - b->p))
            return -1;
        sub->p = b->p;
        sub->end = b->p + *v;
        b->p += *v;
        return 0;
    case 5: {
        uint32_t x;
        if (b->end - b->p < 4)
            return -1;
        memcpy(&x, b->p, 4);
        b->p += 4;
        *v = x;
        return 0;
    }
    default:
        return -1;
    }
}
