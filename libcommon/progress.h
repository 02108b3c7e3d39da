/* progress.h — a progress line on stderr for long work.
 *
 * Drawn only when stderr is a terminal (or --progress forced it) and not --quiet; redrawn
 * at most 4 times a second with `\r`, so piping stderr to a file never fills it with
 * progress lines. progress_done() erases the line so the final summary stands alone.
 *
 *     progress_t p;
 *     progress_start(&p, "tokenizing", n_records, "records");
 *     for (...) progress_update(&p, i + 1);
 *     progress_done(&p);
 */
#ifndef FTK_PROGRESS_H
#define FTK_PROGRESS_H

#include <stdint.h>

typedef struct {
    const char *label;
    const char *unit;
    int64_t total; /* 0: unknown */
    double t_start, t_last;
    int active;
} progress_t;

void progress_start(progress_t *p, const char *label, int64_t total, const char *unit);
void progress_update(progress_t *p, int64_t done);
void progress_done(progress_t *p);

#endif
