/* generate.h — text generation with a model (ftk-generate): the model loaded for inference
 * from a weights file or a checkpoint, the tokenizer and generation_config.json stored with
 * it, the prompt's tokens within the model's context, and the decode loop with its sampler
 * (greedy, or temperature + nucleus). Decoding keeps a key/value cache (model_decode).
 *
 * Nothing here prints: the text generated goes to the caller's emit function as it is
 * made. Functions return 0, or an exit code of libcommon/log.h (FTK_EXIT_USAGE: the input
 * cannot be used; FTK_EXIT_FAIL: a runtime failure) or -1 where each says so, with
 * ftk_err_msg() set.
 */
#ifndef FTK_GENERATE_H
#define FTK_GENERATE_H

#include <stdint.h>

#include "../formats/h5.h"
#include "../formats/tokenizer.h"
#include "../libcommon/buf.h"
#include "model.h"

/* path: a weights file, or a checkpoint or run directory (its latest checkpoint: every
 * shard's whole units, widened to float32 whatever the checkpoint's precision). *m: a new
 * float32 inference model on be (the caller frees it); *tf: the HDF5 file holding the
 * tokenizer files (the weights file itself, or the checkpoint's; -1 when a checkpoint
 * stores none), which the caller closes. Returns 0, FTK_EXIT_USAGE (a file or directory
 * that cannot be read) or FTK_EXIT_FAIL (a model that cannot be made; for a weights file,
 * or tensors that cannot be loaded, the message then starts with path); nothing is left
 * open on failure. */
int gen_load(backend_t *be, const char *path, model_config_t *cfg, model_t **m, hid_t *tf);

/* The files stored with a model that generation reads. */
typedef struct {
    tok_t *tok; /* NULL: none stored */
    buf_t gen;  /* generation_config.json (where generation stops), when has_gen */
    int has_gen;
} gen_files_t;

/* The tokenizer of tf, by preference tokenizer.model, then tokenizer.json, then llama2.c's
 * tokenizer.bin; and generation_config.json. Returns 0, or -1 (nothing kept: one stored
 * tokenizer that cannot be read fails it). */
int gen_stored_files(hid_t tf, gen_files_t *f);
void gen_files_free(gen_files_t *f);

/* BOS (where the tokenizer has one) and text's tokens into ids, and in *ctx the positions
 * the cache needs: the prompt and max_new, at most the model's context. Returns 0,
 * FTK_EXIT_USAGE (no token to start from, or a prompt that fills the context) or
 * FTK_EXIT_FAIL. */
int gen_prompt(const tok_t *tok, const model_config_t *cfg, const char *text, size_t len, int64_t max_new,
               tok_ids_t *ids, int64_t *ctx);

typedef struct {
    int greedy;                /* the most likely token (also when temperature is 0) */
    double temperature, top_p; /* otherwise: sampling from the smallest set of probability >= top_p */
    uint64_t seed;
    int64_t max_new;    /* tokens to generate at most */
    const int64_t *eos; /* ids that end generation ... */
    int n_eos;
    int ignore_eos; /* ... unless this is set */
} gen_opts_t;

/* Called with each new stretch of text; ctx is gen_run's emit_ctx. */
typedef void (*gen_emit_fn)(void *ctx, const char *text, size_t len);

/* Continues ids (gen_prompt's, ctx positions at most) with up to o->max_new tokens on m
 * (made for cfg), stopping at an end-of-sequence id. The text the whole sequence decodes
 * to beyond the prompt's goes to emit as it grows, held back while a run of byte pieces
 * may still be an incomplete UTF-8 character; the rest at the end. ids holds the sequence
 * on return. Returns 0 or -1. */
int gen_run(model_t *m, const model_config_t *cfg, const tok_t *tok, tok_ids_t *ids, int64_t ctx,
            const gen_opts_t *o, gen_emit_fn emit, void *emit_ctx);

#endif
