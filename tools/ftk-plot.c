/* ftk-plot — a picture (SVG) or a table (CSV) of one or more runs' metrics.jsonl. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/metrics.h"
#include "../libcommon/atomic.h"
#include "../libcommon/buf.h"
#include "../libcommon/log.h"
#include "../libcommon/opts.h"
#include "../libcommon/output.h"
#include "../libcommon/plot.h"

static const char *out_path, *title = "ftk runs";
static int csv, force;

OPTS_TABLE_BEGIN
static const opt_t options[] = {
    {"output", 'o', OPT_STR, &out_path, "FILE",
     "the SVG (or CSV with --csv) to write (required; must not exist unless --force): a file, - for stdout, a FIFO "
     "or a device"},
    {"force", 'f', OPT_FLAG, &force, NULL, "replace an existing output file (once the new one is complete)"},
    {"csv", 0, OPT_FLAG, &csv, NULL, "write a CSV table instead of a picture"},
    {"title", 0, OPT_STR, &title, "TEXT", "the picture's heading"},
    {0},
};
OPTS_TABLE_END

static const opt_spec_t spec = {
    .tool = "ftk-plot",
    .usage = "RUN... -o FILE.svg [--csv] [--title TEXT] [--force]",
    .summary = "Draws the metrics of one or more training runs against the step, overlaid in one\n"
               "colour per run: the loss (validation loss dashed, with dots), the learning rate,\n"
               "tokens/s and the gradient norm. RUN is a run directory (its metrics.jsonl) or a\n"
               "metrics file. With --csv, one row per step of each run instead:\n"
               "run,step,loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s (empty where a value\n"
               "is missing; val_loss on the steps that were evaluated).",
    .epilog = "Examples:\n"
              "  ftk-plot run/ -o run.svg\n"
              "  ftk-plot run-lr2e-4/ run-lr1e-4/ -o compare.svg --title 'two learning rates'\n"
              "  ftk-plot run/ --csv -o - | column -s, -t\n"
              "  ftk-plot run/ -o run.svg --force    # redraw it (an existing file is refused without --force)\n"
              "\nExit status: 0 success, 1 I/O failure, 2 bad usage, unreadable metrics or an output that may not be\n"
              "written (nothing written).\n",
    .opts = options,
    .min_pos = 1,
    .max_pos = -1,
};

static int write_csv(buf_t *b, const metrics_t *m, int n)
{
    int rc = buf_printf(b, "run,step,loss,val_loss,lr,grad_norm,tokens_per_s,elapsed_s\n");
    for (int r = 0; r < n && !rc; r++) {
        /* the run's name as a CSV field: quoted, quotes doubled */
        buf_t name = {0};
        rc = buf_putc(&name, '"');
        for (const char *c = m[r].name; *c && !rc; c++)
            rc = *c == '"' ? buf_printf(&name, "\"\"") : buf_putc(&name, *c);
        rc = rc || buf_putc(&name, '"');
        size_t e = 0;
        /* evaluations at step 0 (before training) and between steps come on their own row */
        for (size_t i = 0; i <= m[r].n_steps && !rc; i++) {
            int64_t s = i < m[r].n_steps ? m[r].steps[i].step : INT64_MAX;
            for (; e < m[r].n_evals && m[r].evals[e].step < s && !rc; e++)
                rc = buf_printf(b, "%s,%lld,,%.10g,,,,\n", name.data, (long long)m[r].evals[e].step,
                                m[r].evals[e].val_loss);
            if (i == m[r].n_steps || rc)
                break;
            const metrics_step_t *st = &m[r].steps[i];
            double vals[6] = {st->loss, NAN, st->lr, st->grad_norm, st->tokens_per_s, st->elapsed_s};
            if (e < m[r].n_evals && m[r].evals[e].step == s)
                vals[1] = m[r].evals[e++].val_loss;
            rc = buf_printf(b, "%s,%lld", name.data, (long long)s);
            for (int k = 0; k < 6 && !rc; k++)
                rc = isfinite(vals[k]) ? buf_printf(b, ",%.10g", vals[k]) : buf_putc(b, ',');
            rc = rc || buf_putc(b, '\n');
        }
        buf_free(&name);
    }
    return rc ? -1 : 0;
}

