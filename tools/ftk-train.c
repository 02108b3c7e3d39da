/* ftk-train — full-parameter finetuning, one process or many (mpirun/srun): options,
 * signals and metrics output around the training job (engine/trainer.h), and the memory
 * plan (--plan, engine/plan.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/comm.h"
#include "../engine/compress.h"
#include "../engine/plan.h"
#include "../engine/report.h"
#include "../engine/trainer.h"
#include "../formats/h5.h"
#include "../formats/json.h"
#include "../formats/metrics.h"
#include "../formats/tfevents.h"
#include "../formats/tokens.h"
#include "../formats/tokens_set.h"
#include "../formats/weights.h"
#include "../kernels/prof.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/config.h"
#include "../libcommon/fault.h"
#include "../libcommon/hash.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/path.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"

/* device: NULL until given or resolved (default_device; device_from_env: it took FTK_DEVICE) */
static const char *model_path, *data_path, *out_dir, *resume = "none", *schedule = "cosine", *device;
static int device_from_env;
static const char *strategy_arg = "full", *precision_arg = "fp32", *rounding_arg = "stochastic", *preset;
static const char *compress_weights_arg = "off", *compress_grads_arg = "off";
static int64_t steps, epochs = 1, global_batch = 64, micro_batch = 4, warmup = 25, seed = 1337;
static int64_t save_every, keep, eval_every = 25, eval_rows = 400, stop_after;
static double lr = 2e-4, min_lr = 6e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
static double save_minutes = 30;
static const char *recompute_arg, *device_memory_arg; /* recompute_arg "": bare --recompute (block) */
static int recompute; /* model_recompute_t, or PLAN_RECOMPUTE_AUTO */
static int node_size;
static int decay_norms, threads, group_size, plan, plan_ranks = 1, no_save, async_save;
static int64_t plan_max_len;
static const char *tensorboard_dir, *config_path;
static int extend;
static int allow_other_tokenizer;
/* --recipe and its pieces (docs/litgpt.md) */
static const char *recipe = "ftk", *warmup_style = "ftk", *loss_mean = "global";
static const char *report_path;
static const char *units_arg = "block";

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"model", 'm', OPT_STR, &model_path, "FILE.h5", "initial weights (ftk-import-hf, ftk-init) (required)"},
    {"data", 'd', OPT_STR, &data_path, "FILE.h5", "token data from ftk-pack: a file, or a shard set by its base name or any shard (required)"},
    {"out", 'o', OPT_STR, &out_dir, "DIR",
     "run directory: checkpoints, latest, metrics.jsonl, options.yaml (required; missing parents are made)"},
    {"steps", 0, OPT_I64, &steps, "N", "optimizer steps (0: --epochs worth)", "0.."},
    {"epochs", 0, OPT_I64, &epochs, "E", "passes over the training rows when --steps is 0", "1.."},
    {"global-batch", 0, OPT_I64, &global_batch, "G", "rows per optimizer step, over all ranks", "1.."},
    {"micro-batch", 0, OPT_I64, &micro_batch, "B", "rows per forward/backward pass on a rank (gradients accumulate)", "1.."},
    {"lr", 0, OPT_DOUBLE, &lr, "LR", "peak learning rate", "0<.."},
    {"min-lr", 0, OPT_DOUBLE, &min_lr, "LR", "learning rate at the end of the decay", "0.."},
    {"warmup", 0, OPT_I64, &warmup, "N", "linear warmup steps", "0.."},
    {"schedule", 0, OPT_STR, &schedule, "cosine|linear|constant", "decay after the warmup"},
    {"warmup-style", 0, OPT_STR, &warmup_style, "ftk|litgpt",
     "litgpt: step k runs at the schedule's rate of step k-1, as LitGPT's (first step at lr 0)"},
    {"loss-mean", 0, OPT_STR, &loss_mean, "global|micro",
     "global: the token mean of the global batch; micro: the mean of its micro-batches' token means (LitGPT's)"},
    {"recipe", 0, OPT_STR, &recipe, "ftk|litgpt",
     "litgpt: LitGPT's finetune_full step for step: its schedule, loss mean and defaults (below)"},
    {"beta1", 0, OPT_DOUBLE, &beta1, "B1", "AdamW beta1", "0..<1"},
    {"beta2", 0, OPT_DOUBLE, &beta2, "B2", "AdamW beta2", "0..<1"},
    {"eps", 0, OPT_DOUBLE, &eps, "EPS", "AdamW epsilon", "0<.."},
    {"weight-decay", 0, OPT_DOUBLE, &weight_decay, "WD", "decoupled weight decay", "0.."},
    {"decay-norms", 0, OPT_FLAG, &decay_norms, NULL, "also decay the RMSNorm gains (not by default)"},
    {"clip", 0, OPT_DOUBLE, &clip, "NORM", "clip gradients to this global L2 norm (0: off)", "0.."},
    {"seed", 0, OPT_I64, &seed, "S", "seed of the data order", ".."},
    {"strategy", 0, OPT_STR, &strategy_arg, "full|grad-op|none|hybrid|hpz", "how ranks share the model (FSDP names; hpz: ZeRO++'s)"},
    {"shard-group-size", 0, OPT_INT, &group_size, "N", "hybrid: ranks per shard group (0: the ranks of a node)", "0.."},
    {"node-size", 0, OPT_INT, &node_size, "N", "hpz: ranks per node group, which holds the secondary copy (0: a node's ranks)", "0.."},
    {"units", 0, OPT_STR, &units_arg, "block|group:M|size:BYTES",
     "the unit of communication: one block, M consecutive blocks, or consecutive blocks up to BYTES of "
     "parameters (e.g. size:512MiB); larger units: fewer, larger collectives, more memory; same bits "
     "(docs/communication.md)"},
    {"compress-weights", 0, OPT_STR, &compress_weights_arg, "off|int8",
     "gather the weights as int8 codes with a scale per 256 (full, grad-op, hybrid): about a quarter of fp32's "
     "bytes, half of bf16's; for slow links between nodes (docs/communication.md)"},
    {"compress-grads", 0, OPT_STR, &compress_grads_arg, "off|bf16",
     "reduce-scatter the gradients in bf16 with error feedback (full, grad-op; fp32, bf16-mixed): half the bytes, "
     "a residual of 4 bytes per parameter on every rank, kept in the checkpoint"},
    {"save-every", 0, OPT_I64, &save_every, "K", "checkpoint every K steps (0: only at the end)", "0.."},
    {"save-every-minutes", 0, OPT_DOUBLE, &save_minutes, "M",
     "also checkpoint when M minutes passed since the last, so that a lost node costs at most that (0: off; "
     "--no-save: off)", "0.."},
    {"keep", 0, OPT_I64, &keep, "N", "keep the newest N checkpoints (0: all)", "0.."},
    {"no-save", 0, OPT_FLAG, &no_save, NULL,
     "write no checkpoint, not even the last (benchmarks: a 7B checkpoint is 54-81 GB; a stopped run is lost)"},
    {"async-save", 0, OPT_FLAG, &async_save, NULL,
     "write checkpoints in the background: training waits only for a host copy of the state (see below)"},
    {"eval-every", 0, OPT_I64, &eval_every, "K", "validation loss every K steps and at the end (0: never)", "0.."},
    {"eval-rows", 0, OPT_I64, &eval_rows, "N", "validation rows per evaluation (0: the whole split)", "0.."},
    {"config", 0, OPT_STR, &config_path, "FILE.yaml",
     "options from a YAML file (every long option is a key; LitGPT's finetune/full.yaml keys too, an empty value "
     "meaning LitGPT's default); the command line overrides it"},
    {"extend", 0, OPT_FLAG, &extend, NULL,
     "--resume with other --steps, --epochs, --lr, --min-lr, --warmup or --schedule (no longer bit-exact with "
     "an uninterrupted run; said in metrics.jsonl)"},
    {"tensorboard", 0, OPT_STR, &tensorboard_dir, "DIR",
     "also write the metrics as TensorBoard scalars (event files in DIR, the run's own: a resume trims them "
     "to its checkpoint as it does metrics.jsonl; `tensorboard --logdir DIR`); kept relative to the run when "
     "inside it; --resume auto takes no kept DIR outside the run (give --tensorboard again)"},
    {"precision", 0, OPT_STR, &precision_arg, "fp32|bf16-mixed|bf16-true",
     "what the weights, gradients, optimizer state and activations are stored in (see below)"},
    {"rounding", 0, OPT_STR, &rounding_arg, "stochastic|nearest",
     "bf16-true: how AdamW rounds the new weights and moments to bf16"},
    {"recompute", 0, OPT_STR_OPT, &recompute_arg, "[none|norms|block|auto]",
     "recompute activations in the backward pass: norms (the norms and SwiGLU), block (whole blocks; "
     "--recompute alone), auto (the least whose memory plan fits the device; none: exit 2); same bits at every "
     "level"},
    {"device-memory", 0, OPT_STR, &device_memory_arg, "SIZE",
     "--recompute auto: the device's memory to fit (80GB, 141GB; default: the device's free memory)"},
    {"resume", 0, OPT_STR, &resume, "none|auto|DIR", "auto: continue from the newest intact checkpoint in OUT"},
    {"stop-after", 0, OPT_I64, &stop_after, "N", "stop after N steps of this run: checkpoint, exit 75", "0.."},
    {"device", 0, OPT_STR, &device, "cpu|cuda",
     "compute backend: cpu (OpenMP + BLAS; ranks talk through MPI) or cuda (the GPU of this rank's node-local "
     "index; ranks talk through NCCL). Default: $FTK_DEVICE, else cuda for a process started alone that sees a "
     "GPU, else cpu (under mpirun/srun: cpu until NCCL has been measured on GPUs)"},
    {"plan", 0, OPT_FLAG, &plan, NULL,
     "print the memory each rank will take and exit (reads only --model's configuration; writes nothing)"},
    {"ranks", 0, OPT_INT, &plan_ranks, "N", "--plan: the number of ranks to plan for", PLAN_RANKS_RANGE},
    {"preset", 0, OPT_STR, &preset, "NAME", "--plan: a named model shape (ftk-init --preset) instead of --model"},
    {"max-len", 0, OPT_I64, &plan_max_len, "N", "--plan: tokens per row (default: --data's max_len)", "0..1048576"},
    {"threads", 'j', OPT_INT, &threads, "N", "threads per rank (0: all cores); the bits do not depend on it",
     OPTS_THREADS_RANGE},
    {"allow-other-tokenizer", 0, OPT_FLAG, &allow_other_tokenizer, NULL,
     "train on data packed with a tokenizer other than the one --model holds (refused by default: the ids "
     "would mean other pieces)"},
    {"report", 0, OPT_STR, &report_path, "FILE.md",
     "at the end, write where the steps' time and bytes went: compute, exposed and overlapped communication, "
     "host; per collective and level; a projection to other rank counts (docs/communication.md). Each start "
     "replaces the file; - is stdout, a FIFO or a device is written in place"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-train",
    .usage = "--model W.h5 --data D.h5 --out RUN/ [options]      (or: mpirun -np N ftk-train …)\n"
             "       ftk-train --plan (--model W.h5 | --preset NAME) (--data D.h5 | --max-len N) [--ranks N] [options]",
    .summary =
        "Full-parameter finetuning of a Llama model: AdamW, gradient clipping, warmup + cosine schedule,\n"
        "gradient accumulation to a global batch, sharded data parallelism over MPI ranks. Defaults follow\n"
        "the YAML of LitGPT's Llama-2-7B full finetune (lr 2e-4, betas 0.9/0.95, weight decay 0.1, warmup 25,\n"
        "min lr 6e-5, global batch 64, micro batch 4, one epoch) except: --precision fp32 (the recipe:\n"
        "bf16-true), --clip 1.0 (the recipe does not clip: --clip 0) and no decay of the norms; and what\n"
        "LitGPT computes differs from its YAML: its step k runs at the rate of step k-1 (the first at 0),\n"
        "its cosine ends at 0, and its loss is a mean of micro-batch means (--recipe litgpt: LitGPT's, see\n"
        "below and docs/litgpt.md). The loss of a step is the mean over the targets of its global batch,\n"
        "whatever the number of ranks. A global batch is the next G rows of the epoch: batches do not\n"
        "cross epochs, an epoch's last may be short.",
    .epilog =
        "Strategies (engine/shard.h): full = ZeRO-3 (parameters, gradients and AdamW state sharded; units\n"
        "gathered when used), grad-op = ZeRO-2 (parameters gathered once per step), none = DDP (replicated,\n"
        "gradients all-reduced), hybrid = full inside shard groups, replicated across them, hpz = full plus\n"
        "a secondary copy of the weights sharded within each node (--node-size), so that a step's later\n"
        "gathers stay inside the node (ZeRO++'s hpZ; docs/communication.md). Started without\n"
        "mpirun or srun, ftk-train is a world of one.\n"
        "Outputs in RUN/: step-NNNNNNNN/ checkpoints (formats/checkpoint.h; one shard file per rank),\n"
        "`latest`, and metrics.jsonl: one JSON object per step {step, loss, lr, grad_norm, tokens,\n"
        "tokens_seen, tokens_per_s, elapsed_s, epoch, ranks, micro_batches, comm} where comm holds the bytes\n"
        "this rank all-gathered, reduce-scattered and all-reduced in the step and the seconds it waited,\n"
        "split (the step's compute, exposed and overlapped communication, host seconds) and collectives\n"
        "(per kind and level: calls, bytes, analytical bytes, seconds; docs/communication.md),\n"
        "mem_peak_bytes (rank 0's backend high-water mark so far; on cuda also mem_device_peak_bytes, the\n"
        "same in the driver's 2 MiB pages, mem_device_used_bytes, the most cudaMemGetInfo saw in use on the\n"
        "device, contexts and other processes included, and mem_device_other_bytes, what it held beside\n"
        "the backend's memory when the backend started: the CUDA context and other processes) and per\n"
        "evaluation {step, val_loss, val_tokens}. A readable line per step goes to stderr.\n"
        "Resuming (--resume auto|DIR) continues bit for bit at the same number of ranks and strategy. A\n"
        "run keeps its options in RUN/options.yaml: `ftk-train -o RUN --resume auto` needs nothing else,\n"
        "and options given beside it override the kept ones (docs/training.md). What defines the run must\n"
        "stay the checkpoint's: a difference is refused, naming the option; --extend lets --steps, --epochs,\n"
        "--lr, --min-lr, --warmup and --schedule change; another --precision needs the checkpoint converted\n"
        "first (ftk-reshard --precision). auto takes the newest checkpoint that verifies, falling back past\n"
        "damaged ones.\n"
        "-j changes the speed only: the same bits on any number of threads, so a resume may use another\n"
        "(it is not kept in OUT/options.yaml). On another number of ranks a run continues from the same\n"
        "state within rounding (the gradients are summed in another order; docs/training.md).\n"
        "Precision (docs/design.md): fp32 = everything float32 (16 bytes per parameter with AdamW);\n"
        "bf16-mixed = float32 master weights and moments, a bf16 working copy gathered in bf16, bf16\n"
        "activations, gradients reduced in float32 (16 + 2 bytes per parameter); bf16-true = weights,\n"
        "gradients and both moments in bf16 (8 bytes per parameter), AdamW computed in float32 and rounded\n"
        "stochastically (--rounding nearest: to nearest even, as PyTorch does). Products take bf16 inputs\n"
        "and accumulate in float32; norms, softmax and the loss compute in float32.\n"
        "--plan prints, per rank, the backend memory of weights, gradients, optimizer state, gathered\n"
        "units, activations (at each --recompute level), workspaces and the total, for the options\n"
        "given (--ranks, --strategy, --precision, --micro-batch, --device: cuda can be planned without a\n"
        "GPU). It is a dry run of the code that allocates; metrics.jsonl's mem_peak_bytes is what a run\n"
        "measured. With --recompute auto it names the least level that fits --device-memory (else the\n"
        "device's free memory); where none fits, --plan and a run exit 2 saying what would, each planned\n"
        "alike: another --precision, the largest smaller --micro-batch, the fewest ranks with --strategy full.\n"
        "--async-save: at a checkpoint step each rank copies its shard of the state into a host snapshot\n"
        "(page-locked on a GPU; --plan shows its size) and a background thread writes and checksums the\n"
        "shard file while training continues; rank 0 commits (manifest, latest, --keep) at the first step\n"
        "boundary where every rank's write has ended. At most one checkpoint is in flight: a save due\n"
        "before the previous one is written waits for it. The end of the run, --stop-after and signals\n"
        "wait for it, then save synchronously. The checkpoints are the same bytes as without it.\n"
        "metrics.jsonl gets one line per committed checkpoint {step, checkpoint, async, stall_s, write_s,\n"
        "bytes}: stall_s is how long the training loop was blocked for it, write_s the slowest rank's\n"
        "write, bytes every shard file together.\n"
        "Environment, for comparisons (docs/design.md): FTK_FUSED=all|none|a,b picks the fused ops (rope_qk,\n"
        "qkv_rope, glu, add_rmsnorm, adamw_multi, add_sumsq; default all on CUDA, none on the CPU). With\n"
        "--device cuda: FTK_CUDA_ATTN=simple keeps the first attention kernels, =mma takes the ones with\n"
        "accumulators in registers (not yet the default), FTK_CUDA_VEC=0 the one-element elementwise\n"
        "kernels and the column-wise embedding gradient, FTK_CUDA_MATMUL=fp32|tf32 makes fp32 products\n"
        "exact or TF32 (default: bf16, fp32 sums).\n"
        "FTK_PROFILE=FILE (or - for standard error) times every op of rank 0's backend and writes a table\n"
        "per op and shape at the end: calls, milliseconds, share of the wall time from the end of the\n"
        "first step (warm-up) to the end of the run, TFLOP/s or GB/s (kernels/prof.h).\n"
        "FTK_NCCL_INIT_TIMEOUT=S (default 300): how long GPU ranks wait for every rank of a group to join\n"
        "its NCCL communicator; a rank whose join fails tells the others at once (docs/design.md).\n"
        "FTK_SIM_NODE_RANKS=N: blocks of N consecutive ranks count as nodes (hybrid's default shard group,\n"
        "hpz's node group, the report's levels): the hierarchical strategies tested on one machine.\n"
        "FTK_STEP_TIMEOUT=S (default 0: off): a rank exits 1 when nothing (a step, an evaluation, a\n"
        "checkpoint) has finished for S seconds: a stopped or stuck rank, or a collective that never\n"
        "completes, then ends the job instead of holding it; start it again with --resume auto. Give S\n"
        "above the longest step plus a checkpoint.\n"
        "--recipe litgpt reproduces LitGPT's finetune_full (litgpt 0.5, config_hub llama-2-7b/full.yaml)\n"
        "as it computes it (docs/litgpt.md): --warmup-style litgpt, a cosine to 0 whatever --min-lr says\n"
        "(LitGPT never reads its min_lr), --loss-mean micro (micro-batch j: rows [j*B, (j+1)*B) of the\n"
        "global batch, on any number of ranks), --decay-norms; and for what is not given: --clip 0,\n"
        "--precision bf16-true, --rounding nearest, --eval-every 100, --eval-rows 100 micro-batches,\n"
        "--save-every 200; the validation loss is then also a mean of micro-batch means. Data: pack with\n"
        "ftk-pack --no-mask-prompt (LitGPT's Alpaca) and without --pack (a warning says otherwise). The\n"
        "data order is ftk's (seed, epoch) permutation, not LitGPT's DataLoader's.\n"
        "Signals: SIGINT, SIGTERM, SIGUSR1 or SIGHUP (to any rank) finish the current step on every rank,\n"
        "write a checkpoint and exit 75 (a stop before step 1 exits 75 at once, leaving no new run); a second\n"
        "SIGINT or SIGTERM stops at once, removing what was half written (SIGHUP stays a stop, however often\n"
        "it comes). Under mpirun send SIGUSR1: Open MPI kills the ranks soon after it forwards the others.\n"
        "Exit status: 0 done, 1 runtime failure, 2 bad usage or input, 75 stopped with a checkpoint\n"
        "written (preempted or --stop-after): run the same command with --resume auto.\n",
    .opts = options,
    .min_pos = 0,
    .max_pos = 0,
};

