/* hfconfig.h — a Llama model's shape, read from and written to Hugging Face config.json.
 *
 * ## config.json (transformers' LlamaConfig), the fields ftk reads
 *   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads (required);
 *   num_key_value_heads (default: num_attention_heads; grouped-query attention when
 *   fewer), rms_norm_eps (1e-6), rope_theta (10000), max_position_embeddings (2048),
 *   vocab_size (32000), tie_word_embeddings (false), bos_token_id (1), eos_token_id (2),
 *   initializer_range (0.02), torch_dtype ("float32"), head_dim (must equal
 *   hidden_size / num_attention_heads when present).
 *
 * ## What is refused (exit 2 in the tools), naming the field
 * Anything ftk cannot train faithfully: model_type other than "llama", architectures other
 * than ["LlamaForCausalLM"], a non-null rope_scaling, attention_bias or mlp_bias true,
 * hidden_act other than "silu", a head_dim that differs from hidden_size /
 * num_attention_heads, shapes that do not divide (hidden_size by heads, heads by KV
 * heads), an odd head dimension (rotary embeddings pair dimensions), non-positive sizes,
 * eos_token_id given as a list of several ids.
 *
 * ## Writing
 * hfconfig_write() emits a LlamaForCausalLM config.json that transformers loads
 * unchanged: the fields above plus architectures, model_type, hidden_act,
 * attention_bias/mlp_bias false, rope_scaling null, use_cache true.
 *
 * Functions return 0 or -1 with ftk_err_msg() set ("line L, column C: field: what" when
 * the JSON position is known).
 */
#ifndef FTK_HFCONFIG_H
#define FTK_HFCONFIG_H

#include <stdint.h>

#include "../libcommon/buf.h"
#include "../libcommon/dtype.h"

typedef struct {
    int64_t hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    int64_t vocab_size, max_position_embeddings;
    double rms_norm_eps, rope_theta, initializer_range;
    int tie_word_embeddings;
    int64_t bos_token_id, eos_token_id; /* -1: none */
    dtype_t torch_dtype;
} model_config_t;

/* LlamaConfig's defaults for every optional field; the required ones are 0. */
void model_config_defaults(model_config_t *c);
/* Checks the shape constraints listed above. */
int model_config_check(const model_config_t *c);
static inline int64_t model_head_dim(const model_config_t *c) { return c->hidden_size / c->num_attention_heads; }
/* Number of parameters (counting a tied embedding once). */
int64_t model_n_params(const model_config_t *c);

/* Parses config.json text. */
int hfconfig_parse(const char *text, size_t len, model_config_t *c);
/* Appends a config.json (with a final newline) for c, saying torch_dtype = dt. */
int hfconfig_write(buf_t *out, const model_config_t *c, dtype_t dt);

/* ## Where generation stops (transformers' rule)
 * transformers' generate() stops at the eos_token_id of the model's GenerationConfig: the
 * one read from generation_config.json when the folder has that file, else the one made
 * from config.json. The tokenizer's EOS plays no part, so where it differs, generation
 * does not stop at it; and a generation_config.json without eos_token_id (or with null)
 * means no end-of-sequence id at all, not config.json's (checked with transformers 4.38:
 * tests/cli/eos.sh). hfconfig_generation_eos() applies that rule: generation_config.json's
 * eos_token_id (an id or a list of ids) when gen_json is given, else c->eos_token_id
 * (none when -1). ids gets up to max ids (sorted, no repeats), *n their count, *from_gen
 * whether generation_config.json decided (may be NULL). Returns 0, or -1 when gen_json is
 * not a JSON object or its eos_token_id is not an id or a list of ids. */
int hfconfig_generation_eos(const model_config_t *c, const char *gen_json, size_t len, int64_t *ids, int max, int *n,
                            int *from_gen);
/* "2" or "[2, 32000]" (up to n ids) into out, for messages. */
void hfconfig_ids_str(const int64_t *ids, int n, char *out, size_t size);
/* When the ids generation stops at (from hfconfig_generation_eos(); from_gen: they came
 * from generation_config.json) are not exactly the tokenizer's EOS (tok_eos, -1: none),
 * writes the warning the tools print into msg and returns 1; else returns 0. */
int hfconfig_eos_disagree(const int64_t *ids, int n, int from_gen, int64_t tok_eos, char *msg, size_t size);

/* Named shapes for ftk-init: "tiny" (a few thousand parameters, for tests and the demo),
 * "stories260k" (llama2.c's), "llama-1b" (TinyLlama-1.1B's shape), "llama2-7b" (exact
 * Llama-2-7B), "llama2-13b". Returns -1 for an unknown name. */
int model_preset(const char *name, model_config_t *c);
const char *model_preset_names(void); /* "tiny, stories260k, …" for help and errors */

#endif
