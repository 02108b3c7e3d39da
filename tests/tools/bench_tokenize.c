/* Benchmark helper (not a test): tokenizes every text of a JSON Lines file of strings,
 * repeatedly for at least a second, with 1 thread and with N threads; prints MB/s.
 * Usage: bench_tokenize TOKENIZER TEXTS.jsonl [THREADS] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../formats/json.h"
#include "../../formats/tokenizer.h"
#include "../../libcommon/log.h"
#include "../../libcommon/timer.h"

static double run(const tok_t *t, const json_value_t *texts, int threads, size_t bytes, long *ntok)
{
    double t0 = time_now(), el = 0;
    int reps = 0;
    long total = 0;
    do {
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            tok_ws_t *ws = tok_ws_new();
            tok_ids_t ids = {0};
#pragma omp for schedule(dynamic, 64)
            for (size_t i = 0; i < texts->u.arr.n; i++) {
                ids.n = 0;
                tok_encode(t, ws, texts->u.arr.items[i].u.str.s, texts->u.arr.items[i].u.str.len, &ids);
                total += (long)ids.n;
            }
            tok_ids_free(&ids);
            tok_ws_free(ws);
        }
        reps++;
        el = time_now() - t0;
    } while (el < 1.0);
    *ntok = total / reps;
    return (double)bytes * reps / el / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    int threads = argc > 3 ? atoi(argv[3]) : omp_get_num_procs();
    tok_t *t = tok_load(argv[1]);
    buf_t b = {0};
    if (!t || buf_read_file(&b, argv[2]) < 0) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        return 1;
    }
    json_opts_t o = {.multi = 1};
    json_value_t *texts;
    json_doc_t *d = json_parse(b.data, b.len, &o, &texts);
    if (!d) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        return 1;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < texts->u.arr.n; i++)
        bytes += texts->u.arr.items[i].u.str.len;
    long ntok;
    double one = run(t, texts, 1, bytes, &ntok);
    double many = run(t, texts, threads, bytes, &ntok);
    printf("{\"texts\": %zu, \"bytes\": %zu, \"tokens\": %ld, \"mbps_1\": %.2f, \"threads\": %d, \"mbps_n\": %.2f}\n",
           texts->u.arr.n, bytes, ntok, one, threads, many);
    json_free(d);
    buf_free(&b);
    tok_free(t);
    return 0;
}
