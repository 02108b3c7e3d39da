/* plan_print.c — the memory plan's table (plan_print.h). */
#include "plan_print.h"

#include <string.h>

#include "cuda_load.h"

#include "../formats/h5.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../libcommon/log.h"
#include "../libcommon/plural.h"

/* The model's configuration, and the data's row length and segments, into t->p. */
static int read_inputs(const plan_request_t *rq, plan_table_t *t)
{
    if (rq->preset) {
        if (model_preset(rq->preset, &t->p.cfg) < 0) {
            ftk_err_prefix("--preset: ");
            return -1;
        }
    } else {
        hid_t wf = weights_open(rq->model_path, &t->p.cfg);
        if (wf < 0)
            return -1;
        h5_close(wf);
    }
    if (rq->data_path) {
        tokens_set_t *ds = tokens_set_open(rq->data_path); /* a file or a set of shards */
        if (!ds)
            return -1;
        if (!t->p.max_len)
            t->p.max_len = tokens_set_info(ds)->max_len;
        t->p.o.attn_max_seg = trainer_attn_max_seg(ds, rq->o.train.micro_batch); /* as trainer_new */
        tokens_set_close(ds);
    }
    return 0;
}

/* --recompute auto fits --device-memory, else this machine's device's free memory */
static int find_budget(const plan_request_t *rq, int64_t *budget)
{
    *budget = rq->o.device_bytes;
    if (rq->o.recompute != PLAN_RECOMPUTE_AUTO || *budget)
        return 0;
    backend_t *real = !strcmp(rq->device, "cuda") ? (cuda_load_devices() > 0 ? cuda_load_backend(0) : NULL)
                                                  : backend_cpu_new();
    *budget = real ? plan_device_bytes(real) : -1;
    backend_free(real);
    if (*budget >= 0)
        return 0;
    char why[2048];
    snprintf(why, sizeof why, "%s", real ? ftk_err_msg() : "no such device here to ask its free memory");
    ftk_err_set("--recompute auto: %s; give --device-memory", why);
    return -1;
}

int plan_table_make(const plan_request_t *rq, plan_table_t *t)
{
    memset(t, 0, sizeof *t);
    t->rq = *rq;
    t->p = (plan_opts_t){.o = trainer_build_opts(&rq->o), .ranks = rq->ranks, .device = rq->device, .max_len = rq->max_len};
    if (read_inputs(rq, t) < 0 || find_budget(rq, &t->budget) < 0)
        return -1;
    /* Ranks differ only by padding; the table is rank 0's, the largest total is named.
     * auto: every rank fits, or the first that does not is the verdict's. */
    t->fits = 1;
    for (int r = 0; r < rq->ranks; r++) {
        plan_t x;
        if (plan_memory(&t->p, r, t->budget, &x) < 0)
            return -1;
        if (r == 0)
            t->rank0 = x;
        if (x.total > t->most.total)
            t->most = x;
        if (t->fits && !x.fits)
            t->fits = 0, t->unfit = x;
    }
    return 0;
}

static void gb(char *out, size_t n, int64_t bytes)
{
    if (bytes >= 1000000000)
        snprintf(out, n, "%9.2f GB", (double)bytes / 1e9);
    else
        snprintf(out, n, "%9.2f MB", (double)bytes / 1e6);
}

/* The first line: the model, the world, the options that shape the plan. */
static void print_header(FILE *out, const plan_table_t *t)
{
    const plan_request_t *rq = &t->rq;
    const plan_t *pl = &t->rank0;
    const char *what = rq->preset ? rq->preset : rq->model_path;
    double np = (double)model_n_params(&t->p.cfg);
    int autofit = rq->o.recompute == PLAN_RECOMPUTE_AUTO;
    char rec[128] = "";
    if (autofit && t->fits)
        snprintf(rec, sizeof rec, ", --recompute auto: %s fits %.2f GB", plan_recompute_name(pl->recompute),
                 (double)t->budget / 1e9);
    else if (autofit)
        snprintf(rec, sizeof rec, ", --recompute auto: no level fits %.2f GB (block shown)", (double)t->budget / 1e9);
    else if (pl->recompute != MODEL_RECOMPUTE_NONE)
        snprintf(rec, sizeof rec, ", --recompute %s", plan_recompute_name(pl->recompute));
    if (rq->o.units.kind != CKPT_UNITS_BLOCK) { /* block: the header names no policy */
        char un[32];
        units_name(&rq->o.units, un);
        snprintf(rec + strlen(rec), sizeof rec - strlen(rec), ", --units %s", un);
    }
    fprintf(out,
            "memory plan: %s (%.3f %s parameters), %d rank%s, strategy %s (%lld shard%s), precision %s, micro-batch "
            "%lld x %lld tokens%s, device %s\n",
            what, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? "B" : "M", rq->ranks, rq->ranks == 1 ? "" : "s",
            rq->strategy_name, (long long)pl->shard_count, plural_s(pl->shard_count), rq->precision_name,
            (long long)rq->o.train.micro_batch, (long long)t->p.max_len, rec, rq->device);
}

