/* weights.h — ftk's model weights file (ftk_format "weights", version 1).
 *
 * ## On disk (HDF5, conventions of h5.h)
 *
 *   /                 attrs ftk_format = "weights", ftk_format_version = 1,
 *                     dtype = "float32" | "float16" | "bfloat16" | "mixed" (the tensors'),
 *                     n_params (int64), source (string: where the weights came from)
 *   /config           attrs: the model's shape under Hugging Face's config.json names
 *                     (hfconfig.h): hidden_size, intermediate_size, num_hidden_layers,
 *                     num_attention_heads, num_key_value_heads, vocab_size,
 *                     max_position_embeddings, tie_word_embeddings, bos_token_id,
 *                     eos_token_id (int64; -1 = none); rms_norm_eps, rope_theta,
 *                     initializer_range (float64); torch_dtype (string)
 *   /tensors/NAME     one dataset per parameter, named and shaped exactly as in Hugging
 *                     Face's LlamaForCausalLM (HF's rotary layout for q/k):
 *                       model.embed_tokens.weight                 [vocab, hidden]
 *                       model.layers.L.input_layernorm.weight     [hidden]
 *                       model.layers.L.self_attn.q_proj.weight    [heads·hd, hidden]
 *                       model.layers.L.self_attn.k_proj.weight    [kv_heads·hd, hidden]
 *                       model.layers.L.self_attn.v_proj.weight    [kv_heads·hd, hidden]
 *                       model.layers.L.self_attn.o_proj.weight    [hidden, heads·hd]
 *                       model.layers.L.post_attention_layernorm.weight [hidden]
 *                       model.layers.L.mlp.gate_proj.weight       [intermediate, hidden]
 *                       model.layers.L.mlp.up_proj.weight         [intermediate, hidden]
 *                       model.layers.L.mlp.down_proj.weight       [hidden, intermediate]
 *                       model.norm.weight                         [hidden]
 *                       lm_head.weight                            [vocab, hidden] (absent when tied)
 *                     Types: float32 (H5T_IEEE_F32LE), float16 (IEEE binary16 little-endian,
 *                     which h5py reads as numpy float16), bfloat16 (uint16 with dataset
 *                     attribute dtype = "bfloat16"). Each has xxh3_64.
 *   /tokenizer/FILE   uint8 datasets holding tokenizer files byte for byte as found
 *                     beside the weights (tokenizer.model, tokenizer.json,
 *                     tokenizer_config.json, special_tokens_map.json, or llama2.c's
 *                     tokenizer.bin; and generation_config.json, which says where
 *                     generation stops: hfconfig.h), so that later stages need only the .h5; ftk-export-hf
 *                     writes them back out.
 *   /optimizer        optional (ftk-merge --with-optimizer): attrs step (int64), beta1,
 *                     beta2, eps (float64); adam_m/NAME and adam_v/NAME, float32 with the
 *                     shape of /tensors/NAME, the AdamW moments of a checkpoint. Readers of
 *                     weights ignore it.
 *
 * Readers refuse other formats and versions above WEIGHTS_VERSION (h5_open).
 * Functions return 0 (or a valid hid_t) or -1 with ftk_err_msg() set.
 */
#ifndef FTK_WEIGHTS_H
#define FTK_WEIGHTS_H

#include <hdf5.h>
#include <stdint.h>

#include "../libcommon/dtype.h"
#include "h5.h"
#include "hfconfig.h"

#define WEIGHTS_FORMAT "weights"
#define WEIGHTS_VERSION 1
#define WEIGHTS_NAME_MAX 96

typedef struct {
    char name[WEIGHTS_NAME_MAX];
    int rank; /* 1 or 2 */
    int64_t shape[2];
    int is_norm; /* RMSNorm gain: initialised to 1 */
} weights_spec_t;

/* The parameters of a model in canonical order (embedding, layer by layer, final norm,
 * head): that order is the file's, the export's and the training units'. */
size_t weights_n_tensors(const model_config_t *c);
void weights_tensor_spec(const model_config_t *c, size_t i, weights_spec_t *out);
/* Index of a parameter name, or -1. */
long weights_find(const model_config_t *c, const char *name);

/* Creates path (the caller usually passes an atomic temporary) with the root attributes,
 * /config, and the empty groups /tensors and /tokenizer. */