static comm_t *world;
static int rank, nranks;
static double step_timeout_s; /* FTK_STEP_TIMEOUT (the hang watchdog, below); 0: none */

/* SIGTERM, SIGINT, SIGHUP, SIGUSR1: stop at the step's end with a checkpoint (exit 75); a
 * stop asked for before the first step ends the run there (stop_agreed(), below). A
 * second SIGTERM or SIGINT stops at once: the first one re-installs the temporaries' cleanup
 * (libcommon/atomic.h) for them, which removes them and dies of the signal. SIGHUP never
 * does (it stays a request to stop, however often it comes): a closed terminal or ssh
 * session may send it twice, the kernel to the foreground job and the shell to its jobs.
 * Under Open MPI's mpirun (OMPI_COMM_WORLD_SIZE set), rank 0 says at once what the
 * launcher will do: it forwards SIGTERM and SIGINT (and turns its own SIGHUP into SIGTERM)
 * only after odls_base_sigkill_timeout seconds and kills the ranks as long again later (1 s
 * by default), often too soon for a checkpoint, where SIGUSR1 is forwarded at once and
 * never followed by a kill. */
static volatile sig_atomic_t stop_signal;
static int under_ompi;
/* on_stop, with every stop signal held while it runs; no SA_RESTART, so that a write to a
 * full stderr pipe the signal interrupts gives up (log.h ftk_stderr_unstall()) */
