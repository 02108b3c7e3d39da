/* job.h — one training run from start to end: the backend opened, the outputs and report,
 * the loop of steps with evaluation, saves and stops, the end. The steps are trainer.h's,
 * the metrics file and event files formats/metrics.h's, the report of where the time and
 * bytes went report.h's; ftk-train fills in the options and the signal state around it.
 *
 * Every rank of the world calls job_run() once, with the same settings. Every failure is
 * agreed (comm_agree): all ranks return the same exit status, and rank 0 prints the lowest
 * failing rank's message with ftk_error; progress, notes and checkpoints are said with
 * ftk_info/ftk_warn (the caller silences the ranks but 0 with ftk_quiet). Rank 0 writes
 * RUN/metrics.jsonl, the --tensorboard event files and RUN/options.yaml (keep_options).
 *
 * What depends on the caller's signal handling reaches the job through the settings: the
 * flag a stop signal sets (read at every step's end), whether any rank was asked to stop
 * (collective), and the words and exit status of a stop before the first step.
 */
#ifndef FTK_JOB_H
#define FTK_JOB_H
#include <signal.h>
#include <stdint.h>

#include "../formats/metrics.h"
#include "../kernels/backend.h"
#include "../libcommon/buf.h"
#include "comm.h"
#include "report.h"
#include "trainer.h"

typedef struct {
    /* the settings, filled in by the caller (the strings borrowed for the run's life) */
    comm_t *world;
    trainer_opts_t o;            /* as for trainer_new; o.out_dir is the run directory */
    const char *device;          /* "cpu" or "cuda" */
    const char *tensorboard_dir; /* --tensorboard, or NULL */
    const char *report_path;     /* --report (report_write), or NULL */
    int64_t save_every;          /* checkpoint every K steps (0: at the end only) */
    double save_minutes;         /* also when M minutes passed since the last (0: off) */
    int no_save;                 /* write no checkpoint at all */
    int async_save;              /* checkpoints but the last written in the background */
    int64_t eval_every;          /* validation every K steps and at the end (0: never) */
    int64_t stop_after;          /* stop after N steps of this process (0: never) */
    double step_timeout_s;       /* FTK_STEP_TIMEOUT: exit 1 when nothing finished for S s (0: off) */
    const volatile sig_atomic_t *stop_signal; /* nonzero: stop at this step's end */
    int (*stop_agreed)(void);            /* whether any rank was asked to stop (collective) */
    int (*stopped_before)(int64_t step); /* says so; its exit status (step -1: before the run dir) */
    int (*keep_options)(void);           /* rank 0 writes RUN/options.yaml: 0, or -1 with ftk_err_msg() */

    /* the job's own, from job_run's start to its end */
    int rank, nranks;
    backend_t *be;
    trainer_t *t;
    report_t *rep;
    metrics_writer_t mw; /* rank 0's metrics; any rank may record an error in it */
    buf_t step_json;     /* the report's members of a step's metrics line */
    const char *prof;    /* FTK_PROFILE: where rank 0's op times go (prof_on) */
    int prof_on;
    double prof_t0;  /* when the timed part began */
    double elapsed0; /* the history's elapsed_s at the resumed step (rank 0) */
    int discard;     /* a new run that stops before its first step is removed, as a failed one is */
    double snap_s;   /* memory snapshots: the slowest rank's seconds, every rank's bytes, how many */
    int64_t snap_bytes, n_snaps;
} job_t;

/* The run: the backend (a missing GPU leaves no run directory), FTK_PROFILE, the trainer,
 * the resume, the outputs, the steps, the report and the end. The backend and the trainer
 * are freed on every path; j should outlive the call (a static: what it points to stays
 * reachable for LeakSanitizer until exit). Returns the exit status: 0 done, 75 stopped
 * (FTK_EXIT_PREEMPTED), or an agreed failure's FTK_EXIT_*. */
int job_run(job_t *j);

/* Every rank with its status (collective): the highest code, the lowest failing rank's
 * message (msg, "" where code is 0) set as ftk_err_msg() ("rank N: …" when that is not
 * rank 0 of several) and printed by rank 0. Returns the agreed code. */
int job_agree(comm_t *world, int code, const char *msg);

/* Whether every rank runs the same device as rank 0: the command lines are the same, but
 * FTK_DEVICE may not be, and the device's set-up is collective (comm_node_gpu, NCCL); so is
 * this. Which device, not its name: a name that is no device is not compared. Returns 0,
 * or -1 with ftk_err_msg() set. */
int job_same_device(comm_t *world, const char *device);

/* Whether the launcher's tasks are this world's ranks (SLURM_STEP_NUM_TASKS against the
 * world's size). Returns 0, or -1 with ftk_err_msg() saying how to launch. */
int job_check_launch(comm_t *world);

#endif