hid_t weights_create(const char *path, const model_config_t *c, const char *dtype_label, const char *source);
/* Opens a weights file and reads its /config; then checks every tensor the config names:
 * present, float32/float16/bfloat16, and of the config's shape (a file is untrusted even
 * when its checksums hold). H5I_INVALID_HID with the file, tensor and shapes in the
 * message when not. */
hid_t weights_open(const char *path, model_config_t *c);
/* That check alone: 0, or -1 naming the first tensor that is missing, of another type or
 * of another shape. Reads metadata only. */
int weights_check_tensors(hid_t file, const model_config_t *c);
int weights_read_config(hid_t file, model_config_t *c);

/* HDF5 memory type for dt (the file type is the same). */
hid_t weights_h5type(dtype_t dt);
/* Starts writing /tensors/NAME of type dt; append rows with h5w_append. */
h5w_stream_t *weights_tensor_begin(hid_t file, const weights_spec_t *s, dtype_t dt, int zstd_level);
/* The stored type of /tensors/NAME (DT_INVALID with ftk_err_msg set when unusable). */
dtype_t weights_tensor_dtype(hid_t file, const char *name);
/* Reads rows [row0, row0+n) of /tensors/NAME (a 1-D tensor is one row), converting to
 * dt; scratch must hold n rows in the stored type when that differs from dt (it may be
 * NULL otherwise). */
int weights_read_rows(hid_t file, const char *name, dtype_t dt, int64_t row0, int64_t n, void *out, void *scratch);
/* Where /tensors/NAME's bytes lie when they can be read without HDF5 (pread: one large
 * sequential read, no copy through the library): a contiguous, unfiltered, allocated
 * dataset whose file type is its dtype's memory layout (weights_h5type), i.e. the file's
 * bytes are the tensor's in memory. Returns 1 with *fd (HDF5's own descriptor: valid
 * while file is open; pread only, never read/lseek), *offset (bytes from the start of the
 * file) and *xxh3 (the dataset's checksum of those bytes; *has_sum 0 where it has none);
 * 0 where it cannot be (read it with weights_read_rows); -1 with ftk_err_msg() set. */
int weights_tensor_raw(hid_t file, const char *name, int *fd, int64_t *offset, uint64_t *xxh3, int *has_sum);

/* ---- Writing a whole weights file from a source ------------------------------------
 * The importers and ftk-init differ only in where a tensor's rows come from, so they
 * describe that and weights_write_file() does the rest: writes path through a
 * temporary beside it, renamed into place only when complete (output.h: flags is
 * OUTPUT_FORCE to replace an existing file, else 0; a FIFO or a device is refused), every tensor
 * in canonical order in blocks of rows (about 32 MiB), so memory stays bounded by one
 * block whatever the model's size.
 *  - dtype(ctx, i): the type tensor i is stored in;
 *  - rows(ctx, i, spec, dt, row0, n, scratch): rows [row0, row0+n) of tensor i in type
 *    dt, either as a pointer into the source's own memory (no copy) or written into
 *    scratch (room for the block) and scratch returned; NULL with ftk_err_msg set on error;
 *  - extra(ctx, file) (may be NULL): called before closing, e.g. to store tokenizer files.
 * The progress display counts bytes written. */
typedef struct {
    const model_config_t *cfg;
    const char *source;      /* the root "source" attribute */
    const char *dtype_label; /* the root "dtype" attribute */
    int zstd_level;
    void *ctx;
    dtype_t (*dtype)(void *ctx, size_t i);
    const void *(*rows)(void *ctx, size_t i, const weights_spec_t *s, dtype_t dt, int64_t row0, int64_t n,
                        void *scratch);
    int (*extra)(void *ctx, hid_t file);
} weights_source_t;

/* Returns 0 or -1; *bytes (may be NULL) gets the tensor bytes written. */
int weights_write_file(const char *path, int flags, const weights_source_t *src, uint64_t *bytes);

/* Tokenizer files: stored and listed. */
int weights_put_file(hid_t file, const char *name, const void *data, size_t len);
/* Calls fn(name, data, len, ctx) for every stored tokenizer file, in name order. */
int weights_each_file(hid_t file, int (*fn)(const char *name, const void *data, size_t len, void *ctx), void *ctx);

#endif
