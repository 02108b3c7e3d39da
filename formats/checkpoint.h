/* checkpoint.h — ftk's training checkpoint: a directory, a JSON manifest, shard files.
 *
 * ## On disk (ftk_format "checkpoint", version 1)
 *
 *   RUN/step-00000200/            one checkpoint (8-digit step)
 *     manifest.json               what is below, self-describing (never a link)
 *     config.json                 the model, as Hugging Face's config.json (hfconfig.h;
 *                                 never a link)
 *     shard-00001-of-0000S.h5     one file per shard (S = shard count)
 *   RUN/latest                    a one-line text file naming the newest committed
 *                                 checkpoint ("step-00000200\n"), replaced by rename;
 *                                 never a symbolic link (a reader refuses one)
 *   RUN/metrics.jsonl             the trainer's metrics (not part of a checkpoint)
 *   RUN/.lock                     the writers' lock (rundir.h: the run directory)
 *
 * A checkpoint is written under a hidden temporary name (".step-00000200.tmp.PID"), every
 * file fsynced, renamed into place, the run directory fsynced, then `latest` is replaced
 * (atomic.h), so a crash at any instant leaves the previous checkpoint whole and named.
 * S processes write it together: one makes the directory (ckpt_begin), each writes and
 * fsyncs its own shard file there in parallel (ckpt_shard_create), and the first, once it
 * has every shard's size and checksum, writes the manifest and commits (ckpt_commit).
 *
 * **Shard map.** Parameters are grouped into units in the weights' canonical order:
 * "embed" (model.embed_tokens.weight), "layer.L" for each block (its nine tensors in the
 * order of weights.h) and "head" (model.norm.weight, then lm_head.weight when the head is
 * not tied to the embedding). A unit is one flat vector of the state dtype (below): its
 * tensors row-major, back to back, zero-padded to `padded`, a multiple of the shard count
 * S. Shard r (0-based) holds elements [r·padded/S, (r+1)·padded/S) of every unit.
 *
 * **Precision.** The manifest's "precision" is the run's precision mode (engine/precision.h)
 * and fixes the type of every shard array (ckpt_state_dtype()):
 *   "fp32"        float32 weights and moments
 *   "bf16-mixed"  float32 master weights and moments: the very arrays (and shard files) of
 *                 fp32; only the manifest says that the run computes in bf16
 *   "bf16-true"   bfloat16 weights and moments
 * The field has been in version 1 from the start, always "fp32" until precision modes
 * came, so an older checkpoint reads exactly as before. A reader refuses any other value,
 * and treats a dataset stored in another type than the precision implies as damage.
 *
 * manifest.json (keys in this order; integers exact, floats with 17 significant digits):
 *   ftk_format "checkpoint", ftk_format_version 1, ftk_version
 *   step            optimizer steps done
 *   tokens_seen     training tokens (real, not padding) consumed
 *   data            {"file", "set_xxh3", "n_rows", "epoch", "rows_consumed"}: the data
 *                   order state — rows_consumed rows of epoch `epoch`'s permutation
 *                   are done (docs/design.md "Data order")
 *   init            {"file", "xxh3"}: the weights the run started from; xxh3 combines
 *                   their tensors' xxh3_64 checksums in canonical order (ckpt_init_hash())
 *   rng             {"seed"}: every random choice of the run derives from it
 *   train           the training options that define the run (ftk-train --help):
 *                   lr, min_lr, warmup, schedule, total_steps, global_batch, micro_batch,
 *                   beta1, beta2, eps, weight_decay, decay_norms, clip, seed, rounding
 *                   ("stochastic" or "nearest": how AdamW rounds bf16 results; a manifest
 *                   without it is read as "nearest", what fp32 runs wrote), warmup_style
 *                   ("ftk" or "litgpt": step k takes the schedule's rate of step k or of
 *                   step k-1), loss_mean ("global": the token mean of the global batch;
 *                   "micro": the mean of its micro-batches' token means), recipe ("ftk" or
 *                   "litgpt": the defaults the run started from, docs/litgpt.md); a
 *                   manifest without the last three is read as "ftk", "global", "ftk"
 *   precision       "fp32", "bf16-mixed" or "bf16-true" (Precision, above)
 *   strategy        "full", "grad-op", "none", "hybrid" or "hpz" (engine/shard.h)
 *   world_size      ranks of the run that wrote it
 *   shard_count     S: slices per unit, one shard file each (the world size, or the
 *                   shard group's size under hybrid, where one replica group writes)
 *   units_policy    the communication unit of the run that wrote it (engine/units.h):
 *                   "block", "group:M" (M in [1, 2^20]) or "size:BYTES" (BYTES in
 *                   [1, 2^62]), spelt as ckpt_units_policy_name() writes it: M and BYTES
 *                   in decimal digits, no leading zero, no suffix (a reader refuses
 *                   "size:1KiB", "group:02" or ""). It changes what a collective moves, never the
 *                   shard map: a checkpoint of any policy holds the same arrays, and resumes
 *                   under any other. A manifest without it is read as "block" (what runs
 *                   did before the policies came); version 1 kept.
 *   compress_grads  only in a checkpoint of a run with --compress-grads (engine/compress.h):
 *                   "bf16"; every shard file then holds that rank's error-feedback
 *                   residuals (/grad_residual, below). Absent: none (older readers ignore
 *                   the key and the datasets' group would be refused as unexpected)
 *   config          {"file": "config.json", "xxh3"}
 *   units           [{"name", "length", "padded", "tensors": [{"name", "shape", "offset"}]}]
 *   shards          [{"file", "bytes", "xxh3"}] × S, in shard order: each shard file's
 *                   name, size and XXH3-64 of its bytes
 *   manifest_xxh3   the seal: XXH3-64 (16 lowercase hex digits) of every byte of the file
 *                   before this member's line. Always last, on a line of its own: the
 *                   file ends with `  "manifest_xxh3": "HEX"\n}\n` and the bytes hashed
 *                   end with the newline before it. Written by ckpt_commit(); a reader
 *                   refuses a manifest whose seal differs or is malformed, and reads one
 *                   without a seal (written before seals; ckpt_manifest_t.sealed = 0: tools
 *                   warn). Adding it kept the version at 1: older readers ignore the key.
 *
 * Every value read is range-checked, sealed or not (a forger recomputes the seal too),
 * and ckpt_commit() writes no manifest a reader refuses: step in [0, train.total_steps];
 * data.rows_consumed in [0, data.n_rows]; data.epoch in [0, step]; step <= epoch·n_rows +
 * rows_consumed <= step·global_batch (the data order's invariants); tokens_seen >= 0; the
 * train options in ftk-train's ranges; strategy, schedule, precision known; shard_count =
 * world_size (hybrid: a divisor of it), at most 99999. The units are compared entry by
 * entry with ckpt_units() of config.json's model, which must be of a computable size
 * (<= 2^20 blocks, <= 2^40 elements a tensor), and every shard file must be a regular file
 * of its recorded size, at least the 3 × Σ padded/S elements of its arrays (2 bytes each). Stored
 * padding must be zero wherever it is read (ftk-verify's rule, so that no tool accepts
 * what it refuses). manifest.json (16 MiB), config.json (1 MiB) and latest (4 KiB) are read
 * with buf_read_small(): regular files only, bounded, none through a symbolic link (control
 * files of a run directory, which may be someone else's: a link to a secret is refused
 * before its target is read).
 *
 * Shard file (HDF5, ftk_format "checkpoint-shard", version 1): root attributes
 * shard_index (1-based), shard_count, step, units_xxh3 (XXH3-64 of the manifest's
 * "units" text, tying the shard to its shard map); datasets /param/UNIT, /adam_m/UNIT,
 * /adam_v/UNIT, [padded/S] each in the state dtype — float32 (H5T_IEEE_F32LE) or bfloat16
 * (uint16 little-endian with dataset attribute dtype = "bfloat16", as in weights.h) — with
 * its xxh3_64 over the stored bytes; shard 1 also carries /tokenizer/FILE as in weights.h,
 * so a checkpoint alone can be sampled from. With compress_grads, the shard also holds
 * /grad_residual/UNIT, [padded] float32 each (the whole unit: the residual of the rank that
 * wrote shard r, not a slice), with its xxh3_64, after the three kinds, every value finite
 * (a reader refuses another shape or type, a missing one and NaN/Inf as damage, at any
 * shard count); a reader restores them only at the same shard count and strategy. A shard
 * file does not record the precision (the manifest does), which keeps fp32 and bf16-mixed
 * shards byte for byte alike.
 *
 * Functions return 0 or -1 with ftk_err_msg() set.
 */
