/* tokfiles.h — the tokenizer files a user points at with --tokenizer, wherever they are.
 *
 * A tokenizer is a handful of files that travel together (weights.h, /tokenizer): the
 * encoder (tokenizer.model, tokenizer.json, or llama2.c's tokenizer.bin) and Hugging Face's
 * companions (tokenizer_config.json, special_tokens_map.json). The tools accept any of
 * three places for them, so the same --tokenizer works for every stage:
 *  - a directory: the files of those names found in it (an HF model or tokenizer folder);
 *  - an ftk weights file (.h5): the files stored in its /tokenizer group;
 *  - one file: stored under its own name when that is one of the names above, else under
 *    the encoder name its contents imply (a JSON object: tokenizer.json; a name ending in
 *    ".bin": tokenizer.bin; otherwise a SentencePiece tokenizer.model).
 * generation_config.json, which weights files also keep under /tokenizer, says where
 * generation stops: it belongs to the model, not to the tokenizer, and is never taken.
 *
 * The checksum that identifies a tokenizer (tokens.h: tokenizer_xxh3) is XXH3-64 of the
 * encoder file's bytes, so it is the same whether the file was read from a folder or from
 * a weights file.
 *
 * tokfiles_load() returns 0, or -1 with ftk_err_msg() set naming the path: it does not
 * exist, cannot be read, is a weights file or directory holding no encoder, or is an HDF5
 * file of another ftk format. The tokfiles_t owns its buffers; tokfiles_free() releases
 * them. */
#ifndef FTK_TOKFILES_H
#define FTK_TOKFILES_H

#include <stddef.h>
#include <stdint.h>

#include "../libcommon/buf.h"
#include "h5.h"

#define TOKFILES_MAX 5

typedef struct {
    const char *name; /* one of tokfiles_names (static storage) */
    buf_t data;
} tokfile_t;

typedef struct {
    tokfile_t f[TOKFILES_MAX];
    int n;
} tokfiles_t;

/* The names that make up a tokenizer, encoders first in the order the tools prefer them. */
extern const char *const tokfiles_names[TOKFILES_MAX];

int tokfiles_load(const char *path, tokfiles_t *out);
void tokfiles_free(tokfiles_t *t);
/* The file stored under name, or NULL. */
const tokfile_t *tokfiles_get(const tokfiles_t *t, const char *name);
/* The encoder: tokenizer.model, else tokenizer.json, else tokenizer.bin; NULL when none. */
const tokfile_t *tokfiles_encoder(const tokfiles_t *t);
/* Whether name is a tokenizer file's name (not generation_config.json). */
int tokfiles_is_tokenizer_name(const char *name);
/* Appends the files held as "tokenizer.model, tokenizer.json" to b (or "none"). */
int tokfiles_list(const tokfiles_t *t, buf_t *b);
/* Every file held stored into an open weights file (weights_put_file): 0, or -1 with
 * ftk_err_msg() set. */
int tokfiles_store(const tokfiles_t *t, hid_t file);

/* The encoder at path (a file, a folder or a weights file, as tokfiles_load() takes them)
 * loaded, for the tools whose --tokenizer takes any of the three; *hash (may be NULL) gets
 * XXH3-64 of its bytes (tokens.h: tokenizer_xxh3). NULL with ftk_err_msg() set naming path. */
struct tok;
struct tok *tokfiles_load_tok(const char *path, uint64_t *hash);

#endif
