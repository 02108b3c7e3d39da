/* build.c — the allocations of a training job (build.h). */
#include "build.h"

#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "../libcommon/opts.h"

int build_pass_tokens(int64_t micro_batch, int64_t max_len, int64_t *tokens)
{
    if (opts_mul_i64(micro_batch, max_len, tokens) < 0 || *tokens > BUILD_MAX_PASS_TOKENS) {
        ftk_err_set("--micro-batch %lld of rows of %lld tokens: more than %lld tokens in one pass", (long long)micro_batch,
                    (long long)max_len, (long long)BUILD_MAX_PASS_TOKENS);
        return -1;
    }
    return 0;
}

int build_step_opts(unsigned *opts)
{
    static const char *const names[] = {"device_clip", "first_write", "prefetch", "sumsq_overlap"};
    const int n_names = (int)(sizeof names / sizeof *names);
    const char *e = getenv("FTK_STEP");
    *opts = BUILD_STEP_ALL;
    if (!e || !*e || !strcmp(e, "all"))
        return 0;
    *opts = 0;
    if (!strcmp(e, "none"))
        return 0;
    for (const char *p = e; *p;) {
        size_t len = strcspn(p, ",");
        int k = 0;
        while (k < n_names && (strlen(names[k]) != len || strncmp(p, names[k], len)))
            k++;
        if (k == n_names) {
            ftk_err_set("FTK_STEP=%s: unknown '%.*s' (all, none, or a comma list of device_clip, first_write, "
                        "prefetch, sumsq_overlap)",
                        e, (int)len, p);
            return -1;
        }
        *opts |= 1u << k;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* The backend's scratch for this run's largest shapes (backend.h reserve), last, so that a
 * dry run counts it where the run holds it. */
static int reserve_scratch(backend_t *be, shard_t *sh, const model_config_t *cfg, int64_t max_tokens)
{
    if (!be->reserve)
        return 0;
    bk_reserve_t r = {.tokens = max_tokens, .width = cfg->hidden_size, .heads = cfg->num_attention_heads};
    int n_units;
    const ckpt_unit_t *units = shard_units(sh, &n_units);
    for (int u = 0; u < n_units; u++) { /* the optimizer's one adamw_multi call: every owned slice */
        r.adamw_elems += shard_owned(sh, u).len;
        r.adamw_segs += units[u].n_tensors;
        if (shard_owned(sh, u).len > r.unit_elems)
            r.unit_elems = shard_owned(sh, u).len;
    }
    return be->reserve(be, &r);
}

/* build_job's undo: what it made, freed, and the pointers cleared. */
static int build_undo(shard_t **sh, optim_t **opt, model_t **m, int code)
{
    model_free(*m);
    *m = NULL;
    optim_free(*opt);
    *opt = NULL;
    shard_free(*sh);
    *sh = NULL;
    return code;
}

int build_job(backend_t *be, comm_t *world, const model_config_t *cfg, const build_opts_t *o, int64_t max_tokens,
              shard_t **sh, optim_t **opt, model_t **m)
{
    *m = NULL;
    *opt = NULL;
    *sh = NULL;
    unsigned so;
    if (build_step_opts(&so) < 0)
        return FTK_EXIT_USAGE;
    if (!(*sh = shard_new(be, world, o->strategy, o->group_size, cfg, o->precision)))
        return FTK_EXIT_USAGE; /* the layout does not fit the ranks (or the state not the device) */
    if (shard_set_units(*sh, &o->units) < 0 ||
        shard_set_compress(*sh, o->compress_weights, o->compress_grads) < 0 ||
        !(*opt = optim_new(be, *sh, o->stochastic)))
        return build_undo(sh, opt, m, FTK_EXIT_USAGE);
    int n_units;
    const ckpt_unit_t *units = shard_units(*sh, &n_units);
    /* the attention shapes of every micro-batch, so that a backend that plans per shape
     * (cuDNN) plans and allocates before the first step, not during the run */
    int64_t mb = o->micro_batch > 0 ? o->micro_batch : 1;
    if (shard_reserve(*sh) < 0 ||
        !(*m = model_new_io(be, cfg, o->precision, max_tokens, o->recompute, units, n_units, shard_io(*sh))) ||
        reserve_scratch(be, *sh, cfg, max_tokens) < 0 ||
        (be->attn_prepare &&
         be->attn_prepare(be, o->attn_max_seg > 0 ? o->attn_max_seg : mb, max_tokens / mb,
                          (int)cfg->num_attention_heads, (int)cfg->num_key_value_heads, (int)model_head_dim(cfg),
                          precision_dtypes(o->precision).act) < 0))
        return build_undo(sh, opt, m, FTK_EXIT_FAIL);
    model_set_loss_acc(*m, optim_loss_acc(*opt));
    shard_set_first_write(*sh, (so & BUILD_STEP_FIRST_WRITE) != 0);
    optim_set_device_clip(*opt, (so & BUILD_STEP_DEVICE_CLIP) != 0);
    if (shard_set_sumsq_side(*sh, (so & BUILD_STEP_SUMSQ_OVERLAP) != 0) < 0)
        return build_undo(sh, opt, m, FTK_EXIT_FAIL);
    return 0;
}