#ifndef FTK_CHECKPOINT_H
#define FTK_CHECKPOINT_H
#include <stdint.h>

#include "../libcommon/atomic.h"
#include "hfconfig.h"
#include "weights.h"

#define CKPT_FORMAT "checkpoint"
#define CKPT_SHARD_FORMAT "checkpoint-shard"
#define CKPT_VERSION 1

typedef struct {
    char name[WEIGHTS_NAME_MAX];
    int rank;
    int64_t shape[2];
    int64_t offset, numel;
    int is_norm;
} ckpt_tensor_t;

typedef struct {
    char name[32];
    int n_tensors;
    ckpt_tensor_t t[9];
    int64_t length, padded;
} ckpt_unit_t;

/* The units of a model for S shards. *units is malloc'd (free()). */
int ckpt_units(const model_config_t *c, int64_t shard_count, ckpt_unit_t **units, int *n_units);

typedef struct {
    double lr, min_lr, beta1, beta2, eps, weight_decay, clip;
    int64_t warmup, total_steps, global_batch, micro_batch, seed;
    int decay_norms;
    char schedule[16]; /* cosine | linear | constant */
    char rounding[16]; /* how bf16 results of AdamW are rounded: stochastic | nearest */
    /* "" reads as the first of each (what runs wrote before these existed) */
    char warmup_style[16]; /* ftk | litgpt */
    char loss_mean[16];    /* global | micro */
    char recipe[16];       /* ftk | litgpt */
} ckpt_train_t;