static struct sigaction stop_action;
static void on_stop(int sig)
{
    static const char warn[] =
        "ftk-train: stopping with a checkpoint at the end of this step (exit 75). Under mpirun, Open MPI kills "
        "the ranks odls_base_sigkill_timeout seconds (1 by default) after it forwards SIGTERM or SIGINT, often "
        "before the checkpoint is written (the previous one stays whole): signal mpirun with SIGUSR1 instead, or "
        "start it with --mca odls_base_sigkill_timeout 120. A second SIGTERM or SIGINT stops at once.\n";
    /* mpirun stops reading its ranks' output once it is signalled, so a rank that writes
     * on may be waiting on a full pipe now, or soon: the stop must not wait for it */
    ftk_stderr_unstall();
    if ((sig == SIGTERM || sig == SIGINT) && !stop_signal) {
        atomic_install_signal_cleanup();
        sigaction(SIGHUP, &stop_action, NULL); /* the cleanup took it too */
        if (under_ompi && rank == 0) {
            ssize_t w = write(2, warn, sizeof warn - 1);
            (void)w;
        }
    }
    stop_signal = sig;
}

/* The signals that ask for a stop, held (blocked) from before the libraries' constructors
 * run until on_stop is in place: a library may start threads as it loads (OpenBLAS's
 * pthreads build starts its workers), and a thread inherits the mask it was made with, so
 * a process-directed signal that comes in between stays pending in every thread, to be
 * taken by on_stop, instead of killing the process (SIGUSR1's default) or, under mpirun,
 * the job. What is left is the dynamic loader's few milliseconds after exec. */
static sigset_t stop_set;
static void hold_stop_signals(int argc, char **argv, char **envp)
{
    (void)argc, (void)argv, (void)envp;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGHUP);
    sigaddset(&stop_set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &stop_set, NULL);
}
/* Before any shared library's constructor (the executable's .preinit_array runs first). */
__attribute__((section(".preinit_array"), used)) static void (*const hold_stop_signals_p)(int, char **,
                                                                                          char **) = hold_stop_signals;

/* Whether any rank was asked to stop (collective). Before the first step of this process
 * nothing was trained since the checkpoint resumed from (or the initial weights), so a
 * stop needs no checkpoint and ends the run there. */
static int stop_agreed(void)
{
    int64_t v = stop_signal != 0;
    return comm_allreduce_i64(world, &v, 1, COMM_MAX) == 0 && v > 0;
}

/* A stop before this process's first step: exit 75, nothing trained and nothing saved (a new
 * run's directory, made for nothing, is removed as a failed run's is). step: the step the
 * run stands at; -1 before the run directory was looked at. */
static int stopped_before(int64_t step)
{
    if (step < 0)
        ftk_info("stopped by a signal as it started: nothing written; run the same command again");
    else if (step == 0)
        ftk_info("stopped by a signal before step 1: nothing trained, no checkpoint; run the same command again");
    else
        ftk_info("stopped by a signal before step %lld: nothing trained since the checkpoint of step %lld; continue "
                 "with --resume auto",
                 (long long)step + 1, (long long)step);
    return FTK_EXIT_PREEMPTED;
}

/* Rank 0 prints an agreed failure (its message names the failing rank). */
static int report(int code)
{
    if (code && rank == 0)
        ftk_error("%s", ftk_err_msg());
    return code;
}

/* Every rank with its status; the highest code, the lowest failing rank's message printed. */
static int agree_msg(int code, const char *msg)
{
    char why[2048];
    int who;
    snprintf(why, sizeof why, "%s", code ? msg : "");
    if (!(code = comm_agree(world, code, why, sizeof why, &who)))
        return 0;
    if (nranks > 1 && who != 0)
        ftk_err_set("rank %d: %s", who, why);
    else
        ftk_err_set("%s", why);
    return report(code);
}

/* ---- metrics ---------------------------------------------------------------------------------- */

/* Keeps the metrics records of steps <= step (a resumed run rewrites what came after);
 * *elapsed0: the run's elapsed_s at that step (the last kept step line's), from which a
 * resumed run's clock continues, so elapsed_s counts the run's whole history. Returns 1
 * (the run had a history), 0 (no metrics.jsonl yet: a new run) or -1. */
static int trim_metrics(const char *path, int64_t step, double *elapsed0)
{
    buf_t in = {0}, out = {0};
    *elapsed0 = 0;
    /* a regular file of the run (a FIFO would stall the resume, /dev/zero fill memory):
     * 1 GiB is a million steps' lines */
    if (buf_read_small(&in, path, (size_t)1 << 30, BUF_NOFOLLOW) < 0) {
        int e = errno;
        buf_free(&in);
        errno = e;
        return e == ENOENT ? 0 : -1; /* ENOENT: none yet */
    }
    int rc = metrics_trim(&out, &in, step, elapsed0);
    if (rc == 0)
        rc = atomic_write_file(path, out.data, out.len);
    buf_free(&in);
    buf_free(&out);
    return rc < 0 ? -1 : 1;
}

/* The first write error of metrics.jsonl or the TensorBoard file (rank 0), naming the file,
 * reported at the next step's end: a full disk stops the run rather than losing its
 * metrics silently. */
static char metrics_path[4096], metrics_err[4096 + 256];

static void metrics_fail(int e)
{
    if (!metrics_err[0])
        snprintf(metrics_err, sizeof metrics_err, "%s: %s", metrics_path, strerror(e ? e : EIO));
}

/* The wall-clock time of a record, ISO 8601 UTC to the millisecond */
static const char *iso_now(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return out;
}

/* --tensorboard DIR (rank 0): the step's and evaluations' scalars, or NULL */
static tfevents_t *tb;

static void tb_scalar(const char *tag, int64_t step, double v)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tb && tfevents_scalar(tb, tag, step, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, (float)v) < 0 &&
        !metrics_err[0])
        snprintf(metrics_err, sizeof metrics_err, "--tensorboard %s", ftk_err_msg());
}

static void metrics_flush(FILE *mf)
{
    if (fflush(mf) != 0 || ferror(mf))
        metrics_fail(errno);
}

/* Once, when stderr stopped taking messages (its pipe's reader gone, as in `ftk-train …
 * 2>&1 | head`; a closed ssh session's terminal): the run goes on, and its metrics say from
 * which step on the messages are missing. */
static void metrics_stderr_lost(FILE *mf, int64_t step)
{
    static int said;
    int e = ftk_stderr_errno();
    if (!mf || !e || said)
        return;
    said = 1;
    char now[32], text[256];
    buf_t j = {0};
    snprintf(text, sizeof text, "standard error failed by this step (%s): its messages are lost; the metrics go on",
             strerror(e));
    json_write_string(&j, text, strlen(text));
    fprintf(mf, "{\"kind\": \"warning\", \"step\": %lld, \"message\": %s, \"time\": \"%s\"}\n", (long long)step,
            j.data ? j.data : "\"\"", iso_now(now));
    buf_free(&j);
    metrics_flush(mf);
}

static void metrics_step(FILE *mf, const trainer_step_t *s, double dt, double elapsed, const backend_t *be,
                         const char *extra)
{
    char now[32], dev[192] = "";
    const bk_mem_t *mem = bk_mem(be);
    if (be->mem_pages) /* the device's pages, and what the device measured in use (0, -1: not measured) */
        snprintf(dev, sizeof dev,
                 ", \"mem_device_peak_bytes\": %lld, \"mem_device_used_bytes\": %lld, \"mem_device_other_bytes\": %lld",
                 (long long)mem->dev_peak, (long long)mem->used_peak, (long long)mem->used_other);
    fprintf(mf,
            "{\"kind\": \"step\", \"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
            "\"tokens\": %lld, \"tokens_seen\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"time\": \"%s\", "
            "\"epoch\": %lld, \"ranks\": %d, \"micro_batches\": %lld, \"comm\": {\"allgather_bytes\": %.17g, "
            "\"reduce_scatter_bytes\": %.17g, \"allreduce_bytes\": %.17g, \"wait_s\": %.4f}%s%s, "
            "\"mem_peak_bytes\": %lld}\n",
            (long long)s->step, s->loss, s->lr, s->grad_norm, (long long)s->tokens, (long long)s->tokens_seen,
            s->tokens / dt, elapsed, iso_now(now), (long long)s->epoch, nranks, (long long)s->micro_batches,
            s->comm.ag_bytes, s->comm.rs_bytes, s->comm.ar_bytes, s->comm.wait_s, extra ? extra : "", dev,
            (long long)mem->peak);
    metrics_flush(mf);
    tb_scalar("train/loss", s->step, s->loss);
    tb_scalar("train/learning_rate", s->step, s->lr);
    tb_scalar("train/grad_norm", s->step, s->grad_norm);
    tb_scalar("train/tokens_per_s", s->step, s->tokens / dt);
}

/* The checkpoints committed since the last call: a metrics line and a note each. */
static void metrics_ckpts(trainer_t *t, FILE *mf)
{
    trainer_ckpt_t r[8];
    int n = trainer_ckpt_reports(t, r, 8);
    for (int i = 0; i < n; i++) {
        if (mf) {
            char now[32];
            fprintf(mf,
                    "{\"kind\": \"checkpoint\", \"step\": %lld, \"checkpoint\": \"step-%08lld\", \"async\": %s, "
                    "\"stall_s\": %.4f, \"write_s\": %.4f, \"bytes\": %lld, \"time\": \"%s\"}\n",
                    (long long)r[i].step, (long long)r[i].step, r[i].async ? "true" : "false", r[i].stall_s,
                    r[i].write_s, (long long)r[i].bytes, iso_now(now));
            fflush(mf);
        }
        ftk_info("checkpoint %s/step-%08lld committed (%s; training blocked %.2f s, write %.2f s, %.1f MB)", out_dir,
                 (long long)r[i].step, r[i].async ? "written in the background" : "synchronous", r[i].stall_s,
                 r[i].write_s, (double)r[i].bytes / 1e6);
    }
}

static int evaluate(trainer_t *t, FILE *mf, int64_t step)
{
    int64_t vt;
    double vl;
    int code = trainer_evaluate(t, &vl, &vt);
    if (code)
        return report(code);
    if (mf) {
        char now[32];
        fprintf(mf, "{\"kind\": \"eval\", \"step\": %lld, \"val_loss\": %.17g, \"val_tokens\": %lld, \"time\": \"%s\"}\n",
                (long long)step, vl, (long long)vt, iso_now(now));
        metrics_flush(mf);
        tb_scalar("eval/val_loss", step, vl);
    }
    ftk_info("step %lld: validation loss %.4f (%lld targets)", (long long)step, vl, (long long)vt);
    return 0;
}

/* ---- start-up ------------------------------------------------------------------------------ */

