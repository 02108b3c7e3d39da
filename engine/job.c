/* job.c — one training run from start to end (job.h). */
#include "job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/prof.h"
#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "../libcommon/output.h"
#include "../libcommon/path.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"
#include "../libcommon/watchdog.h"
#include "compress.h"
#include "cuda_load.h"
#include "snapshot.h"

/* Rank 0 prints an agreed failure (its message names the failing rank). */
static int report(comm_t *world, int code)
{
    if (code && comm_rank(world) == 0)
        ftk_error("%s", ftk_err_msg());
    return code;
}

int job_agree(comm_t *world, int code, const char *msg)
{
    char why[2048];
    int who;
    snprintf(why, sizeof why, "%s", code ? msg : "");
    if (!(code = comm_agree(world, code, why, sizeof why, &who)))
        return 0;
    if (comm_size(world) > 1 && who != 0)
        ftk_err_set("rank %d: %s", who, why);
    else
        ftk_err_set("%s", why);
    return report(world, code);
}

int job_same_device(comm_t *world, const char *device)
{
    int dev = backend_device_index(device), dev0 = dev;
    if (comm_bcast(world, &dev0, sizeof dev0, 0) < 0)
        return -1;
    if (dev >= 0 && dev0 >= 0 && dev != dev0) {
        ftk_err_set("--device %s on this rank, %s on rank 0: give every rank the same FTK_DEVICE (or --device)",
                    device, backend_devices[dev0]);
        return -1;
    }
    return 0;
}

int job_check_launch(comm_t *world)
{
    /* srun without a PMI plugin starts N processes that each see a world of one: N copies
     * of the same run racing for one run directory */
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (comm_size(world) == 1 && tasks && atoi(tasks) > 1) {
        ftk_err_set("SLURM started %d tasks but MPI sees a world of one in each: run srun --mpi=pmix (or pmi2; "
                    "`srun --mpi=list` shows what the cluster has)",
                    atoi(tasks));
        return -1;
    }
    return 0;
}

/* ---- metrics ---------------------------------------------------------------------------------- */

/* What a metrics failure's message starts with: the event files are --tensorboard's. */
static const char *sink_option(const metrics_writer_t *mw)
{
    return mw->err_sink == METRICS_SINK_EVENTS ? "--tensorboard " : "";
}

/* The first write error of the metrics, as the run reports it ("" while none). */
static const char *metrics_failure(const metrics_writer_t *mw)
{
    static char m[sizeof mw->err + 16];
    snprintf(m, sizeof m, "%s%s", sink_option(mw), mw->err);
    return m;
}

/* The checkpoints committed since the last call: a metrics line and a note each. */
static void metrics_ckpts(job_t *j)
{
    trainer_ckpt_t r[8];
    int n = trainer_ckpt_reports(j->t, r, 8);
    for (int i = 0; i < n; i++) {
        metrics_write_checkpoint(&j->mw, &(metrics_ckpt_rec_t){.step = r[i].step, .bytes = r[i].bytes,
                                                               .async = r[i].async, .stall_s = r[i].stall_s,
                                                               .write_s = r[i].write_s});
        ftk_info("checkpoint %s/step-%08lld committed (%s; training blocked %.2f s, write %.2f s, %.1f MB)",
                 j->o.out_dir, (long long)r[i].step, r[i].async ? "written in the background" : "synchronous",
                 r[i].stall_s, r[i].write_s, (double)r[i].bytes / 1e6);
    }
}

