/* ftk-train — full-parameter finetuning, one process or many (mpirun/srun): options,
 * signals and messages around the training job (engine/trainer.h; its metrics:
 * formats/metrics.h), and the memory plan (--plan, engine/plan_print.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/comm.h"
#include "../engine/compress.h"
#include "../engine/cuda_load.h"
#include "../engine/plan.h"
#include "../engine/plan_print.h"
#include "../engine/report.h"
#include "../engine/train_args.h"
#include "../engine/trainer.h"
#include "../formats/h5.h"
#include "../formats/metrics.h"
#include "../kernels/prof.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/path.h"
#include "../libcommon/plural.h"
#include "../libcommon/timer.h"
#include "../libcommon/watchdog.h"

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

/* metrics.jsonl and --tensorboard DIR (formats/metrics.h): written by rank 0; any rank may
 * record an error, which the run reports at the next step's end: a full disk stops the run
 * rather than losing its metrics silently. */
static metrics_writer_t mw;

/* The first write error of the metrics, as the run reports it ("" while none). */
static const char *metrics_failure(void)
{
    static char m[sizeof mw.err + 16];
    snprintf(m, sizeof m, "%s%s", mw.err_sink == METRICS_SINK_EVENTS ? "--tensorboard " : "", mw.err);
    return m;
}

/* The checkpoints committed since the last call: a metrics line and a note each. */
static void metrics_ckpts(trainer_t *t)
{
    trainer_ckpt_t r[8];
    int n = trainer_ckpt_reports(t, r, 8);
    for (int i = 0; i < n; i++) {
        metrics_write_checkpoint(&mw, &(metrics_ckpt_rec_t){.step = r[i].step, .bytes = r[i].bytes, .async = r[i].async,
                                                            .stall_s = r[i].stall_s, .write_s = r[i].write_s});
        ftk_info("checkpoint %s/step-%08lld committed (%s; training blocked %.2f s, write %.2f s, %.1f MB)", out_dir,
                 (long long)r[i].step, r[i].async ? "written in the background" : "synchronous", r[i].stall_s,
                 r[i].write_s, (double)r[i].bytes / 1e6);
    }
}

/* The step's metrics line (rank 0), with the report's figures (every rank counts them). */
static void metrics_step(report_t *rep, buf_t *step_json, const trainer_step_t *s, double dt, double elapsed,
                         backend_t *be)
{
    step_json->len = 0;
    if (report_step(rep, s, dt, mw.f ? step_json : NULL) < 0)
        metrics_writer_fail(&mw, ENOMEM);
    bk_mem_sample(be); /* the step's end: what the device holds now, scratch growth included */
    if (!mw.f)
        return;
    const bk_mem_t *mem = bk_mem(be);
    metrics_step_rec_t r = {
        .step = s->step, .tokens = s->tokens, .tokens_seen = s->tokens_seen, .epoch = s->epoch,
        .micro_batches = s->micro_batches, .loss = s->loss, .lr = s->lr, .grad_norm = s->grad_norm,
        .tokens_per_s = s->tokens / dt, .elapsed_s = elapsed, .ranks = nranks, .allgather_bytes = s->comm.ag_bytes,
        .reduce_scatter_bytes = s->comm.rs_bytes, .allreduce_bytes = s->comm.ar_bytes, .wait_s = s->comm.wait_s,
        .mem_peak = mem->peak,
        /* the device's pages, and what the device measured in use (0, -1: not measured) */
        .device_mem = be->mem_pages != 0, .mem_device_peak = mem->dev_peak, .mem_device_used = mem->used_peak,
        .mem_device_other = mem->used_other};
    metrics_write_step(&mw, &r, step_json->data);
}

