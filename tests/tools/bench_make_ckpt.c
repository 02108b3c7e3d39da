/* Benchmark helper (not a test): writes an S-shard training checkpoint of step 1 from a
 * weights file, with the library's own writer (ckpt_begin, ckpt_shard_*, ckpt_commit), one
 * unit at a time, so that make bench can reshard a checkpoint of a model too large to
 * train here (a 1.1 B-parameter step needs ~24 GB on one process). The parameters are
 * the weights; the moments are deterministic pseudo-random values of AdamW's magnitudes
 * (m ~ 1e-3, v ~ 1e-6), so they compress and hash like real ones; padding stays zero.
 * PRECISION (default fp32) is the manifest's: bf16-true narrows every array to bfloat16
 * (nearest even), so tests/cli/ckpt.sh also uses it for checkpoints of each precision
 * written by the library's writer rather than by ftk-reshard.
 * Usage: bench_make_ckpt WEIGHTS.h5 RUN_DIR SHARDS [PRECISION] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../formats/checkpoint.h"
#include "../../libcommon/log.h"
#include "../../libcommon/rng.h"

int main(int argc, char **argv)
{
    ftk_set_tool("bench_make_ckpt");
    const char *precision = argc == 5 ? argv[4] : "fp32";
    dtype_t dt = ckpt_state_dtype(precision);
    if (argc < 4 || argc > 5 || atoll(argv[3]) < 1 || dt == DT_INVALID) {
        fprintf(stderr, "usage: bench_make_ckpt WEIGHTS.h5 RUN_DIR SHARDS [fp32|bf16-mixed|bf16-true]\n");
        return 2;
    }
    model_config_t cfg;
    hid_t wf = weights_open(argv[1], &cfg);
    int64_t S = atoll(argv[3]);
    ckpt_unit_t *units;
    int n_units;
    if (wf < 0 || ckpt_units(&cfg, S, &units, &n_units) < 0) {
        ftk_error("%s", ftk_err_msg());
        return 1;
    }
    ckpt_meta_t meta = {.step = 1, .tokens_seen = 512, .data_rows = 1, .rows_consumed = 1, .world_size = S,
                        .shard_count = S};
    snprintf(meta.data_file, sizeof meta.data_file, "synthetic");
    snprintf(meta.data_set_xxh3, sizeof meta.data_set_xxh3, "0000000000000000");
    snprintf(meta.init_file, sizeof meta.init_file, "%s", argv[1]);
    snprintf(meta.strategy, sizeof meta.strategy, "full");
    snprintf(meta.precision, sizeof meta.precision, "%s", precision);
    meta.train = (ckpt_train_t){.lr = 2e-4, .min_lr = 6e-5, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                .weight_decay = 0.1, .clip = 1, .warmup = 25, .total_steps = 100,
                                .global_batch = 64, .micro_batch = 4, .seed = 42};
    snprintf(meta.train.schedule, sizeof meta.train.schedule, "cosine");
    if (ckpt_init_hash(wf, &cfg, meta.init_xxh3) < 0) {
        ftk_error("%s", ftk_err_msg());
        return 1;
    }
    int64_t most = 0;
    for (int u = 0; u < n_units; u++)
        most = units[u].padded > most ? units[u].padded : most;
    float *buf = calloc((size_t)most, sizeof *buf), *scratch = malloc((size_t)most * sizeof *scratch);
    uint16_t *narrow = malloc((size_t)most * sizeof *narrow); /* the unit in bf16 (bf16-true) */
    ckpt_shard_writer_t **w = calloc((size_t)S, sizeof *w);
    ckpt_shard_sum_t *sums = calloc((size_t)S, sizeof *sums);
    ckpt_writer_t cw;
    mkdir(argv[2], 0777); /* the run directory; ckpt_begin says why if it is unusable */
    if (!buf || !scratch || !narrow || !w || !sums || ckpt_begin(&cw, argv[2], meta.step) < 0) {
        ftk_error("%s", buf && scratch && narrow && w && sums ? ftk_err_msg() : "out of memory");
        return 1;
    }
    for (int64_t j = 0; j < S; j++)
        if (!(w[j] = ckpt_shard_create(cw.dir, &meta, units, n_units, j))) {
            ftk_error("%s", ftk_err_msg());
            return 1;
        }
    for (int k = 0; k < CKPT_KINDS; k++)
        for (int u = 0; u < n_units; u++) {
            const ckpt_unit_t *x = &units[u];
            memset(buf, 0, (size_t)x->padded * sizeof *buf);
            for (int i = 0; i < x->n_tensors; i++) {
                const ckpt_tensor_t *t = &x->t[i];
                if (k == 0) {
                    if (weights_read_rows(wf, t->name, DT_F32, 0, t->rank == 2 ? t->shape[0] : 1, buf + t->offset,
                                          scratch) < 0) {
                        ftk_error("%s", ftk_err_msg());
                        return 1;
                    }
                    continue;
                }
                rng_t r;
                rng_seed(&r, (uint64_t)(k * 1000 + u * 16 + i));
                for (int64_t e = 0; e < t->numel; e++) {
                    float g = (float)((double)(rng_next(&r) >> 11) / 9007199254740992.0 - 0.5);
                    buf[t->offset + e] = k == 1 ? 2e-3f * g : 1e-6f * g * g;
                }
            }
            const void *src = buf;
            if (dt == DT_BF16) {
                dtype_convert(narrow, DT_BF16, buf, DT_F32, (size_t)x->padded);
                src = narrow;
            }
            for (int64_t j = 0; j < S; j++)
                if (ckpt_shard_put(w[j], k, u, (const char *)src + (size_t)(j * (x->padded / S)) * dtype_size(dt)) < 0) {
                    ftk_error("%s", ftk_err_msg());
                    return 1;
                }
        }
    for (int64_t j = 0; j < S; j++)
        if (ckpt_shard_finish(w[j], j == 0 ? wf : -1, &sums[j]) < 0) {
            ftk_error("%s", ftk_err_msg());
            return 1;
        }
    if (ckpt_commit(&cw, &meta, &cfg, units, n_units, sums, 0) < 0) {
        ftk_error("%s", ftk_err_msg());
        return 1;
    }
    H5Fclose(wf);
    free(buf);
    free(scratch);
    free(narrow);
    free(w);
    free(sums);
    free(units);
    return 0;
}
