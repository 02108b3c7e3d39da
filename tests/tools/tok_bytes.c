/* Test helper: tokenizes raw byte strings given as hex, one per line, printing ids.
 * Lets the reference tests feed invalid UTF-8 that JSON cannot carry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../formats/tokenizer.h"
#include "../../libcommon/log.h"

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    tok_t *t = tok_load(argv[1]);
    if (!t) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        return 2;
    }
    tok_ws_t *ws = tok_ws_new();
    tok_ids_t ids = {0};
    char line[1 << 16];
    unsigned char bytes[1 << 15];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        for (char *p = line; p[0] && p[1] && p[0] != '\n'; p += 2) {
            unsigned v;
            sscanf(p, "%2x", &v);
            bytes[n++] = (unsigned char)v;
        }
        ids.n = 0;
        tok_encode(t, ws, (const char *)bytes, n, &ids);
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.v[i]);
        printf("\n");
    }
    tok_ids_free(&ids);
    tok_ws_free(ws);
    tok_free(t);
    return 0;
}