/* The value of a ckpt_train_t string option, "" read as its default. */
const char *ckpt_warmup_style(const ckpt_train_t *t);
const char *ckpt_loss_mean(const ckpt_train_t *t);
const char *ckpt_recipe(const ckpt_train_t *t);

typedef struct {
    int64_t step, tokens_seen;
    char data_file[4096];
    char data_set_xxh3[32];
    char init_file[4096];
    char init_xxh3[32];
    int64_t data_rows, epoch, rows_consumed;
    ckpt_train_t train;
    char strategy[16];
    int64_t world_size, shard_count;
    char precision[16]; /* "fp32" | "bf16-mixed" | "bf16-true" */
    char units_policy[32]; /* "block" | "group:M" | "size:BYTES"; "" reads and writes as "block" */
    char compress_grads[8]; /* "" (none) | "bf16": the shards hold /grad_residual */
} ckpt_meta_t;

/* A units policy's text (ckpt_meta_t.units_policy, ftk-train --units): "block" (*kind 0,
 * *arg 1), "group:M" (*kind 1, *arg M in [1, 2^20]) or "size:BYTES" (*kind 2, *arg in
 * [1, 2^62]; BYTES as opts_parse_size() reads it, e.g. 512MiB). 0, or -1 with a message
 * that says what is allowed (the caller names the option or key). */
