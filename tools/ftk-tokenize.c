/* ftk-tokenize — encode or decode text with a Llama tokenizer, a line at a time.
 * Input lines are JSON strings (so texts may hold newlines); see --help. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/json.h"
#include "../formats/tokenizer.h"
#include "../formats/tokfiles.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"

static const char *tokenizer_path;
static int add_bos, add_eos, decode, pieces;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"tokenizer", 't', OPT_STR, &tokenizer_path, "FILE|DIR|W.h5",
     "tokenizer.model (SentencePiece), tokenizer.json or llama2.c's tokenizer.bin, a folder holding one, or a weights "
     "file that stores one (required)"},
    {"bos", 0, OPT_FLAG, &add_bos, NULL, "prepend the BOS id"},
    {"eos", 0, OPT_FLAG, &add_eos, NULL, "append the EOS id"},
    {"pieces", 0, OPT_FLAG, &pieces, NULL, "print pieces instead of ids"},
    {"decode", 'd', OPT_FLAG, &decode, NULL, "reverse: a line of ids in, a JSON string out"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-tokenize",
    .usage = "--tokenizer FILE|DIR|W.h5 [--bos] [--eos] [--pieces | --decode] [FILE|-]",
    .summary = "Tokenizes text the way ftk-pack does. Each input line is one JSON string (so a\n"
               "text may contain newlines, as \\n); each output line holds its ids separated by\n"
               "single spaces. With --decode, each input line holds ids and each output line is\n"
               "the decoded text as a JSON string. Reads FILE, or stdin when FILE is - or absent.",
    .epilog = "Examples:\n"
              "  echo '\"Hello world\"' | ftk-tokenize -t tokenizer.model        # 15043 3186\n"
              "  echo '15043 3186' | ftk-tokenize -t tokenizer.model --decode   # \"Hello world\"\n"
              "\nExit status: 0 success, 1 I/O failure, 2 bad usage or bad input.\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 1,
};

static int encode_line(const tok_t *tok, tok_ws_t *ws, const char *name, size_t lineno, const char *line,
                       size_t len, tok_ids_t *ids, buf_t *out)
{
    json_value_t *v;
    json_doc_t *doc = json_parse(line, len, NULL, &v);
    if (!doc) {
        /* the parser counts lines from 1 within this line */
        const char *m = ftk_err_msg();
        const char *col = strstr(m, "column ");
        ftk_error("%s:%zu: %s", name, lineno, col ? col : m);
        return -1;
    }
    if (v->type != JSON_STRING) {
        ftk_error("%s:%zu: expected a JSON string, found %s", name, lineno, json_type_name(v->type));
        json_free(doc);
        return -1;
    }
    ids->n = 0;
    if (add_bos && tok_ids_push(ids, tok_bos_id(tok)) < 0)
        goto oom;
    if (tok_encode(tok, ws, v->u.str.s, v->u.str.len, ids) < 0)
        goto oom;
    if (add_eos && tok_ids_push(ids, tok_eos_id(tok)) < 0)
        goto oom;
    json_free(doc);
    for (size_t i = 0; i < ids->n; i++) {
        if (i && buf_putc(out, ' ') < 0)
            return -1;
        if (pieces) {
            size_t pl;
            const char *p = tok_piece(tok, ids->v[i], &pl);
            if (buf_append(out, p, pl) < 0)
                return -1;
        } else {
            char num[16];
            int n = snprintf(num, sizeof num, "%d", ids->v[i]);
            if (buf_append(out, num, (size_t)n) < 0)
                return -1;
        }
    }
    return buf_putc(out, '\n');
oom:
    json_free(doc);
    ftk_error("%s", ftk_err_msg());
    return -1;
}

static int decode_line(const tok_t *tok, const char *name, size_t lineno, const char *line, size_t len,
                       tok_ids_t *ids, buf_t *text, buf_t *out)
{
    ids->n = 0;
    size_t i = 0;
    while (i < len) {
        if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
            i++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(line + i, &end, 10);
        if (end == line + i || errno || v < 0 || v >= tok_vocab_size(tok) ||
            (*end && *end != ' ' && *end != '\t' && *end != '\r' && end < line + len)) {
            ftk_error("%s:%zu:%zu: expected a token id below %d", name, lineno, i + 1, tok_vocab_size(tok));
            return -1;
        }
        if (tok_ids_push(ids, (int32_t)v) < 0)
            return -1;
        i = (size_t)(end - line);
    }
    text->len = 0;
    if (tok_decode(tok, ids->v, ids->n, text) < 0 || json_write_string(out, text->data ? text->data : "", text->len) < 0 ||
        buf_putc(out, '\n') < 0) {
        ftk_error("%s:%zu: %s", name, lineno, ftk_err_msg());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-tokenize");
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rc)
        return rc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (!tokenizer_path) {
        ftk_error("--tokenizer is required");
        return FTK_EXIT_USAGE;
    }
    if (decode && pieces) {
        ftk_error("--decode and --pieces exclude each other");
        return FTK_EXIT_USAGE;
    }
    const char *in = npos ? pos[0] : "-";
    const char *name = strcmp(in, "-") == 0 ? "<stdin>" : in;
    tok_t *tok = tokfiles_load_tok(tokenizer_path, NULL);
    if (!tok) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    if ((add_bos && tok_bos_id(tok) < 0) || (add_eos && tok_eos_id(tok) < 0)) {
        ftk_error("%s: the tokenizer has no %s token", tokenizer_path, add_bos && tok_bos_id(tok) < 0 ? "BOS" : "EOS");
        tok_free(tok);
        return FTK_EXIT_USAGE;
    }
    buf_t input = {0}, out = {0}, text = {0};
    tok_ids_t ids = {0};
    tok_ws_t *ws = tok_ws_new();
    rc = FTK_EXIT_OK;
    if (!ws || buf_read_file(&input, in) < 0) {
        ftk_error("%s", ftk_err_msg());
        rc = FTK_EXIT_FAIL;
        goto done;
    }
    size_t lineno = 0;
    for (size_t p = 0; p < input.len;) {
        const char *nl = memchr(input.data + p, '\n', input.len - p);
        size_t len = nl ? (size_t)(nl - (input.data + p)) : input.len - p;
        lineno++;
        int r = decode ? decode_line(tok, name, lineno, input.data + p, len, &ids, &text, &out)
                       : encode_line(tok, ws, name, lineno, input.data + p, len, &ids, &out);
        if (r < 0) {
            rc = FTK_EXIT_USAGE;
            break;
        }
        if (out.len > (1 << 20)) {
            fwrite(out.data, 1, out.len, stdout);
            out.len = 0;
        }
        p += len + 1;
    }
    if (out.len)
        fwrite(out.data, 1, out.len, stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        ftk_error("writing to stdout: %s", strerror(errno));
        rc = FTK_EXIT_FAIL;
    }
done:
    tok_ws_free(ws);
    tok_ids_free(&ids);
    buf_free(&input);
    buf_free(&out);
    buf_free(&text);
    tok_free(tok);
    return rc;
}