/* opts_parse() with only rank 0's --help and messages shown. */
static int parse_args(int argc, char **argv)
{
    int saved_out = -1, saved_err = -1;
    if (rank != 0) {
        fflush(stdout);
        fflush(stderr);
        int nul = open("/dev/null", O_WRONLY);
        saved_out = dup(1);
        saved_err = dup(2);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
            close(nul);
        }
    }
    int npos;
    char **pos;
    int rc = opts_parse(&spec, argc, argv, &npos, &pos);
    if (rank != 0) {
        fflush(stdout);
        fflush(stderr);
        if (saved_out >= 0)
            dup2(saved_out, 1), close(saved_out);
        if (saved_err >= 0)
            dup2(saved_err, 2), close(saved_err);
    }
    return rc;
}

/* Every rank must have been given the same arguments: compares a hash of argv. */
static int same_args(int argc, char **argv)
{
    buf_t b = {0};
    for (int i = 1; i < argc; i++)
        if (buf_append(&b, argv[i], strlen(argv[i]) + 1) < 0)
            abort(); /* a few hundred bytes */
    int64_t h = (int64_t)(hash_bytes(b.data ? b.data : "", b.len) >> 1), v[2] = {h, -h};
    buf_free(&b);
    comm_allreduce_i64(world, v, 2, COMM_MAX);
    return v[0] == -v[1];
}

/* Whether option --name was on the command line (before a `--`; --min_lr too). */
static int given(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (opts_long_is(argv[i], name))
            return 1;
    return 0;
}

/* --recipe litgpt: its pieces, and LitGPT's values for what the command line does not give. */
static void apply_recipe(int argc, char **argv)
{
    if (strcmp(recipe, "litgpt"))
        return;
    if (!given(argc, argv, "warmup-style"))
        warmup_style = "litgpt";
    if (!given(argc, argv, "loss-mean"))
        loss_mean = "micro";
    decay_norms = 1;
    if (given(argc, argv, "min-lr") && min_lr != 0 && rank == 0)
        ftk_warn("--recipe litgpt: the cosine decays to 0 as LitGPT's finetune does (it never reads its min_lr); "
                 "--min-lr %g is not used",
                 min_lr);
    min_lr = 0;
    if (!given(argc, argv, "clip"))
        clip = 0;
    if (!given(argc, argv, "precision"))
        precision_arg = "bf16-true";
    if (!given(argc, argv, "rounding"))
        rounding_arg = "nearest";
    if (!given(argc, argv, "eval-every"))
        eval_every = 100;
    if (!given(argc, argv, "eval-rows")) /* eval.max_iters: 100 micro-batches (0: the whole split) */
        eval_rows = micro_batch > 0 && micro_batch <= INT64_MAX / 100 ? 100 * micro_batch : 0;
    if (!given(argc, argv, "save-every") && !no_save)
        save_every = 200;
}

static char why[1024];
static int bad(const char *fmt, ...) FTK_PRINTF(1, 2);
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return FTK_EXIT_USAGE;
}

/* The options into o (all but the paths' existence). */
static int check_values(trainer_opts_t *o)
{
    if (!plan && (!model_path || !data_path || !out_dir))
        return bad("--model, --data and --out are required (see --help)");
    if (plan && !model_path == !preset)
        return bad("--plan: give exactly one of --model and --preset");
    if (plan && !data_path && plan_max_len <= 0)
        return bad("--plan: give --data or --max-len");
    if (!plan && (preset || plan_max_len || plan_ranks != 1))
        return bad("--preset, --max-len and --ranks are for --plan");
    if (backend_check_device(device, device_from_env) < 0)
        return bad("%s", ftk_err_msg());
    if (!plan && !strcmp(device, "cuda") && nranks > 1 && !comm_nccl_built())
        return bad("--device cuda on %d ranks: GPU ranks need the NCCL communication backend: %s; run one process, "
                   "or --device cpu",
                   nranks, ftk_err_msg());
    if (steps < 0 || epochs < 1 || global_batch < 1 || micro_batch < 1 || warmup < 0 || !(lr > 0) ||
        !(min_lr >= 0) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0) ||
        !(weight_decay >= 0) || !(clip >= 0) || save_every < 0 || keep < 0 || eval_every < 0 || eval_rows < 0 ||
        stop_after < 0 || threads < 0 || group_size < 0 || node_size < 0 || !(save_minutes >= 0) || plan_ranks < 1 ||
        plan_max_len < 0)
        return bad("invalid option value: need --global-batch, --micro-batch, --ranks >= 1, --lr > 0, betas in "
                   "[0, 1), --eps > 0, and the counts >= 0 (see --help)");
    /* LitGPT refuses this (an assertion); here a micro-batch past the batch trains the bits
     * of --micro-batch G and only wastes memory, and a refusal would strand the runs that
     * kept it (a resume must keep the micro-batch): said, not refused */
    if (micro_batch > global_batch && rank == 0)
        ftk_warn("--micro-batch %lld is more than --global-batch %lld: a micro-batch never holds more than the global "
                 "batch's %lld rows: the memory for the other %lld rows is unused (give --micro-batch %lld or less)",
                 (long long)micro_batch, (long long)global_batch, (long long)global_batch,
                 (long long)(micro_batch - global_batch), (long long)global_batch);
    if (no_save && (save_every || stop_after || keep || async_save))
        return bad("--no-save writes no checkpoint: --save-every, --stop-after, --keep and --async-save contradict it");
    if (no_save)
        save_minutes = 0;
    double join_s; /* read again by comm_enable_nccl: checked here, a bad value is a usage error */
    if (!plan && !strcmp(device, "cuda") && !comm_alone(world) && comm_join_timeout(&join_s) < 0)
        return bad("%s", ftk_err_msg());
    if (!plan && opts_env_seconds("FTK_STEP_TIMEOUT", 1, &step_timeout_s) < 0)
        return bad("%s", ftk_err_msg());
    int sim_nodes; /* read again wherever nodes are asked for: checked here, a bad value is a usage error */
    if (comm_sim_node_ranks(&sim_nodes) < 0)
        return bad("%s", ftk_err_msg());
    if (plan && report_path)
        return bad("--report is for a training run, not --plan");
    /* rank 0 writes it at the end (output.h; every start of the run writes its own, so an
     * existing file is replaced): what is there must take it */
    if (report_path && rank == 0 && output_check(report_path, OUTPUT_FORCE) < 0)
        return bad("--report %s", ftk_err_msg());
    struct stat os; /* the run directory: made, or continued; never a file, FIFO or device */
    if (!plan && out_dir && stat(out_dir, &os) == 0 && !S_ISDIR(os.st_mode))
        return bad("-o %s: %s, not a directory (a run directory)", out_dir, buf_file_kind(os.st_mode));
    if (strcmp(schedule, "cosine") && strcmp(schedule, "linear") && strcmp(schedule, "constant"))
        return bad("--schedule %s: need cosine, linear or constant", schedule);
    if (strcmp(recipe, "ftk") && strcmp(recipe, "litgpt"))
        return bad("--recipe %s: need ftk or litgpt", recipe);
    if (strcmp(warmup_style, "ftk") && strcmp(warmup_style, "litgpt"))
        return bad("--warmup-style %s: need ftk or litgpt", warmup_style);
    if (strcmp(loss_mean, "global") && strcmp(loss_mean, "micro"))
        return bad("--loss-mean %s: need global or micro", loss_mean);
    if (strategy_parse(strategy_arg, &o->strategy) < 0)
        return bad("--strategy %s: need full, grad-op, none, hybrid or hpz", strategy_arg);
    if (group_size && o->strategy != STRAT_HYBRID)
        return bad("--shard-group-size is for --strategy hybrid");
    if (node_size && o->strategy != STRAT_HPZ)
        return bad("--node-size is for --strategy hpz");
    if (units_parse(units_arg, &o->units) < 0)
        return bad("--units %s: %s", units_arg, ftk_err_msg());
    if (o->strategy == STRAT_HPZ && o->units.kind != CKPT_UNITS_BLOCK)
        return bad("--units %s: --strategy hpz takes --units block only", units_arg);
    if (compress_parse_weights(compress_weights_arg, &o->compress_weights) < 0 ||
        compress_parse_grads(compress_grads_arg, &o->compress_grads) < 0)
        return bad("%s", ftk_err_msg());
    if ((o->compress_weights || o->compress_grads) && o->units.kind != CKPT_UNITS_BLOCK)
        return bad("--units %s: --compress-weights and --compress-grads take --units block only", units_arg);
    if (o->compress_weights && o->strategy == STRAT_HPZ)
        return bad("--compress-weights %s: not with --strategy hpz", compress_weights_arg);
    if (precision_parse(precision_arg, &o->precision) < 0)
        return bad("--precision %s: need fp32, bf16-mixed or bf16-true", precision_arg);
    if (o->compress_grads && o->strategy != STRAT_FULL && o->strategy != STRAT_GRAD_OP)
        return bad("--compress-grads %s: for --strategy full or grad-op (not %s)", compress_grads_arg, strategy_arg);
    if (o->compress_grads && o->precision == PREC_BF16_TRUE)
        return bad("--compress-grads %s: the gradients are bf16 already under --precision bf16-true",
                   compress_grads_arg);
    if (strcmp(rounding_arg, "stochastic") && strcmp(rounding_arg, "nearest"))
        return bad("--rounding %s: need stochastic or nearest", rounding_arg);
    o->model_path = model_path;
    o->data_path = data_path;
    o->allow_other_tokenizer = allow_other_tokenizer;
    if (out_dir) { /* "run/" names run: messages say run/step-…, not run//step-… */
        static char out_norm[4096];
        snprintf(out_norm, sizeof out_norm, "%.*s", path_dir_len(out_dir), out_dir);
        out_dir = out_norm;
    }
    o->out_dir = out_dir;
    o->resume = resume;
    o->train = (ckpt_train_t){.lr = lr, .min_lr = min_lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                              .weight_decay = weight_decay, .clip = clip, .warmup = warmup, .total_steps = steps,
                              .global_batch = global_batch, .micro_batch = micro_batch, .seed = seed,
                              .decay_norms = decay_norms};
    snprintf(o->train.schedule, sizeof o->train.schedule, "%s", schedule);
    snprintf(o->train.warmup_style, sizeof o->train.warmup_style, "%s", warmup_style);
    snprintf(o->train.loss_mean, sizeof o->train.loss_mean, "%s", loss_mean);
    snprintf(o->train.recipe, sizeof o->train.recipe, "%s", recipe);
    o->epochs = epochs;
    o->group_size = o->strategy == STRAT_HPZ ? node_size : group_size;
    o->stochastic = !strcmp(rounding_arg, "stochastic");
    const char *rl = recompute_arg ? (*recompute_arg ? recompute_arg : "block") : "none";
    recompute = !strcmp(rl, "none")    ? MODEL_RECOMPUTE_NONE
                : !strcmp(rl, "norms") ? MODEL_RECOMPUTE_NORMS
                : !strcmp(rl, "block") ? MODEL_RECOMPUTE_BLOCK
                : !strcmp(rl, "auto")  ? PLAN_RECOMPUTE_AUTO
                                       : -2;
    if (recompute == -2)
        return bad("--recompute %s: need none, norms, block or auto", rl);
    uint64_t dm = 0;
    if (device_memory_arg && (opts_parse_size(device_memory_arg, &dm) < 0 || dm == 0 || dm > INT64_MAX))
        return bad("--device-memory %s: need a size such as 80GB, 141GB or 2GiB", device_memory_arg);
    if (device_memory_arg && recompute != PLAN_RECOMPUTE_AUTO)
        return bad("--device-memory is for --recompute auto");
    o->recompute = recompute;
    o->device_bytes = (int64_t)dm;
    o->eval_rows = eval_rows;
    o->keep = keep;
    o->async_save = async_save;
    o->extend = extend;
    return 0;
}