/* The step's metrics line (rank 0), with the report's figures (every rank counts them). */
static void metrics_step(job_t *j, const trainer_step_t *s, double dt, double elapsed)
{
    metrics_writer_t *mw = &j->mw;
    j->step_json.len = 0;
    if (report_step(j->rep, s, dt, mw->f ? &j->step_json : NULL) < 0)
        metrics_writer_fail(mw, ENOMEM);
    bk_mem_sample(j->be); /* the step's end: what the device holds now, scratch growth included */
    if (!mw->f)
        return;
    const bk_mem_t *mem = bk_mem(j->be);
    metrics_step_rec_t r = {
        .step = s->step, .tokens = s->tokens, .tokens_seen = s->tokens_seen, .epoch = s->epoch,
        .micro_batches = s->micro_batches, .loss = s->loss, .lr = s->lr, .grad_norm = s->grad_norm,
        .tokens_per_s = s->tokens / dt, .elapsed_s = elapsed, .ranks = j->nranks,
        .allgather_bytes = s->comm.ag_bytes, .reduce_scatter_bytes = s->comm.rs_bytes,
        .allreduce_bytes = s->comm.ar_bytes, .wait_s = s->comm.wait_s, .mem_peak = mem->peak,
        /* the device's pages, and what the device measured in use (0, -1: not measured) */
        .device_mem = j->be->mem_pages != 0, .mem_device_peak = mem->dev_peak, .mem_device_used = mem->used_peak,
        .mem_device_other = mem->used_other};
    metrics_write_step(mw, &r, j->step_json.data);
}

static int evaluate(job_t *j, int64_t step)
{
    int64_t vt;
    double vl;
    int code = trainer_evaluate(j->t, &vl, &vt);
    if (code)
        return report(j->world, code);
    metrics_write_eval(&j->mw, step, vl, vt);
    ftk_info("step %lld: validation loss %.4f (%lld targets)", (long long)step, vl, (long long)vt);
    return 0;
}

/* ---- the hang watchdog (FTK_STEP_TIMEOUT) ------------------------------------------------------ */

/* FTK_STEP_TIMEOUT=S (docs/design.md, "Hangs"): the process ends (exit 1) when the training
 * loop has finished nothing — a step, an evaluation, a checkpoint — for S seconds
 * (libcommon/watchdog.h). A rank stopped or stuck, a node gone without an error, a
 * collective that never completes would otherwise hold every rank until the job's time
 * limit; one rank's exit makes the launcher end the others, and the job starts again with
 * --resume auto (the committed checkpoints survive a kill at any instant). 0 (the
 * default): no watchdog. */
static void on_hang(void *arg)
{
    const job_t *j = arg;
    char m[512];
    snprintf(m, sizeof m,
             "%s: error: rank %d: nothing finished for %g s (FTK_STEP_TIMEOUT): a rank is stopped, stuck or "
             "gone, or a collective never completes; exiting so that the job can be started again with --resume "
             "auto\n",
             ftk_tool(), j->rank, j->step_timeout_s);
    /* write(2), not stdio: the stuck main thread may hold stderr's lock */
    ssize_t w = write(STDERR_FILENO, m, strlen(m));
    (void)w; /* nothing more to do if stderr is gone */
    _exit(FTK_EXIT_FAIL);
}

/* Arms the watchdog (from the loop's start to the process's end), if FTK_STEP_TIMEOUT asks;
 * every rank agrees. */
static int arm_watchdog(job_t *j)
{
    char msg[2048] = "";
    if (j->step_timeout_s > 0 && watchdog_start(j->step_timeout_s, on_hang, j) < 0)
        snprintf(msg, sizeof msg, "FTK_STEP_TIMEOUT: %s", ftk_err_msg());
    return job_agree(j->world, *msg ? FTK_EXIT_FAIL : 0, msg);
}

/* ---- the start ---------------------------------------------------------------------------------- */

