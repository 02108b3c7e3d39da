/* rundir.h — a run directory: what it holds, and its one writer.
 *
 * ## On disk
 *
 *   RUN/                          a training run (ftk-train --out, ftk-reshard -o)
 *     step-NNNNNNNN/              a committed checkpoint (checkpoint.h)
 *     .step-NNNNNNNN.tmp.PID/     a checkpoint being written (checkpoint.h, ckpt_begin)
 *     latest                      names the newest committed checkpoint (checkpoint.h)
 *     metrics.jsonl               the trainer's metrics (metrics.h)
 *     options.yaml                the run's options as ftk-train keeps them
 *     .lock                       "HOST PID TOOL\n": the writer that holds the run
 *     .run-id                     16 lowercase hex digits and a newline: the run's
 *                                 identity, drawn when ftk-train first takes memory
 *                                 snapshots in RUN (engine/snapshot.h names them for it)
 *
 * **One writer.** Every tool that creates or removes checkpoint directories in RUN
 * (ftk-train's rank 0, ftk-reshard) holds an exclusive POSIX record lock on RUN/.lock for
 * as long as it writes there (rundir_lock): no two write side by side, and a temporary
 * found by the holder is provably a dead writer's (ckpt_remove_stale). A writer whose own
 * mkdir made RUN owns it, to remove it again on failure, only while it holds nothing of
 * another writer's: of two writers started together on a new RUN, the one whose mkdir
 * made it may lose the lock to the other (rundir_claim), or win it only after the other
 * has run to its end (rundir_holds_only_lock); the run is then the other's.
 *
 * Messages go through ftk_err_set(); nothing is printed. */
#ifndef FTK_RUNDIR_H
#define FTK_RUNDIR_H

/* The lock file's name in RUN. */
#define RUNDIR_LOCK ".lock"

/* rundir_lock()'s failures. */
enum {
    RUNDIR_BUSY = -1,     /* another process holds it: the message names its host, process and tool */
    RUNDIR_NO_LOCKS = -2, /* the file system keeps no locks (ENOLCK, ENOSYS, EOPNOTSUPP): warn and go on */
    RUNDIR_ERROR = -3,    /* any other error */
    RUNDIR_REFUSED = -4,  /* RUN/.lock is a symbolic link, FIFO, device or directory: bad input */
};

/* Takes an exclusive POSIX record lock on RUN/.lock (fcntl F_SETLK, which NFS serves
 * through its lock manager and Lustre when mounted with -o flock) and writes
 * "HOST PID TOOL\n" into it (ftk_tool(); a file without TOOL is read as ftk-train's).
 * Returns the descriptor, which holds the lock until it is closed or the process ends
 * (kill -9 included: the kernel drops it), or one of the codes above. The file is opened
 * without following a link and without blocking, and nothing is written through one
 * that is not a regular file. A lock won on a file that is no longer at the path (RUN's
 * creator failed and removed it meanwhile) is not taken: it opens again. */
int rundir_lock(const char *run_dir);

/* rundir_lock() for a writer that may have made RUN itself (*made nonzero): where another
 * writer holds the lock (RUNDIR_BUSY), *made is cleared, for RUN is that writer's now
 * (the two started together) and a failure of ours must leave it. */
int rundir_claim(const char *run_dir, int *made);

/* Whether RUN holds nothing but the lock file (0 too when it cannot be read). */
int rundir_holds_only_lock(const char *run_dir);

/* "RUN/.lock", malloc'd (the caller frees it), or NULL when out of memory. */
char *rundir_lock_path(const char *run_dir);

/* Whether a live process holds RUN/.lock (fcntl F_GETLK; a process sees its own lock as
 * free): 1 held, 0 free or no lock file, -1 where it cannot be told (no locks there). */
int rundir_lock_held(const char *run_dir);

/* RUN/.run-id into out (16 hex digits): read, or with create drawn and written (atomically)
 * where there is none. 0; 1 where there is none and create is 0; -1 with the message (a
 * file there that is not one: a link, or other content, is refused, naming it). */
int rundir_run_id(const char *run_dir, char out[17], int create);

/* A writer that made RUN and failed before anything of its own got in: the lock file
 * removed (while it is still held) and RUN with it, only when nothing else is there. */
void rundir_remove_bare(const char *run_dir);

#endif
