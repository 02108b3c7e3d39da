/* watchdog.h — a hang watchdog: a thread that acts when the process has finished nothing
 * for a given time.
 *
 * The watched code calls watchdog_beat() whenever it finishes a piece of work; once armed
 * by watchdog_start(), a detached thread looks every 0.1 s and calls on_expiry(arg) when
 * no beat came for limit_s seconds (so at most 0.1 s late). on_expiry runs on the
 * watchdog's thread while the rest of the process may be stuck anywhere, holding any lock:
 * it should do no more than write(2) and _exit(2). If it returns, the watchdog stops.
 *
 * A watchdog thread that itself did not run for a second (the process stopped by SIGSTOP or
 * a debugger, or starved) starts the clock again: the silence was the whole process's, not
 * the watched code's, and a process stopped and continued would otherwise find the hang
 * in itself.
 *
 * One watchdog a process: watchdog_start() is called at most once. watchdog_beat() may be
 * called before the start (it then only records the time).
 */
#ifndef FTK_WATCHDOG_H
#define FTK_WATCHDOG_H

/* Arms the watchdog from now (a beat) to the process's end. limit_s > 0. Returns 0, or -1
 * with ftk_err_msg() set (the thread could not be made). */
int watchdog_start(double limit_s, void (*on_expiry)(void *arg), void *arg);

/* Something finished: the clock starts again. */
void watchdog_beat(void);

#endif