/* ---- --plan ------------------------------------------------------------------------------------ */

static void gb(char *out, size_t n, int64_t bytes)
{
    if (bytes >= 1000000000)
        snprintf(out, n, "%9.2f GB", (double)bytes / 1e9);
    else
        snprintf(out, n, "%9.2f MB", (double)bytes / 1e6);
}

static int run_plan(const trainer_opts_t *o)
{
    plan_opts_t p = {.o = trainer_build_opts(o), .ranks = plan_ranks, .device = device, .max_len = plan_max_len};
    const char *what = preset ? preset : model_path;
    if (preset) {
        if (model_preset(preset, &p.cfg) < 0) {
            ftk_error("--preset: %s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
    } else {
        hid_t wf = weights_open(model_path, &p.cfg);
        if (wf < 0) {
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        h5_close(wf);
    }
    if (data_path) {
        tokens_set_t *ds = tokens_set_open(data_path); /* a file or a set of shards */
        if (!ds) {
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        if (!p.max_len)
            p.max_len = tokens_set_info(ds)->max_len;
        p.o.attn_max_seg = trainer_attn_max_seg(ds, o->train.micro_batch); /* as trainer_new */
        tokens_set_close(ds);
    }
    /* --recompute auto fits --device-memory, else this machine's device's free memory */
    int64_t budget = o->device_bytes;
    if (o->recompute == PLAN_RECOMPUTE_AUTO && !budget) {
        backend_t *real = !strcmp(device, "cuda") ? (backend_cuda_devices() > 0 ? backend_cuda_new(0) : NULL)
                                                  : backend_cpu_new();
        budget = real ? plan_device_bytes(real) : -1;
        backend_free(real);
        if (budget < 0) {
            ftk_error("--recompute auto: %s; give --device-memory",
                      real ? ftk_err_msg() : "no such device here to ask its free memory");
            return FTK_EXIT_USAGE;
        }
    }
    /* Ranks differ only by padding; the table is rank 0's, the largest total is named.
     * auto: every rank fits, or the first that does not is the verdict's. */
    plan_t pl = {0}, most = {0}, unfit = {0};
    int fits = 1;
    for (int r = 0; r < plan_ranks; r++) {
        plan_t x;
        if (plan_memory(&p, r, budget, &x) < 0) {
            ftk_error("%s", ftk_err_msg());
            return FTK_EXIT_USAGE;
        }
        if (r == 0)
            pl = x;
        if (x.total > most.total)
            most = x;
        if (fits && !x.fits)
            fits = 0, unfit = x;
    }
    const int64_t *c = pl.mem.at_peak;
    char a[32], b2[32];
    double np = (double)model_n_params(&p.cfg);
    int autofit = o->recompute == PLAN_RECOMPUTE_AUTO;
    char rec[128] = "";
    if (autofit && fits)
        snprintf(rec, sizeof rec, ", --recompute auto: %s fits %.2f GB", plan_recompute_name(pl.recompute),
                 (double)budget / 1e9);
    else if (autofit)
        snprintf(rec, sizeof rec, ", --recompute auto: no level fits %.2f GB (block shown)", (double)budget / 1e9);
    else if (pl.recompute != MODEL_RECOMPUTE_NONE)
        snprintf(rec, sizeof rec, ", --recompute %s", plan_recompute_name(pl.recompute));
    if (o->units.kind != CKPT_UNITS_BLOCK) { /* block: the header as before policies */
        char un[32];
        units_name(&o->units, un);
        snprintf(rec + strlen(rec), sizeof rec - strlen(rec), ", --units %s", un);
    }
    printf("memory plan: %s (%.3f %s parameters), %d rank%s, strategy %s (%lld shard%s), precision %s, micro-batch %lld "
           "x %lld tokens%s, device %s\n",
           what, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? "B" : "M", plan_ranks, plan_ranks == 1 ? "" : "s", strategy_arg,
           (long long)pl.shard_count, plural_s(pl.shard_count), precision_arg, (long long)micro_batch, (long long)p.max_len,
           rec, device);
    printf("per rank (rank 0):\n");
    gb(a, sizeof a, c[BK_MEM_WEIGHTS]);
    printf("  weights            %s\n", a);
    gb(a, sizeof a, c[BK_MEM_GRADS]);
    printf("  gradients          %s\n", a);
    gb(a, sizeof a, c[BK_MEM_OPTIM]);
    printf("  optimizer state    %s\n", a);
    gb(a, sizeof a, c[BK_MEM_GATHER]);
    printf("  gathered units     %s   (in use and prefetched)\n", a);
    gb(a, sizeof a, c[BK_MEM_ACTS]);
    printf("  activations        %s   (--recompute", a);
    for (int lv = 0; lv < 3; lv++) { /* none, norms, block: least recompute first */
        int k = lv == 0 ? MODEL_RECOMPUTE_NONE : lv == 1 ? MODEL_RECOMPUTE_NORMS : MODEL_RECOMPUTE_BLOCK;
        gb(b2, sizeof b2, pl.acts[k]);
        printf(" %s %s%s", plan_recompute_name(k), b2 + strspn(b2, " "), lv < 2 ? "," : ")\n");
    }
    int cuda = !strcmp(device, "cuda");
    gb(a, sizeof a, c[BK_MEM_WORKSPACE]);
    int64_t dnn_seg = p.o.attn_max_seg > 0 ? p.o.attn_max_seg : o->train.micro_batch;
    int64_t dnn = bk_cudnn_plan_bytes(device, precision_dtypes(o->precision).act, dnn_seg, p.max_len,
                                      (int)p.cfg.num_attention_heads, (int)p.cfg.num_key_value_heads,
                                      (int)model_head_dim(&p.cfg));
    if (cuda) {
        gb(b2, sizeof b2, (int64_t)BK_CUDA_WORKSPACE_BYTES);
        char s3[32];
        gb(s3, sizeof s3, c[BK_MEM_WORKSPACE] - (int64_t)BK_CUDA_WORKSPACE_BYTES - (dnn > 0 ? dnn : 0));
        printf("  workspaces         %s   (cuBLASLt %s, the CUDA backend's scratch for these shapes %s)\n", a,
               b2 + strspn(b2, " "), s3 + strspn(s3, " "));
    } else {
        printf("  workspaces         %s\n", a);
    }
    if (dnn > 0) {
        gb(a, sizeof a, dnn);
        printf("    cuDNN attention  %s   (FTK_CUDA_ATTN=cudnn: %lld segments x %lld tokens%s, in the workspaces)\n", a,
               (long long)dnn_seg, (long long)p.max_len, p.o.attn_max_seg > 0 ? "" : ", one a row: no --data");
    }
    gb(a, sizeof a, c[BK_MEM_OTHER]);
    printf("  other              %s   (batch inputs, the head's logits chunk)\n", a);
    if (cuda) { /* what the GPU holds beyond the allocations (kernels/cuda_mem.h) */
        gb(a, sizeof a, pl.mem.peak);
        printf("  allocations        %s   (%lld bytes: the rows above, metrics.jsonl's mem_peak_bytes)\n", a,
               (long long)pl.mem.peak);
        gb(a, sizeof a, pl.rounding);
        printf("  page rounding      %s   (%lld bytes: cudaMalloc's 2 MiB pages; with the allocations, "
               "mem_device_peak_bytes)\n",
               a, (long long)pl.rounding);
        gb(a, sizeof a, pl.context);
        printf("  CUDA context       %s   (%lld bytes: an estimate; a GPU measures the total, mem_device_used_bytes)\n",
               a, (long long)pl.context);
    }
    gb(a, sizeof a, pl.total);
    printf("  total              %s   (%lld bytes, %.2f GiB)\n", a, (long long)pl.total, (double)pl.total / (1 << 30));
    printf("  total by level    ");
    for (int lv = 0; lv < 3; lv++) {
        int k = lv == 0 ? MODEL_RECOMPUTE_NONE : lv == 1 ? MODEL_RECOMPUTE_NORMS : MODEL_RECOMPUTE_BLOCK;
        gb(b2, sizeof b2, pl.peak[k]);
        printf(" --recompute %s %s%s", plan_recompute_name(k), b2 + strspn(b2, " "), lv < 2 ? "," : "\n");
    }
    /* host memory beside the backend's: on the CPU the same RAM, on a GPU page-locked */
    gb(a, sizeof a, pl.snapshot);
    printf("  snapshot           %s   (%s: a host copy of this rank's shard%s)\n", a,
           o->async_save ? "--async-save" : "with --async-save", strcmp(device, "cuda") ? "" : ", page-locked");
    if (o->async_save && strcmp(device, "cuda")) {
        gb(a, sizeof a, pl.total + pl.snapshot);
        printf("  total + snapshot   %s   (%lld bytes, %.2f GiB)\n", a, (long long)(pl.total + pl.snapshot),
               (double)(pl.total + pl.snapshot) / (1 << 30));
    }
    if (most.rank != 0) {
        gb(a, sizeof a, most.total);
        printf("largest rank: %d, total %s\n", most.rank, a);
    }
    /* --recompute auto asked for a fit: none is a refusal, with what would fit */
    if (autofit && !fits) {
        char advice[2048];
        fflush(stdout);
        plan_advice(&p, budget, advice, sizeof advice);
        char who[32] = "";
        if (unfit.rank != 0)
            snprintf(who, sizeof who, " on rank %d", unfit.rank);
        ftk_error("--recompute auto: no level fits %.2f GB%s%s (the least, block, needs %.2f GB); %s",
                  (double)budget / 1e9, o->device_bytes ? "" : " (the device's free memory)", who,
                  (double)unfit.peak[MODEL_RECOMPUTE_BLOCK] / 1e9, advice);
        return FTK_EXIT_USAGE;
    }
    return FTK_EXIT_OK;
}

/* ---- the hang watchdog (FTK_STEP_TIMEOUT) ------------------------------------------------------ */

/* FTK_STEP_TIMEOUT=S (docs/design.md, "Hangs"): a thread ends the process (exit 1) when the
 * training loop has finished nothing — a step, an evaluation, a checkpoint — for S seconds.
 * A rank stopped or stuck, a node gone without an error, a collective that never completes
 * would otherwise hold every rank until the job's time limit; one rank's exit makes the
 * launcher end the others, and the job starts again with --resume auto (the committed
 * checkpoints survive a kill at any instant). 0 (the default): no watchdog. */
static atomic_llong beat_ms; /* when the loop last finished something; 0: not armed */

static long long now_ms(void) { return (long long)(time_now() * 1e3); }
static void beat(void) { atomic_store(&beat_ms, now_ms()); }

static void *watchdog(void *arg)
{
    (void)arg;
    long long limit = (long long)(step_timeout_s * 1e3);
    struct timespec nap = {0, 100000000}; /* 0.1 s: the exit comes at most that late */
    long long last = now_ms();
    for (;;) {
        nanosleep(&nap, NULL);
        long long t = now_ms(), b = atomic_load(&beat_ms);
        /* This thread itself did not run for a second: the process was stopped (SIGSTOP,
         * the debugger) or starved, so its silence is not the loop's, nor evidence against
         * the other ranks; the clock starts again. Without this, the rank that was stopped
         * would, once continued, report itself as the one that found the hang. */
        if (t - last > 1000 && b)
            atomic_store(&beat_ms, b = t);
        last = t;
        if (b && t - b > limit) {
            char m[512];
            snprintf(m, sizeof m,
                     "ftk-train: error: rank %d: nothing finished for %g s (FTK_STEP_TIMEOUT): a rank is stopped, "
                     "stuck or gone, or a collective never completes; exiting so that the job can be started again "
                     "with --resume auto\n",
                     rank, step_timeout_s);
            /* write(2), not stdio: the stuck main thread may hold stderr's lock */
            ssize_t w = write(STDERR_FILENO, m, strlen(m));
            (void)w; /* nothing more to do if stderr is gone */
            _exit(FTK_EXIT_FAIL);
        }
    }
    return NULL;
}

/* Arms the watchdog (from the loop's start to the process's end), if FTK_STEP_TIMEOUT asks. */
static int watchdog_start(void)
{
    if (!(step_timeout_s > 0))
        return 0;
    beat();
    pthread_t t;
    int e = pthread_create(&t, NULL, watchdog, NULL);
    if (e) {
        ftk_err_set("FTK_STEP_TIMEOUT: cannot start the watchdog thread: %s", strerror(e));
        return -1;
    }
    pthread_detach(t);
    return 0;
}

/* ---- the run --------------------------------------------------------------------------------- */

/* --device when not given (docs/design.md, "Devices"): FTK_DEVICE, else cuda for a process
 * started alone that sees a GPU, else cpu. Ranks under a launcher (whose GPU path is NCCL's,
 * even one rank's) default to cpu until NCCL has run on GPUs (the README's GPU section):
 * they say --device cuda (or FTK_DEVICE=cuda) to use it. */
static const char *default_device(void)
{
    return backend_default_device(comm_alone(world) ? backend_cuda_devices : NULL, &device_from_env);
}

/* LitGPT's finetune/full.yaml, key by key (every config_hub/finetune/MODEL/full.yaml of litgpt
 * 0.5.11 to 0.5.13, the keys of its finetune_full setup() and the older TrainArgs'
 * learning_rate, weight_decay, beta1, beta2): what ftk sets from it, what does not change a
 * run (ignored, said), what ftk cannot honour (refused, saying how to get it). An empty
 * value (null) is LitGPT's default: the ftk value that default is, or refused where LitGPT
 * refuses it too (an int, a float, epochs: its finetune_full requires them). A LitGPT file
 * without max_norm does not clip (LitGPT's default, None), whatever ftk's default is. */
static const config_alias_t litgpt_keys[] = {
    /* null: LitGPT picks bf16-mixed on a device with bf16 (its get_default_supported_precision) */
    {"precision", CONFIG_OPTION, "precision", "bf16-true=bf16-true|bf16-mixed=bf16-mixed|32-true=fp32|32=fp32",
     "bf16-mixed", NULL},
    {"out_dir", CONFIG_OPTION, "out", NULL, NULL, NULL},
    {"seed", CONFIG_OPTION, "seed", NULL, NULL, NULL},
    {"resume", CONFIG_OPTION, "resume", "false=none|False=none|true=auto|True=auto|auto=auto", NULL, NULL},
    {"train.global_batch_size", CONFIG_OPTION, "global-batch", NULL, NULL, NULL},
    {"train.micro_batch_size", CONFIG_OPTION, "micro-batch", NULL, NULL, NULL},
    {"train.lr_warmup_steps", CONFIG_OPTION, "warmup", NULL, NULL, NULL},
    {"train.epochs", CONFIG_OPTION, "epochs", NULL, NULL, NULL},
    {"train.max_steps", CONFIG_OPTION, "steps", NULL, "0", NULL}, /* null: no limit but the epochs */
    {"train.min_lr", CONFIG_OPTION, "min-lr", NULL, NULL, NULL},
    /* null or left out: LitGPT does not clip (its finetune_full refuses a value; ftk clips to it) */
    {"train.max_norm", CONFIG_OPTION, "clip", NULL, "0", "0"},
    {"train.save_interval", CONFIG_OPTION, "save-every", NULL, "0", NULL}, /* null: only the final save */
    {"train.learning_rate", CONFIG_OPTION, "lr", NULL, NULL, NULL}, /* litgpt 0.3's TrainArgs */
    {"train.weight_decay", CONFIG_OPTION, "weight-decay", NULL, NULL, NULL},
    {"train.beta1", CONFIG_OPTION, "beta1", NULL, NULL, NULL},
    {"train.beta2", CONFIG_OPTION, "beta2", NULL, NULL, NULL},
    {"eval.interval", CONFIG_OPTION, "eval-every", NULL, NULL, NULL},
    {"optimizer.class_path", CONFIG_OPTION, "", "torch.optim.AdamW=AdamW", NULL, NULL},
    {"optimizer.init_args.lr", CONFIG_OPTION, "lr", NULL, NULL, NULL},
    {"optimizer.init_args.weight_decay", CONFIG_OPTION, "weight-decay", NULL, NULL, NULL},
    {"optimizer.init_args.betas", CONFIG_OPTION, "beta1 beta2", NULL, NULL, NULL},
    {"optimizer.init_args.eps", CONFIG_OPTION, "eps", NULL, NULL, NULL},
    {"optimizer", CONFIG_REFUSE, "a bare optimizer name: ftk runs AdamW; write optimizer.init_args", NULL, NULL, NULL},
    {"train.log_interval", CONFIG_IGNORE, "ftk writes every step to metrics.jsonl", NULL, NULL, NULL},
    {"train.max_seq_length", CONFIG_IGNORE, "the data's: ftk-pack --max-len made its rows", NULL, NULL, NULL},
    {"train.tie_embeddings", CONFIG_IGNORE, "the model's config.json decides", NULL, NULL, NULL},
    {"train.max_time", CONFIG_IGNORE,
     "LitGPT's finetune_full does not read it either; a time limit: SIGTERM or SIGUSR1 (a checkpoint, exit 75)", NULL,
     NULL, NULL},
    {"train.max_tokens", CONFIG_REFUSE, "ftk stops by --steps or --epochs", NULL, "", NULL},
    {"train.lr_warmup_fraction", CONFIG_REFUSE, "LitGPT's finetune_full does not take it either: give lr_warmup_steps",
     NULL, "", NULL},
    {"eval.max_iters", CONFIG_IGNORE, "ftk evaluates --eval-rows rows (the recipe's 100 micro-batches of 4 are its "
                                      "default 400)", NULL, NULL, NULL},
    {"eval.max_new_tokens", CONFIG_IGNORE, "ftk-train generates nothing; ftk-generate -n", NULL, NULL, NULL},
    {"eval.initial_validation", CONFIG_IGNORE, "ftk evaluates at step 0 when --eval-every > 0", NULL, NULL, NULL},
    {"eval.final_validation", CONFIG_IGNORE, "ftk evaluates at the end when --eval-every > 0", NULL, NULL, NULL},
    {"eval.evaluate_example", CONFIG_IGNORE, "ftk-train generates nothing; ftk-generate", NULL, NULL, NULL},
    {"checkpoint_dir", CONFIG_IGNORE, "a Hugging Face folder: import it with ftk-import-hf and give --model", NULL, NULL,
     NULL},
    {"data", CONFIG_IGNORE, "the data is --data's, as ftk-pack made it (template, mask, split, seed)", NULL, NULL,
     NULL},
    {"devices", CONFIG_IGNORE, "the launcher's: mpirun -np N or srun", NULL, NULL, NULL},
    {"num_nodes", CONFIG_IGNORE, "the launcher's: mpirun or srun", NULL, NULL, NULL},
    {"logger_name", CONFIG_IGNORE, "ftk writes metrics.jsonl (ftk-plot --csv) and --tensorboard DIR", NULL, NULL, NULL},
    {"log", CONFIG_IGNORE, "no WandB or LitLogger: ftk writes metrics.jsonl and --tensorboard DIR", NULL, NULL, NULL},
    {"quantize", CONFIG_REFUSE, "ftk trains full-precision weights (no bitsandbytes quantization)", NULL, "", NULL},
    {"access_token", CONFIG_IGNORE, "ftk downloads nothing", NULL, NULL, NULL},
    {0},
};

/* What a run keeps of its options (RUN/options.yaml): all but where and how this process
 * runs, and the requests of this invocation. */
static const char *const not_kept[] = {"out",  "resume", "config", "extend", "plan",    "ranks",  "preset",
                                       "max-len", "stop-after", "device", "threads", "report", "device-memory", NULL};

/* The words expand_args() made: allocated for the process's life (the options point into
 * them), reachable from here (volatile: stores the compiler would drop, as nothing reads
 * them, and LeakSanitizer would then report). */
static char **volatile kept_words[2];
static char **volatile kept_argv;

/* Builds the argument list the options are parsed from: the run's kept options (with
 * --resume and neither the inputs nor --config on the command line: `ftk-train -o RUN
 * --resume auto [--steps N --extend]`; a full command line is taken as it is, and its
 * differences from the checkpoint refused as ever), or --config's; then the command line,
 * overriding them. Every rank reads the same files, so the same list (which same_args()
 * checks). Returns 0, or exit 2 after rank 0 said why. */
static int expand_args(int *argc, char ***argv)
{
    const char *cfg = NULL, *out = NULL;
    int resume = 0, inputs = 0, cli_tb = 0;
    for (int i = 1; i < *argc; i++) {
        const char *a = (*argv)[i], *next = i + 1 < *argc ? (*argv)[i + 1] : NULL;
        if (!strcmp(a, "--"))
            break;
        inputs |= !strncmp(a, "-m", 2) || !strncmp(a, "-d", 2) || !strncmp(a, "--model", 7) || !strncmp(a, "--data", 6);
        cli_tb |= !strncmp(a, "--tensorboard", 13);
        if (!strcmp(a, "--config") && next)
            cfg = next;
        else if (!strncmp(a, "--config=", 9))
            cfg = a + 9;
        else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && next)
            out = next;
        else if (!strncmp(a, "--out=", 6))
            out = a + 6;
        else if (!strncmp(a, "-o", 2) && a[2])
            out = a + 2;
        else if (!strcmp(a, "--resume") && next)
            resume = strcmp(next, "none") != 0;
        else if (!strncmp(a, "--resume=", 9))
            resume = strcmp(a + 9, "none") != 0;
    }
    char kept[4096] = "";
    if (resume && out && !inputs && !cfg)
        snprintf(kept, sizeof kept, "%.*s/options.yaml", path_dir_len(out), out);
    struct stat sb;
    if (kept[0] && lstat(kept, &sb) != 0) /* a link is there, and refused */
        kept[0] = 0;
    if (!kept[0] && !cfg)
        return 0;
    /* The run's file is ftk's own, in a directory that may be someone else's: it sets only
     * what a run keeps (what keep_options() writes), names no output outside the run unless
     * the command line does, is not read through a link and is never quoted. */
    static const char *const tb_inside[] = {"tensorboard", NULL}, *const not_config[] = {"config", NULL};
    const config_spec_t kspec = {.opts = options,
                                 .skip = not_kept,
                                 .skip_why = "not an option a run keeps (give it on the command line)",
                                 .within = out,
                                 .inside = cli_tb ? NULL : tb_inside,
                                 .flags = CONFIG_CONTROL},
                        cspec = {.opts = options,
                                 .aliases = litgpt_keys,
                                 .dialect = "LitGPT",
                                 .skip = not_config,
                                 .skip_why = "a configuration file cannot name another"};
    config_args_t ka = {0}, ca = {0};
    if ((kept[0] && config_load(kept, &kspec, &ka) < 0) || (cfg && config_load(cfg, &cspec, &ca) < 0)) {
        if (rank == 0)
            ftk_error("%s", ftk_err_msg());
        config_args_free(&ka);
        return FTK_EXIT_USAGE;
    }
    for (int i = 0; i < ca.n_notes && rank == 0; i++)
        ftk_warn("%s", ca.notes[i]);
    int n = *argc + ka.n_words + ca.n_words, k = 0;
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (!v) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    v[k++] = (*argv)[0];
    for (int i = 0; i < ka.n_words; i++)
        v[k++] = ka.words[i];
    for (int i = 0; i < ca.n_words; i++)
        v[k++] = ca.words[i];
    for (int i = 1; i < *argc; i++)
        v[k++] = (*argv)[i];
    v[k] = NULL;
    kept_words[0] = ka.words;
    kept_words[1] = ca.words;
    for (int i = 0; i < ca.n_notes; i++)
        free(ca.notes[i]);
    free(ka.notes);
    free(ca.notes);
    kept_argv = v;
    if (kept[0] && rank == 0)
        ftk_info("options of the run from %s (the command line overrides them)", kept);
    *argc = k;
    *argv = v;
    return 0;
}

/* OUT/options.yaml: the options this run resolved (rank 0, after the resume). */
static int keep_options(void)
{
    buf_t b = {0};
    char path[4096], cwd[4096], m_abs[8192], d_abs[8192], t_rel[8192], run_r[PATH_MAX], tb_r[PATH_MAX];
    snprintf(path, sizeof path, "%.*s/options.yaml", path_dir_len(out_dir), out_dir);
    /* the inputs by absolute path: a resume may start in another directory; --tensorboard
     * relative to the run where it is inside it (a resume reads it so, and refuses what
     * leaves the run unless its command line names it), else absolute */
    const char *m0 = model_path, *d0 = data_path, *t0 = tensorboard_dir;
    if (getcwd(cwd, sizeof cwd)) {
        if (model_path && model_path[0] != '/')
            snprintf(m_abs, sizeof m_abs, "%s/%s", cwd, model_path), model_path = m_abs;
        if (data_path && data_path[0] != '/')
            snprintf(d_abs, sizeof d_abs, "%s/%s", cwd, data_path), data_path = d_abs;
    }
    if (tensorboard_dir && realpath(out_dir, run_r) && realpath(tensorboard_dir, tb_r)) {
        int n = path_under(tb_r, run_r);
        if (n >= 0)
            snprintf(t_rel, sizeof t_rel, "%s", tb_r[n] && tb_r[n + 1] ? tb_r + n + 1 : "."), tensorboard_dir = t_rel;
        else
            tensorboard_dir = tb_r;
    }
    int rc = config_write(&b, options, not_kept,
                          "# ftk-train's options for this run (ftk-train --resume auto -o RUN reads them; the command\n"
                          "# line overrides them). Written at each start.\n");
    model_path = m0;
    data_path = d0;
    tensorboard_dir = t0;
    if (rc == 0)
        rc = atomic_write_file(path, b.data, b.len);
    buf_free(&b);
    return rc;
}

static int run(int argc, char **argv)
{
    int xrc = expand_args(&argc, &argv);
    if (xrc)
        return xrc;
    int prc = parse_args(argc, argv);
    if (!same_args(argc, argv)) {
        if (rank == 0)
            ftk_error("the %d ranks were started with different arguments; give every rank the same command line",
                      nranks);
        return FTK_EXIT_USAGE;
    }
    if (prc)
        return prc > 0 ? FTK_EXIT_OK : FTK_EXIT_USAGE;
    if (rank != 0)
        ftk_quiet = 1; /* progress and notes from rank 0 only */
    apply_recipe(argc, argv);
    if (!device)
        device = default_device();
    trainer_opts_t o = {0};
    int code = check_values(&o);
    /* The same device on every rank: the command lines are the same, but FTK_DEVICE may not
     * be, and the device's set-up is collective (comm_node_gpu, NCCL). Said before any
     * other refusal: it is the cause of those that follow from it. Which device, not its
     * name: a name that is no device keeps check_values' refusal. */
    int dev = backend_device_index(device), dev0 = dev;
    if (comm_bcast(world, &dev0, sizeof dev0, 0) < 0)
        code = bad("%s", ftk_err_msg());
    else if (dev >= 0 && dev0 >= 0 && dev != dev0)
        code = bad("--device %s on this rank, %s on rank 0: give every rank the same FTK_DEVICE (or --device)", device,
                   backend_devices[dev0]);
    if ((code = agree_msg(code, why)))
        return code;
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    if (h5_init() < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    if (plan)
        return rank == 0 ? run_plan(&o) : 0;

    /* The backend before anything is written: a missing GPU leaves no run directory.
     * static: reachable until exit on every path (LeakSanitizer). */
    static backend_t *be;
    if (!strcmp(device, "cuda")) {
        int gpu = comm_node_gpu(world, backend_cuda_devices());
        be = gpu < 0 ? NULL : backend_cuda_new(gpu);
    } else {
        be = backend_cpu_new();
    }
    char msg[8192];
    snprintf(msg, sizeof msg, "--device %s: %s", device, be ? "" : ftk_err_msg());
    if ((code = agree_msg(be ? 0 : FTK_EXIT_USAGE, msg))) {
        backend_free(be);
        return code;
    }
    /* GPU ranks: the tensor collectives through NCCL (control traffic stays on MPI); every
     * rank gets the same verdict, the message naming the rank that failed. Under mpirun
     * even one rank: MPI would be handed device memory. Alone, a process is a world of one
     * whose collectives copy through the backend (comm_enable_nccl leaves it as it is). */
    if (!strcmp(device, "cuda") && comm_enable_nccl(world, be) < 0) {
        ftk_err_prefix("--device cuda: ");
        backend_free(be);
        return report(FTK_EXIT_FAIL);
    }

    /* a stop asked for during the start-up: nothing is written yet */
    if (stop_agreed()) {
        backend_free(be);
        return stopped_before(-1);
    }

    /* FTK_PROFILE: rank 0's op times (kernels/prof.h); the path checked now, so one that
     * cannot be written fails before the run, not after it */
    int prof_on = 0;
    const char *prof = getenv("FTK_PROFILE");
    double prof_t0 = 0; /* when the timed part began */
    msg[0] = 0;
    if (prof && *prof && rank == 0) { /* "-": stderr; else written at the end, replacing (output.h) */
        if (strcmp(prof, "-") && output_check(prof, OUTPUT_FORCE) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE=%s", ftk_err_msg());
        else if (bk_prof_attach(be) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE: %s", ftk_err_msg());
        else
            prof_on = 1;
    }
    if ((code = agree_msg(msg[0] ? FTK_EXIT_USAGE : 0, msg))) {
        backend_free(be);
        return code;
    }

    FILE *mf = NULL;
    report_t *rep = NULL;
    buf_t step_json = {0};
    trainer_t *t = trainer_new(world, be, &o, &code);
    if (!t) {
        backend_free(be);
        return report(code);
    }
    int discard = 0; /* a new run that stops before its first step is removed, as a failed one is */
    if ((code = report(trainer_resume(t))))
        goto out;
    const ckpt_meta_t *meta = trainer_meta(t);
    if (!trainer_done(t) && stop_agreed()) {
        code = stopped_before(meta->step);
        discard = 1;
        goto out;
    }
    double elapsed0 = 0; /* the history's elapsed_s at the resumed step (rank 0) */
    snprintf(metrics_path, sizeof metrics_path, "%.*s/metrics.jsonl", path_dir_len(out_dir), out_dir);
    msg[0] = 0;
    code = 0;
    /* The history this process continues: up to its checkpoint's step, or none at all from
     * step 0 (a run killed before its first checkpoint starts again, step 0's validation
     * included). */
    int64_t kept = meta->step > 0 ? meta->step : -1;
    if (rank == 0) {
        /* The TensorBoard files are trimmed like metrics.jsonl when there is a history to
         * continue; a new run leaves the directory's files as they are (its START record,
         * which has TensorBoard drop what it shows from that step on, is omitted too). */
        int history = trim_metrics(metrics_path, kept, &elapsed0);
        if (history < 0)
            code = errno == ELOOP || errno == EINVAL || errno == EFBIG ? FTK_EXIT_USAGE : FTK_EXIT_FAIL,
            snprintf(msg, sizeof msg, "%s", ftk_err_msg());
        else if (!(mf = fopen(metrics_path, "a")))
            code = FTK_EXIT_FAIL, snprintf(msg, sizeof msg, "%s: %s", metrics_path, strerror(errno));
        else if (tensorboard_dir && history && tfevents_trim(tensorboard_dir, kept) < 0)
            code = errno == EFBIG ? FTK_EXIT_USAGE : FTK_EXIT_FAIL,
            snprintf(msg, sizeof msg, "--tensorboard %s", ftk_err_msg());
        else if (tensorboard_dir && !(tb = tfevents_open(tensorboard_dir, history ? kept + 1 : -1)))
            code = FTK_EXIT_FAIL, snprintf(msg, sizeof msg, "--tensorboard %s", ftk_err_msg());
        else if (keep_options() < 0)
            code = FTK_EXIT_FAIL, snprintf(msg, sizeof msg, "%s", ftk_err_msg());
        if (!code && trainer_extended(t)[0]) {
            char now[32];
            ftk_warn("--extend: %s; from step %lld on, the run is no longer bit-exact with an uninterrupted one",
                     trainer_extended(t), (long long)meta->step);
            fprintf(mf, "{\"kind\": \"extend\", \"step\": %lld, \"changed\": ", (long long)meta->step);
            buf_t j = {0};
            json_write_string(&j, trainer_extended(t), strlen(trainer_extended(t)));
            fprintf(mf, "%s, \"bit_exact\": false, \"time\": \"%s\"}\n", j.data ? j.data : "\"\"", iso_now(now));
            buf_free(&j);
            metrics_flush(mf);
        }
    }
    if ((code = agree_msg(code, msg)))
        goto out;
    snprintf(msg, sizeof msg, "%s", watchdog_start() < 0 ? ftk_err_msg() : "");
    if ((code = agree_msg(*msg ? FTK_EXIT_FAIL : 0, msg)))
        goto out;
    /* where the steps' time and bytes go (engine/report.h): every rank counts its own */
    char header[8192];
    char cz[96] = ""; /* the bytes of a compressed run are not those of its settings' formulas alone */
    if (o.compress_weights || o.compress_grads)
        snprintf(cz, sizeof cz, ", --compress-weights %s, --compress-grads %s",
                 compress_weights_name(o.compress_weights), compress_grads_name(o.compress_grads));
    snprintf(header, sizeof header,
             "`ftk-train` run `%s`: precision %s, device %s, global batch %lld, micro-batch %lld%s.", out_dir,
             meta->precision, device, (long long)meta->train.global_batch, (long long)meta->train.micro_batch, cz);
    rep = report_new(world, trainer_shard(t), o.strategy, o.precision, &meta->train, header);
    snprintf(msg, sizeof msg, "%s", rep ? "" : ftk_err_msg());
    if ((code = agree_msg(rep ? 0 : FTK_EXIT_FAIL, msg)))
        goto out;
    if (meta->step == 0)
        ftk_info("%lld parameters, %lld training row%s (%lld step%s of %lld row%s per epoch), %lld step%s on %d rank%s "
                 "(strategy %s, %lld shard%s, precision %s, device %s)",
                 (long long)trainer_n_params(t), (long long)trainer_rows(t), plural_s(trainer_rows(t)),
                 (long long)trainer_steps_per_epoch(t), plural_s(trainer_steps_per_epoch(t)), (long long)global_batch,
                 plural_s(global_batch), (long long)meta->train.total_steps, plural_s(meta->train.total_steps), nranks,
                 plural_s(nranks), meta->strategy, (long long)meta->shard_count, plural_s(meta->shard_count),
                 meta->precision, device);
    if (trainer_done(t))
        ftk_info("%s: the run is complete (step %lld of %lld); nothing to do", out_dir, (long long)meta->step,
                 (long long)meta->train.total_steps);
    else if (rank == 0 && meta->train.warmup >= meta->train.total_steps)
        ftk_warn("--warmup %lld is not shorter than the run's %lld step%s: the learning rate rises for the whole run "
                 "and never decays",
                 (long long)meta->train.warmup, (long long)meta->train.total_steps,
                 plural_s(meta->train.total_steps));
    if (meta->step == 0 && eval_every > 0 && trainer_val_rows(t) > 0 && (code = evaluate(t, mf, 0)))
        goto out;
    if (!trainer_done(t) && stop_agreed()) {
        code = stopped_before(meta->step);
        discard = 1;
        goto out;
    }
    beat();
    double t0 = time_now(), last_save = t0;
    prof_t0 = t0;
    int64_t run_steps = 0;
    while (!trainer_done(t)) {
        double ts = time_now();
        trainer_step_t st;
        int clock_due = save_minutes > 0 && time_now() - last_save >= 60 * save_minutes;
        code = report(trainer_step(t, &stop_signal, clock_due, &st));
        beat();
        metrics_ckpts(t, mf);
        if (code)
            goto out;
        run_steps++;
        if (prof_on && run_steps == 1 && !trainer_done(t)) { /* the first step warms up */
            bk_prof_reset(be);
            prof_t0 = time_now();
        }
        double now = time_now();
        step_json.len = 0;
        if (report_step(rep, &st, now - ts, mf ? &step_json : NULL) < 0)
            metrics_fail(ENOMEM);
        bk_mem_sample(be); /* the step's end: what the device holds now, scratch growth included */
        if (mf)
            metrics_step(mf, &st, now - ts, elapsed0 + now - t0, be, step_json.data);
        if ((code = agree_msg(metrics_err[0] ? FTK_EXIT_FAIL : 0, metrics_err)))
            goto out;
        if (!ftk_quiet) {
            /* the end estimated from this process's own steps so far (a resume's first steps
             * included), not from the history's, which another machine may have made */
            char eta[32];
            double left = (double)(st.total_steps - st.step) * (now - t0) / (double)run_steps;
            if (left >= 3600)
                snprintf(eta, sizeof eta, "%dh%02dm", (int)(left / 3600), (int)(left / 60) % 60);
            else
                snprintf(eta, sizeof eta, "%dm%02ds", (int)(left / 60), (int)left % 60);
            ftk_info("step %lld/%lld (%.0f%%)  loss %.4f  lr %.3g  grad norm %.3g  %.0f tok/s  comm wait %.2f s  "
                     "%.1f s  ETA %s",
                     (long long)st.step, (long long)st.total_steps, 100.0 * (double)st.step / (double)st.total_steps,
                     st.loss, st.lr, st.grad_norm, st.tokens / (now - ts), st.comm.wait_s, elapsed0 + now - t0, eta);
        }
        metrics_stderr_lost(mf, st.step);
        fault_point("train.step-end");
        int last = trainer_done(t);
        if (eval_every > 0 && trainer_val_rows(t) > 0 && (st.step % eval_every == 0 || last) &&
            (code = evaluate(t, mf, st.step)))
            goto out;
        beat();
        int stopping = st.stop || (stop_after > 0 && run_steps >= stop_after && !last);
        if (no_save && stopping) {
            ftk_info("stopped by a signal at step %lld; --no-save: no checkpoint, nothing to resume",
                     (long long)st.step);
            code = FTK_EXIT_PREEMPTED;
            break;
        }
        if (!no_save && (last || stopping || st.save_due || (save_every > 0 && st.step % save_every == 0))) {
            /* The last checkpoint of this process is synchronous: it is what the exit
             * status promises (it first waits for the one in flight). */
            int bg = async_save && !last && !stopping;
            code = report(bg ? trainer_save_async(t) : trainer_save(t));
            beat();
            metrics_ckpts(t, mf);
            if (code)
                goto out;
            last_save = time_now();
            if (bg)
                ftk_info("checkpoint %s/step-%08lld: state copied, written in the background", out_dir,
                         (long long)st.step);
        }
        if (stopping && !last) {
            ftk_info("%s at step %lld; continue with --resume auto", st.stop ? "stopped by a signal" : "stopped",
                     (long long)st.step);
            code = FTK_EXIT_PREEMPTED;
            break;
        }
    }
out:
    beat(); /* the end, too, gets its S seconds (a peer gone hangs MPI_Finalize as well) */
    /* the report of the steps this process ran (collective: code is agreed on every path here) */
    if (rep && report_path && (code == 0 || code == FTK_EXIT_PREEMPTED)) {
        int rc = report_write(rep, world, report_path);
        snprintf(msg, sizeof msg, "%s", rc < 0 ? ftk_err_msg() : "");
        if (rc > 0)
            ftk_warn("--report %s: no step ran in this process; nothing written", report_path);
        else if (agree_msg(rc < 0 ? FTK_EXIT_FAIL : 0, msg) && code == 0)
            code = FTK_EXIT_FAIL;
        else if (rc == 0)
            ftk_info("report: %s", report_path);
    }
    report_free(rep);
    buf_free(&step_json);
    if (mf)
        fclose(mf);
    /* a run that leaves nothing behind leaves no TensorBoard file either (its steps are gone) */
    int discarded = ((code && code != FTK_EXIT_PREEMPTED) || discard) && trainer_discard_new_run(t);
    if ((discarded ? tfevents_discard(tb) : tfevents_close(tb)) < 0)
        ftk_warn("--tensorboard %s", ftk_err_msg());
    tb = NULL;
    if (prof_on) {
        double wall = time_now() - prof_t0;
        output_t po;
        FILE *pf;
        int prc;
        if (!strcmp(prof, "-"))
            prc = bk_prof_write(be, stderr, wall);
        else if ((prc = output_begin(&po, prof, OUTPUT_FORCE)) == 0) {
            if (!(pf = output_stream(&po)) || bk_prof_write(be, pf, wall) < 0) {
                output_abort(&po);
                prc = -1;
            } else
                prc = output_commit(&po);
        }
        if (prc < 0)
            ftk_warn("FTK_PROFILE: %s", ftk_err_msg());
    }
    trainer_free(t);
    backend_free(be);
    return code;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-train");
    /* The stop signals are held since before any library's constructor ran
     * (hold_stop_signals): a preemption at start-up is a request to stop, neither death nor
     * lost. */
    if (fault_point("train.start") < 0)
        return FTK_EXIT_FAIL;
    under_ompi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    stop_action.sa_handler = on_stop;
    stop_action.sa_mask = stop_set;
    sigaction(SIGTERM, &stop_action, NULL);
    sigaction(SIGINT, &stop_action, NULL);
    sigaction(SIGHUP, &stop_action, NULL);
    sigaction(SIGUSR1, &stop_action, NULL);
    /* A closed stdout or stderr (`ftk-train … 2>&1 | head`) does not end a run: a write to
     * it fails (EPIPE) instead, and the metrics go on (log.h ftk_stderr_errno()). */
    signal(SIGPIPE, SIG_IGN);
    atexit(ftk_stderr_restore);
    sigprocmask(SIG_UNBLOCK, &stop_set, NULL);
    world = comm_init(&argc, &argv);
    if (!world) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    rank = comm_rank(world);
    nranks = comm_size(world);
    /* srun without a PMI plugin starts N processes that each see a world of one: N copies
     * of the same run racing for one run directory */
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (nranks == 1 && tasks && atoi(tasks) > 1) {
        ftk_error("SLURM started %d tasks but MPI sees a world of one in each: run srun --mpi=pmix (or pmi2; "
                  "`srun --mpi=list` shows what the cluster has)",
                  atoi(tasks));
        comm_finalize(world);
        return FTK_EXIT_USAGE;
    }
    int rc = run(argc, argv);
    comm_finalize(world);
    return rc;
}