/* v at each recompute level (none, norms, block: least recompute first), each after prefix,
 * the last followed by end */
static void print_levels(FILE *out, const int64_t v[3], const char *prefix, const char *end)
{
    char b2[32];
    for (int lv = 0; lv < 3; lv++) {
        int k = lv == 0 ? MODEL_RECOMPUTE_NONE : lv == 1 ? MODEL_RECOMPUTE_NORMS : MODEL_RECOMPUTE_BLOCK;
        gb(b2, sizeof b2, v[k]);
        fprintf(out, "%s%s %s%s", prefix, plan_recompute_name(k), b2 + strspn(b2, " "), lv < 2 ? "," : end);
    }
}

/* The workspaces, cuDNN's share of them, and the other allocations. */
static void print_workspaces(FILE *out, const plan_table_t *t)
{
    const plan_request_t *rq = &t->rq;
    const int64_t *c = t->rank0.mem.at_peak;
    char a[32], b2[32];
    int cuda = !strcmp(rq->device, "cuda");
    gb(a, sizeof a, c[BK_MEM_WORKSPACE]);
    int64_t dnn_seg = t->p.o.attn_max_seg > 0 ? t->p.o.attn_max_seg : rq->o.train.micro_batch;
    int64_t dnn = bk_cudnn_plan_bytes(rq->device, precision_dtypes(rq->o.precision).act, dnn_seg, t->p.max_len,
                                      (int)t->p.cfg.num_attention_heads, (int)t->p.cfg.num_key_value_heads,
                                      (int)model_head_dim(&t->p.cfg));
    if (cuda) {
        gb(b2, sizeof b2, (int64_t)BK_CUDA_WORKSPACE_BYTES);
        char s3[32];
        gb(s3, sizeof s3, c[BK_MEM_WORKSPACE] - (int64_t)BK_CUDA_WORKSPACE_BYTES - (dnn > 0 ? dnn : 0));
        fprintf(out, "  workspaces         %s   (cuBLASLt %s, the CUDA backend's scratch for these shapes %s)\n", a,
                b2 + strspn(b2, " "), s3 + strspn(s3, " "));
    } else {
        fprintf(out, "  workspaces         %s\n", a);
    }
    if (dnn > 0) {
        gb(a, sizeof a, dnn);
        fprintf(out, "    cuDNN attention  %s   (FTK_CUDA_ATTN=cudnn: %lld segments x %lld tokens%s, in the workspaces)\n",
                a, (long long)dnn_seg, (long long)t->p.max_len, t->p.o.attn_max_seg > 0 ? "" : ", one a row: no --data");
    }
    gb(a, sizeof a, c[BK_MEM_OTHER]);
    fprintf(out, "  other              %s   (batch inputs, the head's logits chunk)\n", a);
}

/* On cuda, what the GPU holds beyond the allocations (kernels/cuda_mem.h). */
static void print_device(FILE *out, const plan_t *pl)
{
    char a[32];
    gb(a, sizeof a, pl->mem.peak);
    fprintf(out, "  allocations        %s   (%lld bytes: the rows above, metrics.jsonl's mem_peak_bytes)\n", a,
            (long long)pl->mem.peak);
    gb(a, sizeof a, pl->rounding);
    fprintf(out,
            "  page rounding      %s   (%lld bytes: cudaMalloc's 2 MiB pages; with the allocations, "
            "mem_device_peak_bytes)\n",
            a, (long long)pl->rounding);
    gb(a, sizeof a, pl->context);
    fprintf(out, "  CUDA context       %s   (%lld bytes: an estimate; a GPU measures the total, mem_device_used_bytes)\n",
            a, (long long)pl->context);
}

