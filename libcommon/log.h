/* log.h — messages in the `ftk-<tool>: error: …` form, and the library's error slot.
 *
 * Two audiences:
 *  - Tools call ftk_set_tool("ftk-pack") once, then ftk_error()/ftk_warn()/ftk_info()
 *    to print on stderr. ftk_info() is silenced by ftk_quiet.
 *  - Library code never prints and never exits: it records a message with ftk_err_set()
 *    and returns -1 or NULL. The caller reads it with ftk_err_msg() (thread-local, valid
 *    until the next ftk_err_set() on the same thread) and decides what to do.
 *
 * Exit codes shared by all tools (docs/design.md "Preemption and exit codes").
 */
#ifndef FTK_LOG_H
#define FTK_LOG_H

#include <stdarg.h>

enum {
    FTK_EXIT_OK = 0,        /* success */
    FTK_EXIT_FAIL = 1,      /* runtime failure (I/O error, out of memory, …) */
    FTK_EXIT_USAGE = 2,     /* bad usage or bad input; nothing was written */
    FTK_EXIT_VERIFY = 3,    /* verification failed (ftk-verify) */
    FTK_EXIT_PREEMPTED = 75 /* preempted, checkpoint written, run again (EX_TEMPFAIL) */
};

#define FTK_PRINTF(a, b) __attribute__((format(printf, a, b)))

extern int ftk_quiet; /* set by --quiet: ftk_info() prints nothing */

void ftk_set_tool(const char *name);
const char *ftk_tool(void);

void ftk_error(const char *fmt, ...) FTK_PRINTF(1, 2);
void ftk_warn(const char *fmt, ...) FTK_PRINTF(1, 2);
void ftk_info(const char *fmt, ...) FTK_PRINTF(1, 2);

/* 0 while every message reached stderr; else the errno of the first that did not (EPIPE:
 * a pipe whose reader is gone, as in `ftk-train … 2>&1 | head`, where SIGPIPE is ignored;
 * EIO: the terminal of a closed ssh session). The messages after it are lost; a tool
 * says so where it still can (ftk-train: in metrics.jsonl). */
int ftk_stderr_errno(void);

/* For a signal handler that asks the process to stop (async-signal-safe): from now on a
 * message never waits for stderr's reader. Where stderr is a pipe or a FIFO it is made
 * non-blocking (a message the pipe cannot take is lost, EAGAIN, and counted above), and
 * a message already waiting is given up when the signal interrupts it (EINTR). Why: a
 * reader may stop reading and never close, as mpirun does from the moment it is signalled
 * until it kills its ranks (odls_base_sigkill_timeout later); a rank blocked on a full
 * pipe would never reach its checkpoint. ftk_stderr_restore() undoes it (at exit: the
 * pipe may be shared with the shell that started the tool). */
void ftk_stderr_unstall(void);
void ftk_stderr_restore(void);

/* Library error slot. ftk_err_set() replaces the message; ftk_err_prefix() prepends
 * context ("tokenizer.model: " + old message) so that layers can add where it happened. */
void ftk_err_set(const char *fmt, ...) FTK_PRINTF(1, 2);
void ftk_err_prefix(const char *fmt, ...) FTK_PRINTF(1, 2);
const char *ftk_err_msg(void);

#endif
