/* watchdog.c — the hang watchdog's thread (watchdog.h). */
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "timer.h"

static atomic_llong beat_ms; /* when the watched code last finished something; 0: never */
static long long limit_ms;
static void (*expire)(void *arg);
static void *expire_arg;

static long long now_ms(void) { return (long long)(time_now() * 1e3); }

void watchdog_beat(void) { atomic_store(&beat_ms, now_ms()); }

static void *watch(void *unused)
{
    (void)unused;
    struct timespec nap = {0, 100000000}; /* 0.1 s: the expiry comes at most that late */
    long long last = now_ms();
    for (;;) {
        nanosleep(&nap, NULL);
        long long t = now_ms(), b = atomic_load(&beat_ms);
        /* this thread did not run for a second: the process's silence, not the code's */
        if (t - last > 1000 && b)
            atomic_store(&beat_ms, b = t);
        last = t;
        if (b && t - b > limit_ms) {
            expire(expire_arg);
            return NULL;
        }
    }
}

int watchdog_start(double limit_s, void (*on_expiry)(void *arg), void *arg)
{
    limit_ms = (long long)(limit_s * 1e3);
    expire = on_expiry;
    expire_arg = arg;
    watchdog_beat();
    pthread_t t;
    int e = pthread_create(&t, NULL, watch, NULL);
    if (e) {
        ftk_err_set("cannot start the watchdog thread: %s", strerror(e));
        return -1;
    }
    pthread_detach(t);
    return 0;
}
