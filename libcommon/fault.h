/* fault.h — named fault points: how a test says "kill this process during X".
 *
 * A test that means "during X" stops, kills, signals or fails the process *at X*, not after
 * a guessed sleep (which passes vacuously on a fast machine and gives up on a slow one).
 * The code calls fault_point("SITE") at each place a test may aim at; nothing happens
 * unless the environment names that site:
 *
 *   FTK_FAULT=SPEC[,SPEC...]
 *   SPEC     = SITE[@RANK][:N[+]][:ACTION]
 *   SITE     = a site name below (exact)
 *   @RANK    = only in the process of this world rank (OMPI_COMM_WORLD_RANK, PMIX_RANK,
 *              PMI_RANK or SLURM_PROCID; a process alone is rank 0); default: every process
 *   N        = fire at the N-th time this process reaches the site (from 1; default 1);
 *              N+ fires at the N-th and every later time
 *   ACTION   = kill            SIGKILL to itself (kill -9: no handler, no cleanup; default)
 *              stop            SIGSTOP to itself (a hung process)
 *              exit            _exit(1) (a crash that runs no handler)
 *              sig=NAME        raise signal NAME (TERM, INT, HUP, USR1, USR2) in itself
 *              psig=NAME       send signal NAME to its parent process (mpirun for a rank
 *                              it launched: what a user's kill of mpirun does)
 *              enospc | eio    the site fails: fault_point() returns -1 with errno and
 *                              ftk_err_msg() set, as a full disk or an I/O error would
 *              sleep=MS        pause MS milliseconds there, then go on (a lower bound on a
 *                              stretch of time: "this write takes at least MS")
 *
 *   RANK, N and MS are decimal digits only. A SPEC that cannot be read (an empty or
 *   out-of-range rank, a second N or ACTION, more than 16 SPECs) is reported on stderr as
 *   written, with what is wrong, and ignored.
 *
 *   FTK_FAULT_LOG=FILE  each firing first appends one line to FILE (O_APPEND, before the
 *              action, so a process that kills itself leaves it): "SITE N ACTION pid=P
 *              rank=R". A test asserts from it that its fault landed where it claims.
 *
 * Each firing also prints "ftk: fault: SITE #N: ACTION" on stderr. An unknown site name in
 * FTK_FAULT cannot be detected (sites are just strings), so tests assert the log line.
 *
 * Sites (grep fault_point for the full list; docs/testing.md keeps it too):
 *   train.start          ftk-train: first thing in main, the stop signals held and their
 *                        handler not yet installed (sig= here must stay pending, not kill)
 *   train.step-end       ftk-train: a step finished and was reported (every rank)
 *   train.weights-loaded ftk-train: the initial weights are loaded and the time said (every
 *                        rank; tests/bench/weights_load.sh ends the run there)
 *   ckpt.begin           rank 0 made the hidden checkpoint directory
 *   ckpt.shard-put       one array of a shard file written: by a training rank, its
 *                        background writer (of a checkpoint or a memory snapshot), or
 *                        ftk-reshard (fails: enospc, eio)
 *   ckpt.shard-done      a rank's shard file is complete and synced
 *   ckpt.before-rename   rank 0 wrote the manifest; the hidden directory not yet renamed
 *   ckpt.before-latest   the checkpoint is renamed into place; `latest` not yet replaced
 *   ckpt.committed       `latest` names the new checkpoint
 *   bgsave.write         the background writer is about to write one array (of a
 *                        checkpoint, or of a memory snapshot)
 *   snapshot.copy        a rank starts copying its state for a memory snapshot
 *   snapshot.send        a rank is about to send its snapshot's bytes to its partner
 *   snapshot.done        a rank is about to rename its memory snapshot into place
 *   snapshot.fetch       a rank is about to send a piece of a snapshot file to a
 *                        restarting rank (engine/snapshot.h)
 *   atomic.begin         a temporary output file was created (ftk-pack shards, weights)
 *   mpi.init             MPI is initialised (every rank), before anything collective
 *
 * Thread-safe; costs one load and a branch where FTK_FAULT is unset.
 */
#ifndef FTK_FAULT_H
#define FTK_FAULT_H

/* Returns 0 (go on) or -1 with errno and ftk_err_msg() set (enospc, eio). kill, stop (until
 * continued), exit and a fatal sig= do not return. */
int fault_point(const char *site);

/* Whether FTK_FAULT names this site at all (e.g. to skip work that only a fault needs). */
int fault_armed(const char *site);

#endif
