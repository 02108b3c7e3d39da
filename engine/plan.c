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
        *snap = shard_writes(sh) ? bgsave_bytes(units, n_units, *S, precision_dtypes(o.precision).state) : 0;
    }
    model_free(m);
    optim_free(opt);
    shard_free(sh);
    comm_finalize(world);
    backend_free(be);
    return rc;
}

int plan_memory(const plan_opts_t *p, int rank, plan_t *out)
{
    memset(out, 0, sizeof *out);
    out->rank = rank;
    bk_mem_t other;
    int64_t S, snap;
    if (dry_build(p, rank, p->o.recompute, &out->mem, &out->shard_count, &out->snapshot) < 0 ||
        dry_build(p, rank, !p->o.recompute, &other, &S, &snap) < 0)
        return -1;
    out->acts_other = other.at_peak[BK_MEM_ACTS];
    return 0;
}