static int evaluate(trainer_t *t, int64_t step)
{
    int64_t vt;
    double vl;
    int code = trainer_evaluate(t, &vl, &vt);
    if (code)
        return report(code);
    metrics_write_eval(&mw, step, vl, vt);
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

/* --strategy and the options that must fit it (strategy_check), into o: each checked as soon
 * as it is parsed, so that of two faults the first in this order is the one told. */
static int check_strategy(trainer_opts_t *o)
{
    if (strategy_parse(strategy_arg, &o->strategy) < 0)
        return bad("--strategy %s: need full, grad-op, none, hybrid or hpz", strategy_arg);
    strategy_use_t use = strategy_use(o->strategy);
    use.group_size = group_size;
    use.node_size = node_size;
    if (strategy_check(&use) < 0)
        return bad("%s", ftk_err_msg());
    if (units_parse(units_arg, &o->units) < 0)
        return bad("--units %s: %s", units_arg, ftk_err_msg());
    use.units = &o->units;
    use.units_text = units_arg;
    if (strategy_check(&use) < 0)
        return bad("%s", ftk_err_msg());
    if (compress_parse_weights(compress_weights_arg, &o->compress_weights) < 0 ||
        compress_parse_grads(compress_grads_arg, &o->compress_grads) < 0)
        return bad("%s", ftk_err_msg());
    use.compress_weights = o->compress_weights;
    use.compress_grads = o->compress_grads;
    if (strategy_check(&use) < 0)
        return bad("%s", ftk_err_msg());
    if (precision_parse(precision_arg, &o->precision) < 0)
        return bad("--precision %s: need fp32, bf16-mixed or bf16-true", precision_arg);
    use.precision = o->precision;
    if (strategy_check(&use) < 0)
        return bad("%s", ftk_err_msg());
    o->group_size = strategy_traits(o->strategy)->node_copy ? node_size : group_size;
    return 0;
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
    int code = check_strategy(o);
    if (code)
        return code;
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

/* Rank 0's table on stdout (engine/plan_print.h); --recompute auto with no level that
 * fits is refused after it. */
static int run_plan(const trainer_opts_t *o)
{
    plan_request_t rq = {.o = *o, .preset = preset, .model_path = model_path, .data_path = data_path,
                         .max_len = plan_max_len, .ranks = plan_ranks, .device = device,
                         .strategy_name = strategy_arg, .precision_name = precision_arg};
    plan_table_t tab;
    char why_not[4096];
    if (plan_table_make(&rq, &tab) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    plan_table_print(stdout, &tab);
    if (plan_table_refusal(&tab, why_not, sizeof why_not)) {
        fflush(stdout);
        ftk_error("%s", why_not);
        return FTK_EXIT_USAGE;
    }
    return FTK_EXIT_OK;
}

/* ---- the hang watchdog (FTK_STEP_TIMEOUT) ------------------------------------------------------ */

/* FTK_STEP_TIMEOUT=S (docs/design.md, "Hangs"): the process ends (exit 1) when the training
 * loop has finished nothing — a step, an evaluation, a checkpoint — for S seconds
 * (libcommon/watchdog.h). A rank stopped or stuck, a node gone without an error, a
 * collective that never completes would otherwise hold every rank until the job's time
 * limit; one rank's exit makes the launcher end the others, and the job starts again with
 * --resume auto (the committed checkpoints survive a kill at any instant). 0 (the
 * default): no watchdog. */
static void on_hang(void *unused)
{
    (void)unused;
    char m[512];
    snprintf(m, sizeof m,
             "ftk-train: error: rank %d: nothing finished for %g s (FTK_STEP_TIMEOUT): a rank is stopped, stuck or "
             "gone, or a collective never completes; exiting so that the job can be started again with --resume "
             "auto\n",
             rank, step_timeout_s);
    /* write(2), not stdio: the stuck main thread may hold stderr's lock */
    ssize_t w = write(STDERR_FILENO, m, strlen(m));
    (void)w; /* nothing more to do if stderr is gone */
    _exit(FTK_EXIT_FAIL);
}

/* Arms the watchdog (from the loop's start to the process's end), if FTK_STEP_TIMEOUT asks;
 * every rank agrees. */
static int arm_watchdog(void)
{
    char msg[2048] = "";
    if (step_timeout_s > 0 && watchdog_start(step_timeout_s, on_hang, NULL) < 0)
        snprintf(msg, sizeof msg, "FTK_STEP_TIMEOUT: %s", ftk_err_msg());
    return agree_msg(*msg ? FTK_EXIT_FAIL : 0, msg);
}

/* ---- the run --------------------------------------------------------------------------------- */

/* --device when not given (docs/design.md, "Devices"): FTK_DEVICE, else cuda for a process
 * started alone that sees a GPU, else cpu. Ranks under a launcher (whose GPU path is NCCL's,
 * even one rank's) default to cpu until NCCL has run on GPUs (the README's GPU section):
 * they say --device cuda (or FTK_DEVICE=cuda) to use it. */
static const char *default_device(void)
{
    return backend_default_device(comm_alone(world) ? cuda_load_devices : NULL, &device_from_env);
}

/* The argument list with the run's kept options or --config's before the command line
 * (engine/train_args.h). Returns 0, or exit 2 after rank 0 said why (1: out of memory). */
static int expand_args(int *argc, char ***argv)
{
    train_args_t ta;
    int code = train_args_expand(options, argc, argv, &ta);
    for (int i = 0; i < ta.n_notes && rank == 0; i++)
        ftk_warn("%s", ta.notes[i]);
    if (code && (rank == 0 || code != FTK_EXIT_USAGE))
        ftk_error("%s", ftk_err_msg());
    else if (!code && ta.kept[0] && rank == 0)
        ftk_info("options of the run from %s (the command line overrides them)", ta.kept);
    train_args_free(&ta);
    return code;
}

/* The options, parsed and checked on every rank, into o. Returns -1 to go on, or the exit
 * status (0: --help or --version). */
static int configure(int argc, char **argv, trainer_opts_t *o)
{
    int xrc = expand_args(&argc, &argv);
    if (xrc)
        return xrc;
    int prc = parse_args(argc, argv);
    if (!train_args_same(world, argc, argv)) {
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
    int code = check_values(o);
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
    return -1;
}

/* What a training run of this process holds, from its backend to its end. */
typedef struct {
    trainer_opts_t o;
    backend_t *be;
    trainer_t *t;
    report_t *rep;
    buf_t step_json;  /* the report's members of a step's metrics line */
    const char *prof; /* FTK_PROFILE: where rank 0's op times go (prof_on) */
    int prof_on;
    double prof_t0;   /* when the timed part began */
    double elapsed0;  /* the history's elapsed_s at the resumed step (rank 0) */
    int discard;      /* a new run that stops before its first step is removed, as a failed one is */
} job_t;

/* The backend before anything is written: a missing GPU leaves no run directory. */
static int open_backend(job_t *j)
{
    if (!strcmp(device, "cuda")) {
        int gpu = comm_node_gpu(world, cuda_load_devices());
        j->be = gpu < 0 ? NULL : cuda_load_backend(gpu);
    } else {
        j->be = backend_cpu_new();
    }
    char msg[8192];
    snprintf(msg, sizeof msg, "--device %s: %s", device, j->be ? "" : ftk_err_msg());
    int code = agree_msg(j->be ? 0 : FTK_EXIT_USAGE, msg);
    /* GPU ranks: the tensor collectives through NCCL (control traffic stays on MPI); every
     * rank gets the same verdict, the message naming the rank that failed. Under mpirun
     * even one rank: MPI would be handed device memory. Alone, a process is a world of one
     * whose collectives copy through the backend (comm_enable_nccl leaves it as it is). */
    if (!code && !strcmp(device, "cuda") && comm_enable_nccl(world, j->be) < 0) {
        ftk_err_prefix("--device cuda: ");
        backend_free(j->be);
        j->be = NULL;
        code = report(FTK_EXIT_FAIL);
    }
    return code;
}

/* FTK_PROFILE: rank 0's op times (kernels/prof.h); the path checked now, so one that
 * cannot be written fails before the run, not after it */
static int profile_begin(job_t *j)
{
    char msg[8192] = "";
    j->prof = getenv("FTK_PROFILE");
    if (j->prof && *j->prof && rank == 0) { /* "-": stderr; else written at the end, replacing (output.h) */
        if (strcmp(j->prof, "-") && output_check(j->prof, OUTPUT_FORCE) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE=%s", ftk_err_msg());
        else if (bk_prof_attach(j->be) < 0)
            snprintf(msg, sizeof msg, "FTK_PROFILE: %s", ftk_err_msg());
        else
            j->prof_on = 1;
    }
    return agree_msg(msg[0] ? FTK_EXIT_USAGE : 0, msg);
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
    snprintf(path, sizeof path, "%.*s/metrics.jsonl", path_dir_len(out_dir), out_dir);
    metrics_writer_init(&mw, path);
    /* The history this process continues: up to its checkpoint's step, or none at all from
     * step 0 (a run killed before its first checkpoint starts again, step 0's validation
     * included). */
    int64_t kept = meta->step > 0 ? meta->step : -1;
    if (rank == 0) {
        int refused;
        if (metrics_writer_open(&mw, kept, tensorboard_dir, &j->elapsed0, &refused) < 0)
            code = refused ? FTK_EXIT_USAGE : FTK_EXIT_FAIL,
            snprintf(msg, sizeof msg, "%s%s", mw.err_sink == METRICS_SINK_EVENTS ? "--tensorboard " : "",
                     ftk_err_msg());
        else if (train_args_keep(options, out_dir, &model_path, &data_path, &tensorboard_dir) < 0)
            code = FTK_EXIT_FAIL, snprintf(msg, sizeof msg, "%s", ftk_err_msg());
        if (!code && trainer_extended(j->t)[0]) {
            ftk_warn("--extend: %s; from step %lld on, the run is no longer bit-exact with an uninterrupted one",
                     trainer_extended(j->t), (long long)meta->step);
            metrics_write_extend(&mw, meta->step, trainer_extended(j->t));
        }
    }
    return agree_msg(code, msg);
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
             "`ftk-train` run `%s`: precision %s, device %s, global batch %lld, micro-batch %lld%s.", out_dir,
             meta->precision, device, (long long)meta->train.global_batch, (long long)meta->train.micro_batch, cz);
    j->rep = report_new(world, trainer_shard(j->t), j->o.strategy, j->o.precision, &meta->train, header);
    snprintf(msg, sizeof msg, "%s", j->rep ? "" : ftk_err_msg());
    return agree_msg(j->rep ? 0 : FTK_EXIT_FAIL, msg);
}

/* What the run is, where it stands, and what in its settings deserves a word. */
static void announce(const trainer_t *t, const ckpt_meta_t *meta)
{
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
}

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
    if (no_save || !(last || stopping || st->save_due || (save_every > 0 && st->step % save_every == 0)))
        return 0;
    int bg = async_save && !last && !stopping;
    int code = report(bg ? trainer_save_async(j->t) : trainer_save(j->t));
    watchdog_beat();
    metrics_ckpts(j->t);
    if (code)
        return code;
    *last_save = time_now();
    if (bg)
        ftk_info("checkpoint %s/step-%08lld: state copied, written in the background", out_dir, (long long)st->step);
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
        int clock_due = save_minutes > 0 && time_now() - last_save >= 60 * save_minutes;
        code = report(trainer_step(t, &stop_signal, clock_due, &st));
        watchdog_beat();
        metrics_ckpts(t);
        if (code)
            return code;
        run_steps++;
        if (j->prof_on && run_steps == 1 && !trainer_done(t)) { /* the first step warms up */
            bk_prof_reset(j->be);
            j->prof_t0 = time_now();
        }
        double now = time_now();
        metrics_step(j->rep, &j->step_json, &st, now - ts, j->elapsed0 + now - t0, j->be);
        if ((code = agree_msg(mw.err[0] ? FTK_EXIT_FAIL : 0, metrics_failure())))
            return code;
        say_step(&st, now - ts, j->elapsed0 + now - t0, now - t0, run_steps);
        metrics_write_stderr_lost(&mw, st.step);
        fault_point("train.step-end");
        int last = trainer_done(t);
        if (eval_every > 0 && trainer_val_rows(t) > 0 && (st.step % eval_every == 0 || last) &&
            (code = evaluate(t, st.step)))
            return code;
        watchdog_beat();
        int stopping = st.stop || (stop_after > 0 && run_steps >= stop_after && !last);
        if (no_save && stopping) {
            ftk_info("stopped by a signal at step %lld; --no-save: no checkpoint, nothing to resume",
                     (long long)st.step);
            return FTK_EXIT_PREEMPTED;
        }
        if ((code = save_due(j, &st, last, stopping, &last_save)))
            return code;
        if (stopping && !last) {
            ftk_info("%s at step %lld; continue with --resume auto", st.stop ? "stopped by a signal" : "stopped",
                     (long long)st.step);
            return FTK_EXIT_PREEMPTED;
        }
    }
    return code;
}

/* From the resume to the end of the steps. */
static int start_and_train(job_t *j)
{
    trainer_t *t = j->t;
    int code;
    if ((code = report(trainer_resume(t))))
        return code;
    const ckpt_meta_t *meta = trainer_meta(t);
    if (!trainer_done(t) && stop_agreed()) {
        j->discard = 1;
        return stopped_before(meta->step);
    }
    if ((code = open_outputs(j, meta)) || (code = arm_watchdog()) || (code = open_report(j, meta)))
        return code;
    announce(t, meta);
    if (meta->step == 0 && eval_every > 0 && trainer_val_rows(t) > 0 && (code = evaluate(t, 0)))
        return code;
    if (!trainer_done(t) && stop_agreed()) {
        j->discard = 1;
        return stopped_before(meta->step);
    }
    watchdog_beat();
    return train(j);
}

/* The end of every run that made its trainer: the report, the outputs closed (a run that
 * leaves nothing behind leaves no event file either), the profile. */
static int finish(job_t *j, int code)
{
    watchdog_beat(); /* the end, too, gets its S seconds (a peer gone hangs MPI_Finalize as well) */
    /* the report of the steps this process ran (collective: code is agreed on every path here) */
    if (j->rep && report_path && (code == 0 || code == FTK_EXIT_PREEMPTED)) {
        char msg[2048];
        int rc = report_write(j->rep, world, report_path);
        snprintf(msg, sizeof msg, "%s", rc < 0 ? ftk_err_msg() : "");
        if (rc > 0)
            ftk_warn("--report %s: no step ran in this process; nothing written", report_path);
        else if (agree_msg(rc < 0 ? FTK_EXIT_FAIL : 0, msg) && code == 0)
            code = FTK_EXIT_FAIL;
        else if (rc == 0)
            ftk_info("report: %s", report_path);
    }
    report_free(j->rep);
    buf_free(&j->step_json);
    metrics_writer_close(&mw);
    int discarded = ((code && code != FTK_EXIT_PREEMPTED) || j->discard) && trainer_discard_new_run(j->t);
    if (metrics_writer_close_events(&mw, discarded) < 0)
        ftk_warn("--tensorboard %s", ftk_err_msg());
    profile_end(j);
    trainer_free(j->t);
    backend_free(j->be);
    return code;
}

static int run(int argc, char **argv)
{
    /* static: the backend and the trainer reachable until exit on every path (LeakSanitizer) */
    static job_t job;
    job_t *j = &job;
    int code = configure(argc, argv, &j->o);
    if (code >= 0)
        return code;
    if (plan)
        return rank == 0 ? run_plan(&j->o) : 0;
    if ((code = open_backend(j)) == 0 && stop_agreed())
        code = stopped_before(-1); /* a stop asked for during the start-up: nothing is written yet */
    if (code || (code = profile_begin(j))) {
        backend_free(j->be);
        return code;
    }
    if (!(j->t = trainer_new(world, j->be, &j->o, &code))) {
        backend_free(j->be);
        return report(code);
    }
    return finish(j, start_and_train(j));
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
