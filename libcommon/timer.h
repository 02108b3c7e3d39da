/* timer.h — monotonic wall-clock seconds, for progress rates and reports (not for tests). */
#ifndef FTK_TIMER_H
#define FTK_TIMER_H

#include <time.h>

static inline double time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
