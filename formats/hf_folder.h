/* hf_folder.h — a Hugging Face LlamaForCausalLM folder, read into an ftk weights file
 * (ftk-import-hf) and written from one (ftk-export-hf).
 *
 * ## On disk (transformers' save_pretrained)
 *
 *     config.json                       the model's configuration (hfconfig.h)
 *     model.safetensors                 every tensor (safetensors.h), when they fit in one
 *                                       file; else
 *     model-00001-of-0000N.safetensors  … shards, and
 *     model.safetensors.index.json      {"metadata": {"total_size": BYTES},
 *                                        "weight_map": {"TENSOR": "FILE", …}}
 *     generation_config.json            where generation stops (hfconfig.h), optional
 *     tokenizer.model, tokenizer.json, tokenizer_config.json, special_tokens_map.json
 *                                       the tokenizer (tokfiles.h), optional
 *
 * Tensor names and layouts are Hugging Face's on both sides (weights.h), so a tensor kept
 * in its dtype passes bit for bit either way. Reading: the shard names of the index must
 * be plain file names in the folder; every tensor must be a parameter of config.json's
 * model, once, of its shape, F32, F16 or BF16, and every parameter must be there; the
 * rotary inverse frequencies older checkpoints saved are skipped (recomputed from
 * rope_theta), and lm_head.weight when config.json ties it to the embedding. Writing:
 * tensors in canonical order, shards filled greedily up to a byte limit (one exceeds it
 * only when one tensor alone does, as transformers does), named as transformers names
 * them, the index only when there are several.
 *
 * ## Conventions
 * Functions return 0 or -1 with ftk_err_msg() set; nothing prints. The structs own what
 * they open or allocate; free them with their _close/_free.
 */
#ifndef FTK_HF_FOLDER_H
#define FTK_HF_FOLDER_H

#include <stddef.h>
#include <stdint.h>

#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/progress.h"
#include "safetensors.h"
#include "tokfiles.h"
#include "weights.h"

/* ---- Reading a folder ------------------------------------------------------------- */

typedef struct {
    /* the caller's */
    const char *dir;
    model_config_t cfg; /* config.json's */
    dtype_t want;       /* the type to store every tensor in; DT_INVALID: each as found */
    tokfiles_t tok;     /* the tokenizer files to store (none: n == 0) */
    /* told of each file whose lm_head.weight is skipped (may be NULL) */
    void (*tied_head_skipped)(const char *path);
    /* hf_import_open's */
    st_file_t *files;
    size_t n_files;
    const st_tensor_t **src; /* per canonical tensor */
    size_t *src_file;
    const uint8_t *done_p; /* the block handed out last: released at the next call */
    size_t done_n;
} hf_import_t;

/* Opens the safetensors files of im->dir (those model.safetensors.index.json lists, else
 * model.safetensors) and matches their tensors to im->cfg's parameters. The message names
 * the file and the tensor. */
int hf_import_open(hf_import_t *im);
/* The one type every tensor is stored in, or DT_INVALID when they differ. */
dtype_t hf_import_common_dtype(const hf_import_t *im);
/* Fills ws's ctx, dtype, rows and extra: the tensors' rows, read without a copy where the
 * type is kept (the pages of a block already written are dropped from memory at the
 * next), and then im->tok's files and the folder's generation_config.json stored. */
void hf_import_source(hf_import_t *im, weights_source_t *ws);
/* Closes the files and frees im->tok too. */
void hf_import_close(hf_import_t *im);

/* ---- Writing a folder ------------------------------------------------------------- */

typedef struct {
    weights_spec_t s;
    dtype_t stored, out;
    uint64_t bytes;
    size_t shard;
} hf_export_item_t;

typedef struct {
    hid_t wf;
    const char *path; /* wf's, for messages */
    const model_config_t *cfg;
    hf_export_item_t *it; /* per canonical tensor */
    size_t n, n_shards;
    uint64_t total;  /* bytes of tensor data */
    dtype_t common;  /* the one output type, or DT_INVALID */
    buf_t index;     /* model.safetensors.index.json, built as the shards are written */
} hf_export_t;

/* Plans the export of weights file wf (path: its name for messages) in type want
 * (DT_INVALID: as stored): each tensor's type, size and shard for shards of at most
 * shard_limit bytes. */
int hf_export_plan(hf_export_t *ex, hid_t wf, const char *path, const model_config_t *cfg, dtype_t want,
                   uint64_t shard_limit);
/* Writes the shards into ad, counting MiB written on prog. */
int hf_export_shards(hf_export_t *ex, atomic_dir_t *ad, progress_t *prog);
/* Then config.json (its torch_dtype the common type, else the weights file's) and, with
 * several shards, the index. */
int hf_export_config(hf_export_t *ex, atomic_dir_t *ad);
void hf_export_free(hf_export_t *ex);

/* "dir/name" (malloc'd; NULL when out of memory), as messages name the folder's files. */
char *hf_folder_path(const char *dir, const char *name);
/* Whether dir/name exists (0 when out of memory). */
int hf_folder_has(const char *dir, const char *name);

/* Writes data as ad's file name. */
int hf_write_file(atomic_dir_t *ad, const char *name, const void *data, size_t len);

#endif
