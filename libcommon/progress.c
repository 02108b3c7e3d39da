#include "progress.h"

#include <stdio.h>
#include <unistd.h>

#include "log.h"
#include "opts.h"
#include "timer.h"

void progress_start(progress_t *p, const char *label, int64_t total, const char *unit)
{
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->t_start = time_now();
    p->t_last = 0;
    p->active = !ftk_quiet && (ftk_progress_force || isatty(STDERR_FILENO));
}

void progress_update(progress_t *p, int64_t done)
{
    if (!p->active)
        return;
    double now = time_now();
    if (now - p->t_last < 0.25 && !(p->total && done == p->total))
        return;
    p->t_last = now;
    double el = now - p->t_start;
    double rate = el > 0 ? (double)done / el : 0;
    if (p->total > 0) {
        double eta = rate > 0 ? (double)(p->total - done) / rate : 0;
        fprintf(stderr, "\r%s: %s: %lld/%lld %s (%.0f%%) %.0f %s/s, eta %.0fs\033[K", ftk_tool(), p->label,
                (long long)done, (long long)p->total, p->unit, 100.0 * (double)done / (double)p->total, rate,
                p->unit, eta);
    } else {
        fprintf(stderr, "\r%s: %s: %lld %s, %.0f %s/s\033[K", ftk_tool(), p->label, (long long)done, p->unit,
                rate, p->unit);
    }
    /* Forced progress into a file: one line per update rather than carriage returns. */
    if (!isatty(STDERR_FILENO))
        fputc('\n', stderr);
    fflush(stderr);
}

void progress_done(progress_t *p)
{
    if (p->active && isatty(STDERR_FILENO))
        fprintf(stderr, "\r\033[K");
    p->active = 0;
}
