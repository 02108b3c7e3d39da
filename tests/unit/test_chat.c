/* Unit tests of formats/chat: templates, stripping and the loss mask, with a character-level
 * tokenizer.json written here (one token per character, no byte fallback, so a character
 * outside the vocabulary is <unk>). There every token's text is known, which checks both
 * ways of placing the mask: from piece lengths, and (when <unk> appears and lengths do not
 * add up) by encoding the text before each boundary. The real Llama 2 tokenizer is checked
 * against transformers in tests/ref/chat_template_vs_transformers.py. */
#include <stdlib.h>
#include <string.h>

#include "../../formats/chat.h"
#include "../../formats/records.h"
#include "../../libcommon/buf.h"
#include "../../libcommon/log.h"
#include "test.h"

#define SP "\xE2\x96\x81"

/* ids: <unk> 0, <s> 1, </s> 2, "▁" 3, '\n' 4, then ASCII '!'..'~' from 5 */
static int char_id(unsigned char c)
{
    if (c == ' ')
        return 3;
    if (c == '\n')
        return 4;
    if (c >= '!' && c <= '~')
        return 5 + (c - '!');
    return 0;
}

static tok_t *char_tokenizer(void)
{
    buf_t j = {0};
    buf_printf(&j, "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": false, "
                   "\"byte_fallback\": false, \"merges\": [], \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, "
                   "\"" SP "\": 3, \"\\n\": 4");
    for (int c = '!'; c <= '~'; c++)
        buf_printf(&j, ", \"%s%c\": %d", c == '"' || c == '\\' ? "\\" : "", c, 5 + (c - '!'));
    buf_printf(&j, "}}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "
                   "\"prepend\": \"" SP "\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                   "\"content\": \"" SP "\"}]}, \"pre_tokenizer\": null, \"added_tokens\": ["
                   "{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, "
                   "{\"id\": 1, \"content\": \"<s>\", \"special\": true}, "
                   "{\"id\": 2, \"content\": \"</s>\", \"special\": true}]}");
    tok_t *t = tok_load_mem(j.data, j.len, "char-tokenizer.json");
    if (!t)
        fprintf(stderr, "char tokenizer: %s\n", ftk_err_msg());
    buf_free(&j);
    return t;
}

/* Expected sample built piece by piece: a piece is the dummy "▁" and one token per byte
 * (UTF-8 bytes of a non-ASCII character: one <unk> per character). */
typedef struct {
    int32_t ids[4096];
    uint8_t mask[4096];
    size_t n;
} want_t;

static void want_special(want_t *w, int32_t id, int target)
{
    w->ids[w->n] = id;
    w->mask[w->n++] = (uint8_t)target;
}

/* text with target spans marked by '{' … '}' (not part of the text) */
static void want_piece(want_t *w, const char *marked)
{
    int in = 0;
    want_special(w, 3, 0);
    for (const unsigned char *p = (const unsigned char *)marked; *p; p++) {
        if (*p == '{' || *p == '}') {
            in = *p == '{';
            continue;
        }
        if (*p >= 0x80 && (*p & 0xC0) == 0x80)
            continue; /* continuation byte: the character was one <unk> */
        want_special(w, char_id(*p), in);
    }
}

static int encode(const tok_t *tok, chat_template_t t, int mask_prompt, const char *json, chat_out_t *out)
{
    records_doc_t d;
    if (records_parse(json, strlen(json), &d) < 0) {
        fprintf(stderr, "parse: %s\n", ftk_err_msg());
        return -1;
    }
    chat_enc_t *e = chat_enc_new();
    int rc = chat_check(d.doc, &d.recs[0], 0, t) < 0 ? -1 : chat_encode(e, tok, t, mask_prompt, d.doc, &d.recs[0], 0, out);
    if (rc < 0)
        fprintf(stderr, "encode: %s\n", ftk_err_msg());
    chat_enc_free(e);
    records_doc_free(&d);
    return rc;
}

static int same(const chat_out_t *o, const want_t *w)
{
    int ok = o->ids.n == w->n;
    for (size_t k = 0; ok && k < w->n; k++)
        ok = o->ids.v[k] == w->ids[k] && o->mask[k] == w->mask[k];
    if (!ok) {
        fprintf(stderr, "got  ");
        for (size_t k = 0; k < o->ids.n; k++)
            fprintf(stderr, "%d/%d ", o->ids.v[k], o->mask[k]);
        fprintf(stderr, "\nwant ");
        for (size_t k = 0; k < w->n; k++)
            fprintf(stderr, "%d/%d ", w->ids[k], w->mask[k]);
        fprintf(stderr, "\n");
    }
    return ok;
}

static int refused(const tok_t *tok, chat_template_t t, const char *json, const char *want)
{
    records_doc_t d;
    if (records_parse(json, strlen(json), &d) < 0)
        return strstr(ftk_err_msg(), want) != NULL;
    int rc = chat_check(d.doc, &d.recs[0], 0, t);
    int ok = rc < 0 && strstr(ftk_err_msg(), want);
    chat_enc_t *e = chat_enc_new();
    chat_out_t o = {0};
    ok = ok && chat_encode(e, tok, t, 1, d.doc, &d.recs[0], 0, &o) < 0 && strstr(ftk_err_msg(), want);
    if (!ok)
        fprintf(stderr, "wanted \"%s\", got \"%s\"\n", want, ftk_err_msg());
    chat_out_free(&o);
    chat_enc_free(e);
    records_doc_free(&d);
    return ok;
}

