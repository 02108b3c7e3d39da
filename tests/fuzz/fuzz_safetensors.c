/* libFuzzer harness for the safetensors header parser (the security boundary of
 * ftk-import-hf): the input is a whole file. Every accepted file must satisfy the
 * invariants st_parse_buffer() promises, checked here, so a parser bug that accepts an
 * inconsistent header crashes the fuzzer, not just one that overflows a buffer.
 * Build and run: make fuzz (long run), tests/fuzz/run.sh (the short one in make test). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_header_t h;
    /* A copy with no slack after it, so ASan sees any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (st_parse_buffer(buf, size, &h) == 0) {
        uint64_t pos = 0;
        if (8 + h.header_len + h.data_len != size)
            abort();
        for (size_t i = 0; i < h.n; i++) {
            const st_tensor_t *t = &h.tensors[i];
            if (t->begin != pos || t->end < t->begin || t->end > h.data_len || t->n_elems * t->elem_size != t->end - t->begin)
                abort();
            pos = t->end;
            /* Touch the first and last byte of the tensor as a reader would. */
            if (t->end > t->begin) {
                volatile uint8_t x = buf[8 + h.header_len + t->begin];
                x = buf[8 + h.header_len + t->end - 1];
                (void)x;
            }
        }
        if (pos != h.data_len)
            abort();
        st_header_free(&h);
    }
    free(buf);
    return 0;
}