/* The backend before anything is written: a missing GPU leaves no run directory. */
static int open_backend(job_t *j)
{
    int cuda = !strcmp(j->device, "cuda");
    if (cuda) {
        int gpu = comm_node_gpu(j->world, cuda_load_devices());
        j->be = gpu < 0 ? NULL : cuda_load_backend(gpu);
    } else {
        j->be = backend_cpu_new();
    }
    char msg[8192];
    snprintf(msg, sizeof msg, "--device %s: %s", j->device, j->be ? "" : ftk_err_msg());
    int code = job_agree(j->world, j->be ? 0 : FTK_EXIT_USAGE, msg);
    /* GPU ranks: the tensor collectives through NCCL (control traffic stays on MPI); every
     * rank gets the same verdict, the message naming the rank that failed. Under mpirun
     * even one rank: MPI would be handed device memory. Alone, a process is a world of one
     * whose collectives copy through the backend (comm_enable_nccl leaves it as it is). */
    if (!code && cuda && comm_enable_nccl(j->world, j->be) < 0) {
        ftk_err_prefix("--device cuda: ");
        backend_free(j->be);
        j->be = NULL;
        code = report(j->world, FTK_EXIT_FAIL);
    }
    return code;
}

/* FTK_PROFILE: rank 0's op times (kernels/prof.h); the path checked now, so one that
 * cannot be written fails before the run, not after it */
