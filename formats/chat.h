/* chat.h — training records (Alpaca, conversations) and their templates: one record to
 * token ids + loss mask.
 *
 * ## Input
 * A JSON array of records, or JSON Lines (one record per line), UTF-8; a record is an
 * object of one of these shapes (other members are ignored):
 *
 *   Alpaca        {"instruction": str, "input": str|null (optional), "output": str}
 *                 (formats/alpaca.h)
 *   messages      {"messages": [{"role": R, "content": str}, …]}        (OpenAI style)
 *                 R is "system", "user" or "assistant"
 *   conversations {"conversations": [{"from": F, "value": str}, …]}     (ShareGPT style)
 *                 F is "system", "human" (or "user") or "gpt" (or "assistant")
 *
 * A conversation has at least one assistant turn (else there is nothing to learn) and
 * may have several (multi-turn); empty strings are valid content. A record holding both
 * "messages" and "conversations" is refused (which one was meant?).
 *
 * ## Templates (--template; by default the first record's shape picks: "alpaca" for
 * Alpaca records, "llama-2-chat" for conversations; every record must fit the template)
 *
 * alpaca — BOS + tokens(prompt) + tokens(output) + EOS, prompt and output tokenized
 *   separately, prompt word for word in formats/alpaca.h. Targets: output + EOS.
 *
 * llama-2-chat — Meta's Llama 2 chat format, exactly what transformers'
 *   apply_chat_template renders with the official template of
 *   meta-llama/Llama-2-7b-chat-hf (tokenizer_config.json):
 *     [system S]? user U1, assistant A1, user U2, assistant A2, …
 *   becomes
 *     <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST] A2 </s>…
 *   where the system block is joined to U1 before stripping, every user text (with that
 *   block) and every assistant text is stripped of leading and trailing whitespace
 *   (Python's str.strip(): Unicode White_Space), and a final user turn without an answer
 *   ends the sample at "[/INST]". Without a system message the block is absent.
 *   Roles must alternate user/assistant starting with user, the system message may only
 *   be first (transformers raises on non-alternating roles; a system message in
 *   another place, which the template would silently drop or raise on, is refused).
 *   Targets: each answer's tokens from the space after "[/INST]" through its EOS.
 *
 * chatml — BOS + for each message "<|im_start|>ROLE\nCONTENT<|im_end|>\n" (ROLE system,
 *   user or assistant; content not stripped; any order). Llama tokenizers have no
 *   <|im_start|>/<|im_end|> tokens: the markers are plain text, the whole conversation
 *   one text after BOS, and no EOS is added (generation stops at the text "<|im_end|>").
 *   Targets: each assistant content and its "<|im_end|>" (not the newline after it).
 *
 * ## Tokens: BOS/EOS and whitespace
 * Tokenization is that of Meta's reference chat encoding and of the Hugging Face slow
 * LlamaTokenizer in legacy mode (its default when tokenizer_config.json does not say;
 * legacy=False, not checked here, encodes text after a special token without the "▁"):
 * the rendered text is split at the BOS and EOS markers, which become their ids, and each
 * text piece between them is encoded on its own, with SentencePiece's dummy-prefix space
 * ("▁") at its start. So in llama-2-chat
 * every "[INST]" after a BOS is "▁[", "INST", "]", the space before "</s>" is the token
 * "▁", and an empty answer is "▁▁" + EOS. Text in the data that looks like a special token
 * ("<s>", "</s>", "<unk>") stays text (ftk never parses special tokens out of data;
 * transformers would turn it into the special id).
 *
 * The loss mask is exact at turn boundaries: a piece is encoded as a whole (as
 * transformers does) and a token is a target when its text overlaps a target span of the
 * rendered text. Token positions come from the pieces' lengths; where they do not add up
 * (unknown tokens, a tokenizer that drops spaces) the boundary is found by encoding the
 * text before it. With mask_prompt off every token but the first is a target (as alpaca).
 *
 * ## Ownership and errors
 * Records come from the record reader (formats/records.h: records_next() streams them,
 * records_parse() reads a whole input in memory); the doc and rec arguments below are its
 * JSON values and must outlive the call. Errors: -1 with ftk_err_msg() = "line L, column
 * C: record N: what" (N from 1; the caller adds the file name), or a plain message for out
 * of memory. A chat_enc_t is a per-thread workspace; the tokenizer may be shared by
 * threads.
 */
#ifndef FTK_CHAT_H
#define FTK_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "tokenizer.h"

typedef enum { CHAT_ALPACA, CHAT_LLAMA2, CHAT_CHATML } chat_template_t;

/* "alpaca", "llama-2-chat", "chatml" (the token file's `template` attribute). */
const char *chat_template_name(chat_template_t t);
/* 0, or -1 with a message listing the names. */
int chat_template_parse(const char *name, chat_template_t *t);
/* The template a record's shape selects: llama-2-chat when it has "messages" or
 * "conversations", else alpaca (whose check then names what is missing). */
chat_template_t chat_template_detect(const json_value_t *rec);

/* Checks that record `index` (0-based) fits template t, without tokenizing. */
int chat_check(const json_doc_t *doc, const json_value_t *rec, size_t index, chat_template_t t);

typedef struct {
    tok_ids_t ids;  /* the sample: BOS first */
    uint8_t *mask;  /* mask[k] = 1: ids.v[k] is a target; ids.n entries */
    size_t mask_cap;
} chat_out_t;

void chat_out_free(chat_out_t *o);

typedef struct chat_enc chat_enc_t;
chat_enc_t *chat_enc_new(void);
void chat_enc_free(chat_enc_t *e);

/* Encodes one record with template t into out (replacing its contents). The tokenizer
 * must define BOS and EOS. Returns 0, or -1 with ftk_err_msg() set: the record does not
 * fit t (as chat_check(); after chat_check() succeeded, only out of memory remains). */
int chat_encode(chat_enc_t *e, const tok_t *tok, chat_template_t t, int mask_prompt, const json_doc_t *doc,
                const json_value_t *rec, size_t index, chat_out_t *out);

#endif
