/* protobuf.h — reading protobuf's wire format, as much as ftk reads: the SentencePiece
 * model (tokenizer_load.c) and TensorBoard's Event records (tfevents.c).
 *
 * A message is a sequence of fields, each a varint key (field number << 3 | wire type)
 * and a value by wire type: 0 a varint; 1 eight bytes; 2 a varint length, then that many
 * bytes (a string or a nested message); 5 four bytes. Groups (3, 4) are not read.
 * https://protobuf.dev/programming-guides/encoding/
 *
 * The reader borrows the bytes [p, end) and moves p. Functions return 0, or -1 when the
 * bytes end early or are not the wire format (no message is set: the caller names what
 * was malformed). */
#ifndef FTK_PROTOBUF_H
#define FTK_PROTOBUF_H

#include <stdint.h>

typedef struct {
    const unsigned char *p, *end;
} pb_t;

/* A varint of at most 10 bytes. */
int pb_varint(pb_t *b, uint64_t *v);

/* One field: its number and wire type, *v its value (wire 0: the varint; 1 and 5: the
 * bytes, little-endian; 2: the length, the bytes themselves in *sub). */
int pb_field(pb_t *b, uint64_t *field, int *wt, uint64_t *v, pb_t *sub);

#endif