static int profile_begin(job_t *j)
{
    char msg[8192] = "";
    j->prof = getenv("FTK_PROFILE");
    if (j->prof && *j->prof && j->rank == 0) { /* "-": stderr; else written at the end, replacing (output.h) */
        if (strcmp(j->prof, "-") && output_check(j->prof, OUTPUT_FORCE) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE=%s", ftk_err_msg());
        else if (bk_prof_attach(j->be) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE: %s", ftk_err_msg());
        else
            j->prof_on = 1;
    }
    return job_agree(j->world, msg[0] ? FTK_EXIT_USAGE : 0, msg);
}

static void profile_end(const job_t *j)
{
    if (!j->prof_on)
        return;
    double wall = time_now() - j->prof_t0;
    output_t po;
    FILE *pf;
    int prc;
    if (!strcmp(j->prof, "-"))
        prc = bk_prof_write(j->be, stderr, wall);
    else if ((prc = output_begin(&po, j->prof, OUTPUT_FORCE)) == 0) {
        if (!(pf = output_stream(&po)) || bk_prof_write(j->be, pf, wall) < 0) {
            output_abort(&po);
            prc = -1;
        } else
            prc = output_commit(&po);
    }
    if (prc < 0)
        ftk_warn("FTK_PROFILE: %s", ftk_err_msg());
}

/* Rank 0 opens the metrics and event files on the history this process continues, and
 * keeps the run's options; every rank agrees. */
static int open_outputs(job_t *j, const ckpt_meta_t *meta)
{
    char path[4096], msg[8192] = "";
    int code = 0;
    snprintf(path, sizeof path, "%.*s/metrics.jsonl", path_dir_len(j->o.out_dir), j->o.out_dir);
    metrics_writer_init(&j->mw, path);
    /* The history this process continues: up to its checkpoint's step, or none at all from
     * step 0 (a run killed before its first checkpoint starts again, step 0's validation
     * included). */
    int64_t kept = meta->step > 0 ? meta->step : -1;
    if (j->rank == 0) {
        int refused;
        if (metrics_writer_open(&j->mw, kept, j->tensorboard_dir, &j->elapsed0, &refused) < 0)
            code = refused ? FTK_EXIT_USAGE : FTK_EXIT_FAIL,
            snprintf(msg, sizeof msg, "%s%s", sink_option(&j->mw), ftk_err_msg());
        else if (j->keep_options() < 0)
            code = FTK_EXIT_FAIL, snprintf(msg, sizeof msg, "%s", ftk_err_msg());
        if (!code && trainer_extended(j->t)[0]) {
            ftk_warn("--extend: %s; from step %lld on, the run is no longer bit-exact with an uninterrupted one",
                     trainer_extended(j->t), (long long)meta->step);
            metrics_write_extend(&j->mw, meta->step, trainer_extended(j->t));
        }
    }
    return job_agree(j->world, code, msg);
}

/* where the steps' time and bytes go (engine/report.h): every rank counts its own */
static int open_report(job_t *j, const ckpt_meta_t *meta)
{
    char header[8192], msg[2048];
    char cz[96] = ""; /* the bytes of a compressed run are not those of its settings' formulas alone */
    if (j->o.compress_weights || j->o.compress_grads)
        snprintf(cz, sizeof cz, ", --compress-weights %s, --compress-grads %s",
                 compress_weights_name(j->o.compress_weights), compress_grads_name(j->o.compress_grads));
    snprintf(header, sizeof header,
             "`ftk-train` run `%s`: precision %s, device %s, global batch %lld, micro-batch %lld%s.", j->o.out_dir,
             meta->precision, j->device, (long long)meta->train.global_batch, (long long)meta->train.micro_batch,
             cz);
    j->rep = report_new(j->world, trainer_shard(j->t), j->o.strategy, j->o.precision, &meta->train, header);
    snprintf(msg, sizeof msg, "%s", j->rep ? "" : ftk_err_msg());
    return job_agree(j->world, j->rep ? 0 : FTK_EXIT_FAIL, msg);
}

/* What the run is, where it stands, and what in its settings deserves a word. */
static void announce(const job_t *j, const ckpt_meta_t *meta)
{
    const trainer_t *t = j->t;
    int64_t gb = j->o.train.global_batch;
    if (meta->step == 0)
        ftk_info("%lld parameters, %lld training row%s (%lld step%s of %lld row%s per epoch), %lld step%s on %d rank%s "
                 "(strategy %s, %lld shard%s, precision %s, device %s)",
                 (long long)trainer_n_params(t), (long long)trainer_rows(t), plural_s(trainer_rows(t)),
                 (long long)trainer_steps_per_epoch(t), plural_s(trainer_steps_per_epoch(t)), (long long)gb,
                 plural_s(gb), (long long)meta->train.total_steps, plural_s(meta->train.total_steps), j->nranks,
                 plural_s(j->nranks), meta->strategy, (long long)meta->shard_count, plural_s(meta->shard_count),
                 meta->precision, j->device);
    if (trainer_done(t))
        ftk_info("%s: the run is complete (step %lld of %lld); nothing to do", j->o.out_dir, (long long)meta->step,
                 (long long)meta->train.total_steps);
    else if (j->rank == 0 && meta->train.warmup >= meta->train.total_steps)
        ftk_warn("--warmup %lld is not shorter than the run's %lld step%s: the learning rate rises for the whole run "
                 "and never decays",
                 (long long)meta->train.warmup, (long long)meta->train.total_steps,
                 plural_s(meta->train.total_steps));
}

/* ---- the steps ---------------------------------------------------------------------------------- */

/* The step's line on stderr, with the end estimated from this process's own steps so far
 * (a resume's first steps included), not from the history's, which another machine may
 * have made. */
static void say_step(const trainer_step_t *st, double step_s, double elapsed, double run_s, int64_t run_steps)
{
    if (ftk_quiet)
        return;
    char eta[32];
    double left = (double)(st->total_steps - st->step) * run_s / (double)run_steps;
    if (left >= 3600)
        snprintf(eta, sizeof eta, "%dh%02dm", (int)(left / 3600), (int)(left / 60) % 60);
    else
        snprintf(eta, sizeof eta, "%dm%02ds", (int)(left / 60), (int)left % 60);
    ftk_info("step %lld/%lld (%.0f%%)  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s  comm wait %.2f s  "
             "%.1f s  ETA %s",
             (long long)st->step, (long long)st->total_steps, 100.0 * (double)st->step / (double)st->total_steps,
             st->loss, st->lr, st->grad_norm, st->tokens / step_s, st->comm.wait_s, elapsed, eta);
}

/* A checkpoint where one is due. The last checkpoint of this process is synchronous: it is
 * what the exit status promises (it first waits for the one in flight). */
static int save_due(job_t *j, const trainer_step_t *st, int last, int stopping, double *last_save)
{
    if (j->no_save || !(last || stopping || st->save_due || (j->save_every > 0 && st->step % j->save_every == 0)))
        return 0;
    int bg = j->async_save && !last && !stopping;
    int code = report(j->world, bg ? trainer_save_async(j->t) : trainer_save(j->t));
    watchdog_beat();
    metrics_ckpts(j);
    if (code)
        return code;
    *last_save = time_now();
    if (bg)
        ftk_info("checkpoint %s/step-%08lld: state copied, written in the background", j->o.out_dir,
                 (long long)st->step);
    return 0;
}

/* A memory snapshot (trainer.h): a failure is said there and ends the snapshots, not the run. */
static void snapshot_due(job_t *j, int64_t step)
{
    snapshot_cost_t c;
    trainer_snapshot(j->t, &c);
    watchdog_beat();
    /* the slowest rank's seconds, and the longest wait for the write and the transfer */
    double s[2] = {c.seconds, c.wait_s};
    int64_t bytes = c.bytes_all;
    comm_allreduce_f64(j->world, s, 2, COMM_MAX);
    if (bytes > 0)
        metrics_write_snapshot(&j->mw, step, s[0], s[1], bytes);
    j->snap_s += s[0];
    j->snap_bytes += bytes;
    j->n_snaps += bytes > 0;
}

/* After a step's end: its metrics, its line, an evaluation where one is due. */
static int step_end(job_t *j, const trainer_step_t *st, double ts, double t0, int64_t run_steps)
{
    double now = time_now();
    int code;
    metrics_step(j, st, now - ts, j->elapsed0 + now - t0);
    if ((code = job_agree(j->world, j->mw.err[0] ? FTK_EXIT_FAIL : 0, metrics_failure(&j->mw))))
        return code;
    say_step(st, now - ts, j->elapsed0 + now - t0, now - t0, run_steps);
    metrics_write_stderr_lost(&j->mw, st->step);
    fault_point("train.step-end");
    if (j->eval_every > 0 && trainer_val_rows(j->t) > 0 && (st->step % j->eval_every == 0 || trainer_done(j->t)))
        return evaluate(j, st->step);
    return 0;
}

/* The steps, with their metrics, evaluations and checkpoints, to the end of the run or a
 * stop. Returns 0, 75 (stopped) or the agreed failure's code. */
static int train(job_t *j)
{
    trainer_t *t = j->t;
    double t0 = time_now(), last_save = t0;
    j->prof_t0 = t0;
    int64_t run_steps = 0;
    int code = 0;
    while (!trainer_done(t)) {
        double ts = time_now();
        trainer_step_t st;
        int clock_due = j->save_minutes > 0 && time_now() - last_save >= 60 * j->save_minutes;
        code = report(j->world, trainer_step(t, j->stop_signal, clock_due, &st));
        watchdog_beat();
        metrics_ckpts(j);
        if (code)
            return code;
        run_steps++;
        if (j->prof_on && run_steps == 1 && !trainer_done(t)) { /* the first step warms up */
            bk_prof_reset(j->be);
            j->prof_t0 = time_now();
        }
        if ((code = step_end(j, &st, ts, t0, run_steps)))
            return code;
        watchdog_beat();
        int last = trainer_done(t);
        int stopping = st.stop || (j->stop_after > 0 && run_steps >= j->stop_after && !last);
        if (j->no_save && stopping) {
            ftk_info("stopped by a signal at step %lld; --no-save: no checkpoint, nothing to resume",
                     (long long)st.step);
            return FTK_EXIT_PREEMPTED;
        }
        if ((code = save_due(j, &st, last, stopping, &last_save)))
            return code;
        if (!last && !stopping && trainer_snapshots(t) && st.step % j->o.snapshot_every == 0)
            snapshot_due(j, st.step);
        if (stopping && !last) {
            ftk_info("%s at step %lld; continue with --resume auto", st.stop ? "stopped by a signal" : "stopped",
                     (long long)st.step);
            return FTK_EXIT_PREEMPTED;
        }
    }
    return code;
}

/* A stop asked for before this process's first step: nothing trained, nothing saved. */
static int stopped_first(job_t *j, int64_t step)
{
    j->discard = 1;
    return j->stopped_before(step);
}

/* From the resume to the end of the steps. */
static int start_and_train(job_t *j)
{
    trainer_t *t = j->t;
    int code;
    if ((code = report(j->world, trainer_resume(t))))
        return code;
    const ckpt_meta_t *meta = trainer_meta(t);
    if (!trainer_done(t) && j->stop_agreed())
        return stopped_first(j, meta->step);
    if ((code = open_outputs(j, meta)) || (code = arm_watchdog(j)) || (code = open_report(j, meta)))
        return code;
    announce(j, meta);
    if (meta->step == 0 && j->eval_every > 0 && trainer_val_rows(t) > 0 && (code = evaluate(j, 0)))
        return code;
    if (!trainer_done(t) && j->stop_agreed())
        return stopped_first(j, meta->step);
    watchdog_beat();
    code = train(j);
    if (j->n_snaps > 0)
        ftk_info("memory snapshots: %lld, %.2f s in all (the slowest rank's), %.1f MB each (every rank's written "
                 "and sent)",
                 (long long)j->n_snaps, j->snap_s, (double)j->snap_bytes / 1e6 / (double)j->n_snaps);
    /* a normal end, or a stop with a checkpoint of its last step: the disk has it all */
    if (code == 0 || (code == FTK_EXIT_PREEMPTED && !j->no_save))
        trainer_drop_snapshots(t);
    return code;
}

/* The end of every run that made its trainer: the report, the outputs closed (a run that
 * leaves nothing behind leaves no event file either), the profile. */
static int finish(job_t *j, int code)
{
    watchdog_beat(); /* the end, too, gets its S seconds (a peer gone hangs MPI_Finalize as well) */
    /* the report of the steps this process ran (collective: code is agreed on every path here) */
    if (j->rep && j->report_path && (code == 0 || code == FTK_EXIT_PREEMPTED)) {
        char msg[2048];
        int rc = report_write(j->rep, j->world, j->report_path);
        snprintf(msg, sizeof msg, "%s", rc < 0 ? ftk_err_msg() : "");
        if (rc > 0)
            ftk_warn("--report %s: no step ran in this process; nothing written", j->report_path);
        else if (job_agree(j->world, rc < 0 ? FTK_EXIT_FAIL : 0, msg) && code == 0)
            code = FTK_EXIT_FAIL;
        else if (rc == 0)
            ftk_info("report: %s", j->report_path);
    }
    report_free(j->rep);
    buf_free(&j->step_json);
    metrics_writer_close(&j->mw);
    int discarded = ((code && code != FTK_EXIT_PREEMPTED) || j->discard) && trainer_discard_new_run(j->t);
    if (metrics_writer_close_events(&j->mw, discarded) < 0)
        ftk_warn("--tensorboard %s", ftk_err_msg());
    profile_end(j);
    trainer_free(j->t);
    backend_free(j->be);
    return code;
}

int job_run(job_t *j)
{
    int code;
    j->rank = comm_rank(j->world);
    j->nranks = comm_size(j->world);
    if ((code = open_backend(j)) == 0 && j->stop_agreed())
        code = j->stopped_before(-1); /* a stop asked for during the start-up: nothing is written yet */
    if (code || (code = profile_begin(j))) {
        backend_free(j->be);
        return code;
    }
    if (!(j->t = trainer_new(j->world, j->be, &j->o, &code))) {
        backend_free(j->be);
        return report(j->world, code);
    }
    return finish(j, start_and_train(j));
}