enum { CKPT_UNITS_BLOCK, CKPT_UNITS_GROUP, CKPT_UNITS_SIZE };
int ckpt_units_policy_parse(const char *text, int *kind, int64_t *arg);
/* The policy's canonical text ("" → "block"; sizes in bytes, digits only) into out. */
void ckpt_units_policy_name(int kind, int64_t arg, char out[32]);

/* The type a checkpoint of this precision stores its arrays in: DT_F32 for "fp32" and
 * "bf16-mixed", DT_BF16 for "bf16-true", DT_INVALID for anything else (also the check
 * that a precision name is one of the three). */
dtype_t ckpt_state_dtype(const char *precision);

/* One shard's arrays, unit by unit (host memory, padded/S elements of type dt each). */
typedef struct {
    void **param, **m, **v;
    dtype_t dt;
} ckpt_state_t;
void ckpt_state_free(ckpt_state_t *st, int n_units);

/* A shard file's entry in the manifest. */
typedef struct {
    uint64_t bytes, xxh3;
} ckpt_shard_sum_t;

/* "shard-00002-of-00004.h5" for index 1 (0-based) of 4. */
void ckpt_shard_name(char out[32], int64_t index, int64_t count);

/* The per-unit arrays of a shard file, in the order it stores them. */
#define CKPT_KINDS 3
extern const char *const ckpt_kind_names[CKPT_KINDS]; /* "param", "adam_m", "adam_v" */

/* XXH3-64 of the manifest's "units" text for this shard map (a shard's units_xxh3). */
int ckpt_units_hash(const ckpt_unit_t *units, int n_units, char hex[17]);

/* ---- writing ----
 * ckpt_begin: makes the hidden directory for RUN/step-NNNNNNNN (w->dir names it).
 * ckpt_commit: config.json and manifest.json (sums: one per shard, in order), rename into
 *   place, RUN/latest, then with keep > 0 removes older step-* directories beyond the
 *   newest keep. ckpt_abort: removes the hidden directory. */
typedef struct {
    atomic_dir_t ad;
    char *run_dir;
    const char *dir;
    char name[32];
} ckpt_writer_t;
int ckpt_begin(ckpt_writer_t *w, const char *run_dir, int64_t step);
int ckpt_commit(ckpt_writer_t *w, const ckpt_meta_t *meta, const model_config_t *cfg, const ckpt_unit_t *units,
                int n_units, const ckpt_shard_sum_t *sums, int keep);
void ckpt_abort(ckpt_writer_t *w);
/* config.json and manifest.json (as ckpt_commit writes them) into dir, an existing directory,
 * and nothing more: no rename, no `latest` (a memory snapshot's, engine/snapshot.h). */
int ckpt_write_control(const char *dir, const ckpt_meta_t *meta, const model_config_t *cfg, const ckpt_unit_t *units,
                       int n_units, const ckpt_shard_sum_t *sums);

/* One shard file written an array at a time, so that a tool holding one unit at a time
 * (ftk-reshard) writes the same bytes as a training rank; any process writes its shard
 * into the directory ckpt_begin() made (dir: w->dir of the process that called it).
 * ckpt_shard_put() takes the arrays in file order: kind 0 (param) of units 0 … n−1, then
 * kind 1, then kind 2, each padded/S elements of the state dtype of meta->precision
 * (ckpt_state_dtype(); copied, the caller keeps data); an array out of order is an error.
 * ckpt_shard_create() refuses a meta whose precision is not one of the three. ckpt_shard_finish() adds the tokenizer files of tok_src (or -1),
 * closes and fsyncs the file and puts its size and checksum in *sum; it always releases w
 * and reports any earlier failure. The units array must outlive w. */
typedef struct ckpt_shard_writer ckpt_shard_writer_t;
ckpt_shard_writer_t *ckpt_shard_create(const char *dir, const ckpt_meta_t *meta, const ckpt_unit_t *units,
                                       int n_units, int64_t index);
int ckpt_shard_put(ckpt_shard_writer_t *w, int kind, int unit, const void *data);
/* With meta->compress_grads, after the three kinds: unit's residual, padded float32
 * elements (units in order). */
