/* ftk-train — full-parameter finetuning, one process or many (mpirun/srun): options,
 * signals and messages around the training run (engine/job.h), and the memory plan
 * (--plan, engine/plan_print.h). */
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
#include "../engine/job.h"
#include "../engine/plan.h"
#include "../engine/plan_print.h"
#include "../engine/train_args.h"
#include "../engine/trainer.h"
#include "../formats/h5.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/fault.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/path.h"

/* device: NULL until given or resolved (configure; device_from_env: it took FTK_DEVICE) */
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
static int64_t plan_max_len, memory_every = -1;
static const char *memory_dir;
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
    {"memory-snapshot-every", 0, OPT_I64, &memory_every, "N",
     "every N steps, each rank's state into its node's memory and a partner node's: a lost node costs N steps, "
     "--resume auto reads it back (default 1 on several ranks, else 0: off; docs/checkpoints.md)", "0.."},
    {"memory-dir", 0, OPT_STR, &memory_dir, "DIR", "the node's memory for them (default $FTK_MEMORY_DIR, else /dev/shm)"},
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
        "Memory snapshots (docs/checkpoints.md): after every --memory-snapshot-every step each rank's state\n"
        "goes into its node's memory (--memory-dir) and a partner rank's one node on, overlapped with the next\n"
        "step; --resume auto after a lost node reads the newest complete one (fetching what a replaced node\n"
        "lacks from the partners) where it is as new as the disk's; a normal end removes them.\n"
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
static double step_timeout_s; /* FTK_STEP_TIMEOUT (engine/job.h); 0: none */

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
static const int stop_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
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
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaddset(&stop_set, stop_signals[i]);
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
    strategy_words_t sw = {.strategy = strategy_arg, .units = units_arg, .compress_weights = compress_weights_arg,
                           .compress_grads = compress_grads_arg, .precision = precision_arg,
                           .group_size = group_size, .node_size = node_size};
    strategy_choice_t sc;
    if (strategy_choose(&sw, &sc) < 0)
        return bad("%s", ftk_err_msg());
    o->strategy = sc.strategy, o->units = sc.units, o->precision = sc.precision, o->group_size = sc.group_size;
    o->compress_weights = sc.compress_weights, o->compress_grads = sc.compress_grads;
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
    o->snapshot_every = memory_every >= 0 ? memory_every : comm_size(world) > 1 && !no_save;
    o->memory_dir = memory_dir ? memory_dir : getenv("FTK_MEMORY_DIR") ? getenv("FTK_MEMORY_DIR") : "/dev/shm";
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
    char why_not[4096];
    if (plan_table_run(&rq, stdout, why_not, sizeof why_not) == 0)
        return FTK_EXIT_OK;
    ftk_error("%s", why_not);
    return FTK_EXIT_USAGE;
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
    int prc = train_args_parse(&spec, rank != 0, argc, argv);
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
    train_args_recipe(options, argc, argv, rank == 0);
    /* --device when not given (docs/design.md, "Devices"): ranks under a launcher (whose GPU
     * path is NCCL's, even one rank's) default to cpu until NCCL has run on GPUs (the
     * README's GPU section): they say --device cuda (or FTK_DEVICE=cuda) to use it. */
    if (!device)
        device = backend_default_device(comm_alone(world) ? cuda_load_devices : NULL, &device_from_env);
    int code = check_values(o);
    /* The same device on every rank (engine/job.h), said before any other refusal: it is the
     * cause of those that follow from it; a name that is no device keeps check_values'. */
    if (job_same_device(world, device) < 0)
        code = bad("%s", ftk_err_msg());
    if ((code = job_agree(world, code, why)))
        return code;
    opts_start_threads(threads); /* a team that cannot be made fails now, before any output */
    if (h5_init() < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_FAIL;
    }
    return -1;
}

/* Writes RUN/options.yaml (engine/train_args.h): the table's variables as they stand. */
static int keep_options(void)
{
    return train_args_keep(options, out_dir, &model_path, &data_path, &tensorboard_dir);
}

static int run(int argc, char **argv)
{
    /* static: the backend and the trainer reachable until exit on every path (LeakSanitizer) */
    static job_t j;
    int code = configure(argc, argv, &j.o);
    if (code >= 0)
        return code;
    if (plan)
        return rank == 0 ? run_plan(&j.o) : 0;
    j.world = world, j.device = device, j.tensorboard_dir = tensorboard_dir, j.report_path = report_path;
    j.save_every = save_every, j.save_minutes = save_minutes, j.no_save = no_save, j.async_save = async_save;
    j.eval_every = eval_every, j.stop_after = stop_after, j.step_timeout_s = step_timeout_s;
    j.stop_signal = &stop_signal, j.stop_agreed = stop_agreed, j.stopped_before = stopped_before;
    j.keep_options = keep_options;
    return job_run(&j);
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-train");
    /* The stop signals are held since before any library's constructor ran (hold_stop_signals):
     * a preemption at start-up is a request to stop, neither death nor lost. */
    if (fault_point("train.start") < 0)
        return FTK_EXIT_FAIL;
    under_ompi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    stop_action.sa_handler = on_stop;
    stop_action.sa_mask = stop_set;
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaction(stop_signals[i], &stop_action, NULL);
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
    int rc = FTK_EXIT_USAGE;
    if (job_check_launch(world) < 0)
        ftk_error("%s", ftk_err_msg());
    else
        rc = run(argc, argv);
    comm_finalize(world);
    return rc;
}