int main(void)
{
    tok_t *tok = char_tokenizer();
    CHECK(tok != NULL);
    if (!tok)
        TEST_END();
    chat_out_t o = {0};
    want_t w;

    /* llama-2-chat: system block joined to the first user text, then stripped (here the
     * empty user text lets the strip reach into the block); Python's Unicode whitespace
     * (U+3000, U+0085) stripped; an empty answer is "  " + EOS; a final user turn ends at
     * [/INST] with no EOS. */
    CHECK(encode(tok, CHAT_LLAMA2, 1,
                 "{\"messages\": [{\"role\": \"system\", \"content\": \" S \"}, {\"role\": \"user\", \"content\": \"\"},"
                 "{\"role\": \"assistant\", \"content\": \"\\u3000 ok \\u0085\"}, {\"role\": \"user\", \"content\": \"u2\"},"
                 "{\"role\": \"assistant\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"x\"}]}",
                 &o) == 0);
    w.n = 0;
    want_special(&w, 1, 0);
    want_piece(&w, "[INST] <<SYS>>\n S \n<</SYS>> [/INST]{ ok }");
    want_special(&w, 2, 1);
    want_special(&w, 1, 0);
    want_piece(&w, "[INST] u2 [/INST]{  }");
    want_special(&w, 2, 1);
    want_special(&w, 1, 0);
    want_piece(&w, "[INST] x [/INST]");
    CHECK(same(&o, &w));

    /* chatml, every character known: the mask from piece lengths */
    const char *cm = "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\n u <|im_end|>\n"
                     "<|im_start|>assistant\n{ a b <|im_end|>}\n<|im_start|>user\n<|im_end|>\n"
                     "<|im_start|>assistant\n{<|im_end|>}\n";
    CHECK(encode(tok, CHAT_CHATML, 1,
                 "{\"conversations\": [{\"from\": \"system\", \"value\": \"s\"}, {\"from\": \"human\", \"value\": \" u \"},"
                 "{\"from\": \"gpt\", \"value\": \" a b \"}, {\"from\": \"human\", \"value\": \"\"},"
                 "{\"from\": \"gpt\", \"value\": \"\"}]}",
                 &o) == 0);
    w.n = 0;
    want_special(&w, 1, 0);
    want_piece(&w, cm);
    CHECK(same(&o, &w));

    /* <unk> tokens (é, 日): lengths do not add up, boundaries found by encoding prefixes */
    cm = "<|im_start|>user\n\xC3\xA9<|im_end|>\n<|im_start|>assistant\n{\xE6\x97\xA5 \xC3\xA9x<|im_end|>}\n";
    CHECK(encode(tok, CHAT_CHATML, 1,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u00e9\"}, "
                 "{\"role\": \"assistant\", \"content\": \"\\u65e5 \\u00e9x\"}]}",
                 &o) == 0);
    w.n = 0;
    want_special(&w, 1, 0);
    want_piece(&w, cm);
    CHECK(same(&o, &w));

    /* --no-mask-prompt: every token but the first */
    CHECK(encode(tok, CHAT_CHATML, 0,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
                 &o) == 0);
    int all = o.ids.n > 2 && o.mask[0] == 0;
    for (size_t k = 1; k < o.ids.n; k++)
        all &= o.mask[k] == 1;
    CHECK(all);

    /* alpaca through the same entry point: BOS + prompt + output + EOS, each tokenized alone */
    CHECK(encode(tok, CHAT_ALPACA, 1, "{\"instruction\": \"i\", \"output\": \"o\"}", &o) == 0);
    w.n = 0;
    want_special(&w, 1, 0);
    want_piece(&w, "Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\ni\n\n### Response:\n");
    want_piece(&w, "{o}");
    w.mask[w.n - 2] = 1; /* the output's dummy "▁" is part of the output */
    want_special(&w, 2, 1);
    CHECK(same(&o, &w));

    /* template names and detection */
    chat_template_t t;
    CHECK(chat_template_parse("llama-2-chat", &t) == 0 && t == CHAT_LLAMA2);
    CHECK(chat_template_parse("chatml", &t) == 0 && t == CHAT_CHATML);
    CHECK(chat_template_parse("vicuna", &t) < 0 && strstr(ftk_err_msg(), "unknown template"));
    CHECK(strcmp(chat_template_name(CHAT_ALPACA), "alpaca") == 0);

    /* refusals, each naming the record, line and column */
    CHECK(refused(tok, CHAT_LLAMA2, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}",
                  "line 1, column 14: record 1: no assistant turn"));
    CHECK(refused(tok, CHAT_LLAMA2,
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}",
                  "column 58: record 1: messages[1]: roles must alternate"));
    CHECK(refused(tok, CHAT_CHATML, "{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}]}", "unknown role \"tool\""));
    CHECK(refused(tok, CHAT_CHATML, "{\"messages\": [{\"role\": \"user\"}]}", "required field \"content\" is missing"));
    CHECK(refused(tok, CHAT_CHATML, "{\"instruction\": \"a\", \"output\": \"b\"}", "an Alpaca record"));
    CHECK(refused(tok, CHAT_ALPACA, "{\"messages\": []}", "a conversation, but template alpaca"));
    CHECK(refused(tok, CHAT_LLAMA2, "[1]", "record 1: expected an object, found number"));

    chat_out_free(&o);
    tok_free(tok);
    TEST_END();
}