int ckpt_shard_put_residual(ckpt_shard_writer_t *w, int unit, const float *data);
int ckpt_shard_finish(ckpt_shard_writer_t *w, hid_t tok_src, ckpt_shard_sum_t *sum);
/* ckpt_shard_finish() of n writers at once (w[0] gets tok_src's files): every file closed,
 * then fsynced by up to 16 threads together (a flush waits on the device: 16 at once took
 * 0.3 ms a file where one at a time took 5 ms), then each checksummed into sums[i]. For a
 * tool that writes many shards. Always releases every writer (w[i] set to NULL); returns -1
 * with the first failure's message. */
int ckpt_shard_finish_many(ckpt_shard_writer_t **w, int64_t n, hid_t tok_src, ckpt_shard_sum_t *sums);

/* Resolves what a user named: a checkpoint directory, a run directory or its `latest`
 * file (the checkpoint `latest` names). `latest` is read with buf_read_small() without
 * following a link: a link, FIFO, device or directory there is refused, naming it.
 * Returns a malloc'd path or NULL (no checkpoint there: ftk_err_msg() says why). */
char *ckpt_resolve(const char *path);

/* The step a checkpoint directory's name says: "step-" and 8 digits, the last component of
 * path; -1 for any other name. */
int64_t ckpt_step_name(const char *path);

/* step-* directories of run_dir (names, complete or not: step-NNNNNNNN), sorted (the 8-digit
 * names sort by step); *n of them. The caller frees each name and the array. An unreadable
 * directory gives NULL and *n = 0; out of memory, the names read so far. */
char **ckpt_list_steps(const char *run_dir, size_t *n);

/* Committed checkpoints of a run directory, newest first (malloc'd paths; free each and
 * the array). *n = 0 when there are none. */
char **ckpt_list(const char *run_dir, size_t *n);

/* Removes the hidden directories of checkpoints whose writers died before committing
 * (".step-*.tmp.PID"); returns how many. Call it only when no writer is running: while
 * holding the run's lock (rundir_lock), which every writer takes. Even then, one whose
 * PID is a live process on this host is kept (a writer that took no lock). */
int ckpt_remove_stale(const char *run_dir);

/* ---- reading ----
 * The functions that read arrays into the caller's memory take the type it wants, dt:
 * the stored type (ckpt_state_dtype(man->meta.precision)) is copied as it is, another is
 * converted (dtype_convert(): widening exact, narrowing to nearest even). Checksums are
 * always verified on the bytes as stored. A dataset not of the manifest's type is damage. */
typedef struct {
    ckpt_meta_t meta;
    model_config_t cfg;
    ckpt_unit_t *units; /* the shard map, checked against cfg */
    int n_units;
    ckpt_shard_sum_t *shards; /* meta.shard_count entries */
    int sealed;               /* 1: its manifest_xxh3 verified; 0: an older manifest without one */
} ckpt_manifest_t;

/* Reads and checks manifest.json (its precision one of the three) and config.json (its
 * checksum, the shard map — every unit and tensor entry — against the model) and that
 * every shard file is there with its recorded size. */
int ckpt_open(const char *dir, ckpt_manifest_t *man);
/* ckpt_open() of a directory that holds only some of the shard files (a memory snapshot,
 * engine/snapshot.h): a missing one is allowed, every one there is checked as above. */
int ckpt_open_some(const char *dir, ckpt_manifest_t *man);
/* Whether dir names a memory snapshot (engine/snapshot.h: a step-NNNNNNNN directory in a
 * rank-RRRRR folder), which ckpt_open_path() and ftk-verify read with ckpt_open_some(). */
int ckpt_is_snapshot(const char *dir);
void ckpt_manifest_free(ckpt_manifest_t *man);
/* ckpt_resolve() then ckpt_open() (ckpt_open_some() for a memory snapshot): returns the
 * checkpoint's directory (malloc'd) or NULL. */