/* The figure: four panels, each run's series in its colour. */
static int write_svg(buf_t *b, const metrics_t *m, int n_runs)
{
    size_t n = n_runs > 0 ? (size_t)n_runs : 0, total = 0;
    for (size_t r = 0; r < n; r++)
        total += 5 * (m[r].n_steps + m[r].n_evals) + 2;
    double *mem = malloc(total * 2 * sizeof *mem);
    plot_series_t *ser = calloc(n * 5 + 1, sizeof *ser);
    const char **names = calloc(n + 1, sizeof *names);
    if (!mem || !ser || !names) {
        free(mem), free(ser), free(names);
        ftk_err_set("out of memory");
        return -1;
    }
    double *p = mem;
    /* ser[k * n + r]: panel k's series of run r (k = 4: validation, on panel 0) */
    for (size_t r = 0; r < n; r++) {
        names[r] = m[r].name;
        for (size_t k = 0; k < 5; k++) {
            size_t cnt = k < 4 ? m[r].n_steps : m[r].n_evals;
            double *x = p, *y = p + cnt;
            p += 2 * cnt;
            for (size_t i = 0; i < cnt; i++) {
                if (k == 4) {
                    x[i] = (double)m[r].evals[i].step;
                    y[i] = m[r].evals[i].val_loss;
                    continue;
                }
                const metrics_step_t *st = &m[r].steps[i];
                x[i] = (double)st->step;
                y[i] = k == 0 ? st->loss : k == 1 ? st->lr : k == 2 ? st->tokens_per_s : st->grad_norm;
            }
            ser[k * n + r] = (plot_series_t){x, y, cnt, (int)r, k == 4, k == 4};
        }
    }
    /* panel 0 draws the losses then the validation losses: 2n series, contiguous */
    plot_series_t *loss = calloc(n * 2 + 1, sizeof *loss);
    int rc = -1;
    if (loss) {
        for (size_t r = 0; r < n; r++) {
            loss[r] = ser[r];
            loss[n + r] = ser[4 * n + r];
        }
        plot_panel_t panels[4] = {
            {"loss", "step", loss, n * 2, "solid: training; dashed with dots: validation"},
            {"learning rate", "step", ser + n, n, NULL},
            {"tokens/s", "step", ser + 2 * n, n, NULL},
            {"gradient norm (before clipping)", "step", ser + 3 * n, n, NULL},
        };
        rc = plot_svg(b, panels, 4, 2, names, n_runs, title);
    } else
        ftk_err_set("out of memory");
    free(loss);
    free(mem);
    free(ser);
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk-plot");
    atomic_install_signal_cleanup();
    int npos;
    char **pos;
    int r = opts_parse(&spec, argc, argv, &npos, &pos);
    if (r)
        return r > 0 ? 0 : FTK_EXIT_USAGE;
    if (!out_path) {
        ftk_error("-o FILE is required (- for stdout)");
        return FTK_EXIT_USAGE;
    }
    if (output_check(out_path, force ? OUTPUT_FORCE : 0) < 0) {
        ftk_error("%s", ftk_err_msg());
        return FTK_EXIT_USAGE;
    }
    metrics_t *m = calloc((size_t)npos, sizeof *m);
    if (!m) {
        ftk_error("out of memory");
        return FTK_EXIT_FAIL;
    }
    int code = 0, n = 0;
    for (; n < npos; n++)
        if (metrics_read(pos[n], &m[n]) < 0) {
            ftk_error("%s", ftk_err_msg());
            code = FTK_EXIT_USAGE;
            break;
        }
    buf_t b = {0};
    if (!code && (csv ? write_csv(&b, m, n) : write_svg(&b, m, n)) < 0) {
        ftk_error("%s", ftk_err_msg());
        code = FTK_EXIT_FAIL;
    }
    if (!code && output_write(out_path, force ? OUTPUT_FORCE : 0, b.data, b.len) < 0) {
        ftk_error("%s", ftk_err_msg());
        code = FTK_EXIT_FAIL;
    }
    if (!code && strcmp(out_path, "-"))
        ftk_info("%s: %d run%s, %s", out_path, n, n == 1 ? "" : "s", csv ? "CSV" : "SVG");
    buf_free(&b);
    for (int i = 0; i < n; i++)
        metrics_free(&m[i]);
    free(m);
    return code;
}