void plan_table_print(FILE *out, const plan_table_t *t)
{
    const plan_request_t *rq = &t->rq;
    const plan_t *pl = &t->rank0;
    const int64_t *c = pl->mem.at_peak;
    char a[32];
    int cuda = !strcmp(rq->device, "cuda");
    print_header(out, t);
    fprintf(out, "per rank (rank 0):\n");
    gb(a, sizeof a, c[BK_MEM_WEIGHTS]);
    fprintf(out, "  weights            %s\n", a);
    gb(a, sizeof a, c[BK_MEM_GRADS]);
    fprintf(out, "  gradients          %s\n", a);
    gb(a, sizeof a, c[BK_MEM_OPTIM]);
    fprintf(out, "  optimizer state    %s\n", a);
    gb(a, sizeof a, c[BK_MEM_GATHER]);
    fprintf(out, "  gathered units     %s   (in use and prefetched)\n", a);
    gb(a, sizeof a, c[BK_MEM_ACTS]);
    fprintf(out, "  activations        %s   (--recompute", a);
    print_levels(out, pl->acts, " ", ")\n");
    print_workspaces(out, t);
    if (cuda)
        print_device(out, pl);
    gb(a, sizeof a, pl->total);
    fprintf(out, "  total              %s   (%lld bytes, %.2f GiB)\n", a, (long long)pl->total,
            (double)pl->total / (1 << 30));
    fprintf(out, "  total by level    ");
    print_levels(out, pl->peak, " --recompute ", "\n");
    /* host memory beside the backend's: on the CPU the same RAM, on a GPU page-locked */
    gb(a, sizeof a, pl->snapshot);
    fprintf(out, "  snapshot           %s   (%s: a host copy of this rank's shard%s)\n", a,
            rq->o.async_save ? "--async-save" : "with --async-save", cuda ? ", page-locked" : "");
    if (rq->o.async_save && !cuda) {
        gb(a, sizeof a, pl->total + pl->snapshot);
        fprintf(out, "  total + snapshot   %s   (%lld bytes, %.2f GiB)\n", a, (long long)(pl->total + pl->snapshot),
                (double)(pl->total + pl->snapshot) / (1 << 30));
    }
    /* memory snapshots (engine/snapshot.h) in the node's memory: this rank's shard file and its
     * partner's copy, two complete and one being written at most */
    gb(a, sizeof a, 6 * pl->snapshot);
    fprintf(out, "  memory snapshots   %s   (%s: node memory, e.g. /dev/shm, at most: 3 x (own shard + a partner's))\n", a,
            rq->o.snapshot_every > 0 ? "--memory-snapshot-every" : "with --memory-snapshot-every");
    if (t->most.rank != 0) {
        gb(a, sizeof a, t->most.total);
        fprintf(out, "largest rank: %d, total %s\n", t->most.rank, a);
    }
}

int plan_table_refusal(const plan_table_t *t, char *out, size_t n)
{
    if (t->rq.o.recompute != PLAN_RECOMPUTE_AUTO || t->fits)
        return 0;
    char advice[2048], who[32] = "";
    plan_advice(&t->p, t->budget, advice, sizeof advice);
    if (t->unfit.rank != 0)
        snprintf(who, sizeof who, " on rank %d", t->unfit.rank);
    snprintf(out, n, "--recompute auto: no level fits %.2f GB%s%s (the least, block, needs %.2f GB); %s",
             (double)t->budget / 1e9, t->rq.o.device_bytes ? "" : " (the device's free memory)", who,
             (double)t->unfit.peak[MODEL_RECOMPUTE_BLOCK] / 1e9, advice);
    return 1;
}

int plan_table_run(const plan_request_t *rq, FILE *out, char *why, size_t n)
{
    plan_table_t tab;
    if (plan_table_make(rq, &tab) < 0) {
        snprintf(why, n, "%s", ftk_err_msg());
        return -1;
    }
    plan_table_print(out, &tab);
    if (!plan_table_refusal(&tab, why, n))
        return 0;
    fflush(out);
    return -1;
}