char *ckpt_open_path(const char *path, ckpt_manifest_t *man);
/* Opens shard `index` (0-based) read-only: with verify, first the whole file's XXH3-64
 * against the manifest's; always its root attributes against the manifest (shard index
 * and count, step — a shard of another checkpoint — and units_xxh3); with verify, last,
 * that it holds no dataset but the shard map's arrays, (shard 1) the tokenizer files, whose
 * checksums are verified, and (compress_grads) one residual per unit, each checked by
 * ckpt_shard_read_residual() (as ftk-verify does). The caller closes the handle with
 * h5_close(). */
hid_t ckpt_shard_open(const char *dir, const ckpt_manifest_t *man, int64_t index, int verify);
/* Every shard opened as by ckpt_shard_open(): an array of meta.shard_count handles, or
 * NULL (none left open). ckpt_close_shards() closes them and frees the array. */
hid_t *ckpt_open_shards(const char *dir, const ckpt_manifest_t *man, int verify);
void ckpt_close_shards(hid_t *files, const ckpt_manifest_t *man);
/* The padding of every unit of every kind in the open shards, as stored, checked to be
 * zero (what ftk-verify checks; ckpt_read_unit(), ckpt_read_shard() and
 * ckpt_read_resliced() check the padding they read): a tool that reads only some arrays
 * (ftk-merge) still refuses a checkpoint ftk-verify refuses. Reads only the padding. */
int ckpt_check_padding(const hid_t *files, const ckpt_manifest_t *man);
/* Elements [start, start+n) of /KIND/UNIT (kind: 0 param, 1 adam_m, 2 adam_v; unit: an
 * index into man->units) of an open shard of man's checkpoint, as dt into out. check
 * (whole dataset only) also compares the bytes read with the dataset's xxh3_64. */
int ckpt_shard_read(hid_t f, const ckpt_manifest_t *man, int kind, int unit, int64_t start, int64_t n, int check,
                    dtype_t dt, void *out);
/* /grad_residual/UNIT of an open shard (a checkpoint with compress_grads), checked as every
 * reader and ftk-verify check it: a 1-D dataset of units[unit].padded values stored as
 * float32, its xxh3_64, every value finite (NaN or Inf is damage: the first step would
 * spread it into the weights). With out, the values go there (units[unit].padded floats);
 * with out NULL they are only checked, read in blocks of at most 4 MiB. */
int ckpt_shard_read_residual(hid_t f, const ckpt_manifest_t *man, int unit, float *out);
/* The unit whose residual a dataset path names ("/grad_residual/layer.0"), or -1 (not a
 * residual, or the manifest has no compress_grads). */
int ckpt_residual_unit(const ckpt_manifest_t *man, const char *path);
/* What a dataset of shard `index` is (path as h5_each_dataset() gives it): one of the unit
 * arrays, a residual (compress_grads), a tokenizer file (shard 1 only) or none of these. */
typedef enum { CKPT_DS_ARRAY, CKPT_DS_RESIDUAL, CKPT_DS_TOKENIZER, CKPT_DS_UNEXPECTED } ckpt_dataset_t;
ckpt_dataset_t ckpt_shard_dataset(const ckpt_manifest_t *man, int64_t index, const char *path);
/* A dataset of an open shard checked as ckpt_shard_open(…, 1) and ftk-verify check it, by
 * what ckpt_shard_dataset() says it is: a unit array passes (it is checked where it is
 * read), a residual as ckpt_shard_read_residual() checks it, a tokenizer file against its
 * checksum, anything else is refused. 0, or -1 with the message (which does not name the
 * file). */
int ckpt_shard_check_dataset(hid_t f, const ckpt_manifest_t *man, ckpt_dataset_t what, const char *path);
/* A whole unit of one kind (units[unit].padded elements of dt into out) from the S open
 * shards files[0 … S−1], every dataset checked against its xxh3_64. */
