/* plot.h — line charts as a standalone SVG document (no dependency: ftk-plot's output
 * opens in any browser and in image viewers).
 *
 * A figure is a grid of panels; each panel has its own axes (ticks at 1, 2, 5 × 10^k, at
 * most 64 an axis; a range too narrow for such ticks at its magnitude, 1e17 to 1e17 + 16,
 * or wider than a double, gets its two ends) and any number of series drawn in the
 * palette's colour of their run (so one run keeps its colour across panels); a legend of
 * the runs sits under the grid. Non-finite points are gaps. Titles, names and notes are
 * any bytes: what XML 1.0 cannot hold (C0 controls, invalid UTF-8, U+FFFE/U+FFFF) is
 * replaced (plot.c: text()), so the document is well-formed whatever its input. Ownership: everything is borrowed for the call; the SVG text is appended to out.
 * Returns 0, or -1 with ftk_err_msg() set (out of memory).
 */
#ifndef FTK_PLOT_H
#define FTK_PLOT_H

#include <stddef.h>

#include "buf.h"

typedef struct {
    const double *x, *y;
    size_t n;
    int run;     /* colour index: the run it belongs to */
    int dashed;  /* a second quantity of the same run (validation loss) */
    int markers; /* a dot at each point (sparse series) */
} plot_series_t;

typedef struct {
    const char *title;
    const char *xlabel;
    const plot_series_t *series;
    size_t n_series;
    const char *note; /* a line under the title, e.g. "dashed: validation"; may be NULL */
} plot_panel_t;

int plot_svg(buf_t *out, const plot_panel_t *panels, int n_panels, int cols, const char *const *run_names,
             int n_runs, const char *title);

#endif
