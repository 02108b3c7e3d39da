/* tokenizer.h — Llama-style BPE tokenizers: SentencePiece `tokenizer.model` and Hugging
 * Face `tokenizer.json`, one encoder for both, exact to SentencePiece.
 *
 * ## Formats read
 *
 * SentencePiece model (protobuf `ModelProto`, sentencepiece_model.proto). Fields used:
 *   1 pieces (repeated: 1 piece string, 2 score float, 3 type: 1 NORMAL, 2 UNKNOWN,
 *     3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE)
 *   2 trainer_spec: 3 model_type (must be 2 = BPE), 24 treat_whitespace_as_suffix (must be
 *     false), 35 byte_fallback, 40 unk_id, 41 bos_id, 42 eos_id, 44 unk_surface
 *   3 normalizer_spec: 1 name, 2 precompiled_charsmap (must be empty: identity
 *     normalization, as Llama 2), 3 add_dummy_prefix, 4 remove_extra_whitespaces,
 *     5 escape_whitespaces (proto2 defaults apply when absent: true, true, true)
 * USER_DEFINED and UNUSED pieces and Unigram models are refused with a message.
 *
 * tokenizer.json (Hugging Face `tokenizers`): model.type "BPE" with vocab, merges
 * ("a b" strings or [a, b] pairs), byte_fallback, unk_token, fuse_unk, ignore_merges;
 * normalizer null or a Sequence of Prepend("▁") and Replace(" " → "▁"); pre_tokenizer
 * null or Metaspace("▁", split false). Anything else (ByteLevel, NFKC, Split, …) is
 * refused naming the field. BOS/EOS are the added tokens "<s>" and "</s>".
 *
 * llama2.c's tokenizer.bin (recognised by a name ending in ".bin"): the same pieces and
 * scores with "▁" written as ' ' (see load_llama2c() in tokenizer_load.c); read back as
 * the SentencePiece BPE model it was exported from.
 *
 * ## Encoding (what SentencePiece's bpe_model.cc does, which we match id for id)
 *
 *  1. Normalize: empty text gives no ids. Invalid UTF-8 bytes become U+FFFD, one per byte
 *     (SentencePiece's rule; ftk-pack rejects invalid UTF-8 before it gets here). With
 *     add_dummy_prefix a "▁" is prepended; with escape_whitespaces each ' ' becomes "▁";
 *     with remove_extra_whitespaces leading, trailing and repeated spaces are dropped.
 *  2. Split into Unicode characters.
 *  3. Repeatedly merge the adjacent pair whose concatenation is a vocabulary piece with
 *     the highest score (SentencePiece) or the lowest merge rank (tokenizer.json); ties go
 *     to the leftmost pair.
 *  4. A symbol that is not in the vocabulary becomes its UTF-8 bytes as <0xXX> pieces
 *     (byte fallback) or the unknown id.
 * Special-token text such as "<s>" in the input is ordinary text: BOS/EOS ids are only
 * ever added by the caller (tok_bos_id()), never parsed from data.
 *
 * ## Decoding (SentencePiece's DecodeIds)
 * Control pieces (<s>, </s>) give nothing, the unknown piece gives " ⁇ ", "▁" gives ' ',
 * the first non-control piece loses one leading "▁" (the dummy prefix), and runs of byte
 * pieces are read as UTF-8 with U+FFFD for each byte that is not part of a valid
 * character. For valid text, decode(encode(text)) == text when remove_extra_whitespaces
 * is off.
 *
 * ## Ownership and errors
 * tok_load() returns NULL with ftk_err_msg() set. A tok_t is immutable after loading and
 * may be shared by threads; each thread encodes with its own tok_ws_t workspace.
 */
#ifndef FTK_TOKENIZER_H
#define FTK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../libcommon/buf.h"

typedef struct tok tok_t;
typedef struct tok_ws tok_ws_t;

typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids_t;

int tok_ids_push(tok_ids_t *ids, int32_t id);
void tok_ids_free(tok_ids_t *ids);

/* Detects the format from the content (JSON object or protobuf). */
tok_t *tok_load(const char *path);
tok_t *tok_load_mem(const char *data, size_t len, const char *name);
void tok_free(tok_t *t);

int tok_vocab_size(const tok_t *t);
int tok_bos_id(const tok_t *t); /* -1 when the model has none */
int tok_eos_id(const tok_t *t);
int tok_unk_id(const tok_t *t);
const char *tok_format(const tok_t *t); /* "sentencepiece", "tokenizer.json" or "llama2.c" */
/* The piece string of an id (not NUL-terminated; *len bytes), or NULL if out of range. */
const char *tok_piece(const tok_t *t, int id, size_t *len);

tok_ws_t *tok_ws_new(void);
void tok_ws_free(tok_ws_t *ws);

/* Appends the ids of text[0..len) to ids. Returns 0, or -1 (out of memory, or text
 * longer than 1 GiB) with ftk_err_msg() set. */
int tok_encode(const tok_t *t, tok_ws_t *ws, const char *text, size_t len, tok_ids_t *ids);

/* Appends the text of ids to out. Returns 0, or -1 when an id is out of range. */
int tok_decode(const tok_t *t, const int32_t *ids, size_t n, buf_t *out);

#endif