int ckpt_read_unit(const hid_t *files, const ckpt_manifest_t *man, int kind, int unit, dtype_t dt, void *out);
/* Reads shard `index` (opened with verify, every dataset checked) into st in the stored
 * type (st->dt; ckpt_state_free()); with params_only the moments are left NULL. */
int ckpt_read_shard(const char *dir, const ckpt_manifest_t *man, int64_t index, int params_only, ckpt_state_t *st);
/* Whole units of parameters (host, units[u].padded elements of dt each, allocated by the
 * caller) from every shard, all verified. */
int ckpt_read_params(const char *dir, const ckpt_manifest_t *man, dtype_t dt, void **units);
/* A checkpoint's shard files opened as they are needed (ckpt_shard_open() without verify:
 * attributes checked), at most max_open (>= 1) at a time: the least recently used one is
 * closed to open another, so that a reader of any shard count holds a bounded number of
 * descriptors and HDF5 caches. dir and man must outlive the cache. NULL when out of memory. */
typedef struct ckpt_shard_cache ckpt_shard_cache_t;
ckpt_shard_cache_t *ckpt_shard_cache_new(const char *dir, const ckpt_manifest_t *man, int max_open);
/* Shard `index` (0-based), open: valid until the next call; -1 with the error set. */
hid_t ckpt_shard_cache_get(ckpt_shard_cache_t *c, int64_t index);
void ckpt_shard_cache_free(ckpt_shard_cache_t *c); /* NULL: nothing */
/* Elements [start, start+n) of /KIND/UNIT's whole flat vector (unit coordinates within
 * [0, units[unit].padded)), as dt into out, from the shards that hold them. The padding read
 * is checked to be zero as stored; a shard's dataset read whole is also checked against its
 * xxh3_64 (a part of one is not: verify the files first, ckpt_shard_open(…, 1)). */
int ckpt_read_range(ckpt_shard_cache_t *c, int kind, int unit, int64_t start, int64_t n, dtype_t dt, void *out);
/* Reslicing, the rule ftk-reshard and ckpt_read_resliced() share: elements [a, b) of
 * /KIND/UNIT's flat vector in another shard count's layout, whose padded length b may pass
 * this checkpoint's, as dt into out. What this checkpoint holds of them is read
 * (ckpt_read_range: the old padding read is checked to be zero); elements past its padded
 * length are zero. last: [a, b) ends the new layout, and the old padding past b (which a
 * smaller new padding drops) is read too, into out after the b − a elements, to be checked:
 * out then holds max(b, padded) − a elements, else b − a. */
int ckpt_read_reslice(ckpt_shard_cache_t *c, int kind, int unit, int64_t a, int64_t b, int last, dtype_t dt,
                      void *out);
/* Reshard on load: the slices that shard index2 of a layout of S2 shards holds (the shard
 * map of ckpt_units(cfg, S2)), in the stored type (st->dt), read from only the element
 * ranges of this checkpoint's shards that overlap them (ckpt_read_range, through a cache of
 * 16 open files whatever the shard counts); zeros past the old padding, which is checked to
 * be zero. The shard files' checksums are not recomputed here (a caller verifies each file
 * once, e.g. spread over ranks, with ckpt_shard_open(…, 1)); their attributes are checked. */
int ckpt_read_resliced(const char *dir, const ckpt_manifest_t *man, int64_t S2, int64_t index2, int params_only,
                       ckpt_state_t *st);

/* Identity of a weights file's contents: XXH3 over its tensors' stored xxh3_64 values,
 * in canonical order (cheap: no tensor is read). 16 hex digits into out. */
int ckpt_init_hash(hid_t weights, const model_config_t *c, char out[17]);

/* Opens the shard holding the tokenizer files (for weights_each_file()); -1 on error. */
hid_t ckpt_open_tokenizer(const char *dir, const ckpt_manifest_t *man);

#endif
