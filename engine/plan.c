/* plan.c — the memory plan (plan.h). */
#include "plan.h"

#include <string.h>

#include "../libcommon/log.h"
#include "bgsave.h"

/* One dry build on a fresh planning backend; the accounting at its end. */
static int dry_build(const plan_opts_t *p, int rank, int recompute, bk_mem_t *mem, int64_t *S, int64_t *snap)
{
    trainer_opts_t o = p->o;
    o.recompute = recompute;
    backend_t *be = backend_plan_new(p->device);
    comm_t *world = be ? comm_plan(p->ranks, rank) : NULL;
    shard_t *sh = NULL;
    optim_t *opt = NULL;
    model_t *m = NULL;
    int64_t tokens;
    int rc = trainer_pass_tokens(o.train.micro_batch, p->max_len, &tokens) < 0 ? -1
             : world ? trainer_build(be, world, &p->cfg, &o, tokens, &sh, &opt, &m)
                     : -1;
    rc = rc ? -1 : 0;
    if (rc == 0) {
        *mem = *bk_mem(be);
        *S = shard_count(sh);
        int n_units;
        const ckpt_unit_t *units = shard_units(sh, &n_units);
        *snap = shard_writes(sh) ? bgsave_bytes(units, n_units, *S, precision_dtypes(o.precision).state,
                                                       shard_compress_grads(sh))
                                 : 0;
    }
    model_free(m);
    optim_free(opt);
    shard_free(sh);
    comm_finalize(world);
    backend_free(be);
    return rc;
}

int plan_memory(const plan_opts_t *p, int rank, int64_t device_bytes, plan_t *out)
{
    memset(out, 0, sizeof *out);
    out->rank = rank;
    /* least recompute first: auto takes the first that fits */
    static const int order[3] = {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_NORMS, MODEL_RECOMPUTE_BLOCK};
    int want = p->o.recompute, got = -1;
    for (int i = 0; i < 3; i++) {
        int lv = order[i];
        bk_mem_t mem;
        int64_t S, snap;
        if (dry_build(p, rank, lv, &mem, &S, &snap) < 0)
            return -1;
        out->acts[lv] = mem.at_peak[BK_MEM_ACTS];
        out->peak[lv] = mem.peak;
        if (got < 0 && (lv == want || (want == PLAN_RECOMPUTE_AUTO && (mem.peak <= device_bytes || i == 2)))) {
            got = lv;
            out->mem = mem;
            out->shard_count = S;
            out->snapshot = snap;
        }
    }
    if (got < 0) {
        ftk_err_set("internal: recompute level %d", want);
        return -1;
    }
    out->recompute = got;
    return 0;
}

int64_t plan_device_bytes(backend_t *be)
{
    int64_t avail = be->mem_avail ? be->mem_avail(be) : -1;
    if (avail < 0) {
        ftk_err_set("%s: its free memory is unknown (give --device-memory)", be->device);
        return -1;
    }
    const bk_mem_t *m = bk_mem(be);
    int64_t held = 0;
    for (int c = 0; c < BK_MEM_CLASSES; c++)
        held += m->cls[c];
    return avail + held;
}
