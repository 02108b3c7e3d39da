/* plot.c — line charts as SVG (plot.h). */
#include "plot.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "utf8.h"

/* Ticks an axis may have: tick_step() aims at about 5 */
#define MAX_TICKS 64

enum { PANEL_W = 520, PANEL_H = 330, MARGIN_L = 70, MARGIN_R = 20, MARGIN_T = 46, MARGIN_B = 44 };

/* Tableau 10: distinct for the colour-blind too, the matplotlib default */
static const char *palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/* s as XML character data: & < > " escaped, and what XML 1.0 cannot hold at all (a name
 * or title is any bytes) replaced, so the document is well-formed whatever its input: a
 * C0 control byte by its picture (U+2400 + byte: "\x01" shows as U+2401), a byte that is
 * not valid UTF-8 and U+FFFE/U+FFFF by U+FFFD. */
static int text(buf_t *b, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode(u + i, n - i, &cp), rc;
        char enc[4];
        if (!l || cp == 0xFFFE || cp == 0xFFFF) {
            rc = buf_append(b, "\xEF\xBF\xBD", 3);
            l = l ? l : 1;
        } else if (cp < 0x20)
            rc = buf_append(b, enc, (size_t)utf8_encode(0x2400 + cp, enc));
        else
            rc = cp == '&'   ? buf_printf(b, "&amp;")
                 : cp == '<' ? buf_printf(b, "&lt;")
                 : cp == '>' ? buf_printf(b, "&gt;")
                 : cp == '"' ? buf_printf(b, "&quot;")
                             : buf_append(b, u + i, (size_t)l);
        if (rc < 0)
            return -1;
        i += (size_t)l;
    }
    return 0;
}

/* A tick step of 1, 2 or 5 × 10^k giving about 5 ticks over [lo, hi]. */
static double tick_step(double lo, double hi)
{
    double span = hi - lo, raw = span / 5, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* v as a tick label, with the digits that tell ticks step apart: at 1e17 + 16 with a step
 * of 2, all 17 of them. */
static void fmt_num(char *o, size_t n, double v, double step)
{
    double a = fabs(v);
    if (v == 0)
        snprintf(o, n, "0");
    else if (a >= 1e5 || a < 1e-3) {
        double d = step > 0 && isfinite(step) ? floor(log10(a)) - floor(log10(step)) + 1 : 2;
        snprintf(o, n, "%.*g", d < 2 ? 2 : d > 17 ? 17 : (int)d, v);
    } else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(o, n, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

/* Where v lies in [lo, hi], 0 to 1 (halved where hi - lo overflows) */
static double frac(double v, double lo, double hi)
{
    double w = hi - lo;
    return isfinite(w) ? (v - lo) / w : (v / 2 - lo / 2) / (hi / 2 - lo / 2);
}

static int panel(buf_t *b, const plot_panel_t *p, int ox, int oy)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (size_t s = 0; s < p->n_series; s++)
        for (size_t i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            if (!isfinite(x) || !isfinite(y))
                continue;
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    int pw = PANEL_W - MARGIN_L - MARGIN_R, ph = PANEL_H - MARGIN_T - MARGIN_B;
    int px = ox + MARGIN_L, py = oy + MARGIN_T;
    int rc = buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"title\">", ox + PANEL_W / 2, oy + 20);
    rc = rc || text(b, p->title) || buf_printf(b, "</text>\n");
    if (!rc && p->note)
        rc = buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"note\">", ox + PANEL_W / 2, oy + 36) || text(b, p->note) ||
             buf_printf(b, "</text>\n");
    rc = rc || buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n", px, py, pw, ph);
    if (rc)
        return -1;
    if (!(x0 <= x1)) {
        return buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"note\">no data</text>\n", px + pw / 2, py + ph / 2);
    }
    /* margins that doubles can hold: a single step of 1e17 gets more than 0.5 on each side
     * (1e17 - 0.5 == 1e17), and no range overflows (-1e308 to 1e308) */
    if (x1 == x0) {
        double d = fmax(0.5, fabs(x0) * 1e-6);
        x0 -= d, x1 += d;
    }
    double d = y1 == y0 ? (y0 ? fabs(y0) * 0.05 : 0.5) : (y1 / 2 - y0 / 2) * 0.08;
    y0 -= d, y1 += d;
    x0 = fmax(x0, -DBL_MAX), x1 = fmin(x1, DBL_MAX), y0 = fmax(y0, -DBL_MAX), y1 = fmin(y1, DBL_MAX);
#define SX(v) (px + pw * frac(v, x0, x1))
#define SY(v) (py + ph - ph * frac(v, y0, y1))
    /* grid and tick labels: tick k at k * st, k counted in integers (v += st stalls where st
     * is below the spacing of doubles at v: 1e17 + 2 == 1e17), at most MAX_TICKS of them;
     * where that cannot be (a range of a few ulps at 1e17, one wider than a double), the
     * range's two ends */
    for (int axis = 0; axis < 2 && !rc; axis++) {
        double lo = axis ? y0 : x0, hi = axis ? y1 : x1, st = tick_step(lo, hi);
        double k0 = ceil(lo / st), k1 = floor(hi / st + 1e-9);
        int ends = !(isfinite(st) && st > 0 && k1 >= k0 && k1 - k0 < MAX_TICKS && fabs(k0) < 0x1p62 &&
                     fabs(k1) < 0x1p62);
        int64_t first = ends ? 0 : (int64_t)k0, last = ends ? 1 : (int64_t)k1;
        double prev = NAN;
        for (int64_t k = first; k <= last && !rc; k++) {
            double v = ends ? (k ? hi : lo) : (double)k * st;
            if (v == prev) /* distinct indices, one double: one tick */
                continue;
            prev = v;
            char lab[48];
            fmt_num(lab, sizeof lab, fabs(v) < st * 1e-9 ? 0 : v, ends ? hi - lo : st);
            if (axis) {
                double y = SY(v);
                rc = buf_printf(b,
                                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>"
                                "<text x=\"%d\" y=\"%.1f\" class=\"ylab\">%s</text>\n",
                                px, y, px + pw, y, px - 6, y + 4, lab);
            } else {
                double x = SX(v);
                rc = buf_printf(b,
                                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/>"
                                "<text x=\"%.1f\" y=\"%d\" class=\"xlab\">%s</text>\n",
                                x, py, x, py + ph, x, py + ph + 16, lab);
            }
        }
    }
    if (!rc && p->xlabel)
        rc = buf_printf(b, "<text x=\"%d\" y=\"%d\" class=\"axis\">", px + pw / 2, py + ph + 34) || text(b, p->xlabel) ||
             buf_printf(b, "</text>\n");
    /* the series: a polyline per finite stretch */
    for (size_t s = 0; s < p->n_series && !rc; s++) {
        const plot_series_t *se = &p->series[s];
        const char *col = palette[se->run % (int)(sizeof palette / sizeof *palette)];
        int open = 0;
        for (size_t i = 0; i <= se->n && !rc; i++) {
            int ok = i < se->n && isfinite(se->x[i]) && isfinite(se->y[i]);
            if (ok && !open) {
                rc = buf_printf(b, "<polyline class=\"line%s\" stroke=\"%s\" points=\"", se->dashed ? " dashed" : "",
                                col);
                open = 1;
            }
            if (ok)
                rc = rc || buf_printf(b, "%.1f,%.1f ", SX(se->x[i]), SY(se->y[i]));
            if (!ok && open) {
                rc = rc || buf_printf(b, "\"/>\n");
                open = 0;
            }
        }
        for (size_t i = 0; i < se->n && se->markers && !rc; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                rc = buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                                SX(se->x[i]), SY(se->y[i]), col);
    }
#undef SX
#undef SY
    return rc ? -1 : 0;
}

int plot_svg(buf_t *out, const plot_panel_t *panels, int n_panels, int cols, const char *const *run_names,
             int n_runs, const char *title)
{
    int rows = (n_panels + cols - 1) / cols, legend_h = 24 + 20 * ((n_runs + 2) / 3);
    int w = cols * PANEL_W, h = 40 + rows * PANEL_H + legend_h;
    int rc = buf_printf(out,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                        "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                        "<style>.title{font-size:15px;font-weight:bold;text-anchor:middle}"
                        ".note{font-size:11px;fill:#555;text-anchor:middle}.frame{fill:none;stroke:#444}"
                        ".grid{stroke:#ddd;stroke-width:1}.xlab{font-size:11px;text-anchor:middle}"
                        ".ylab{font-size:11px;text-anchor:end}.axis{font-size:12px;text-anchor:middle}"
                        ".line{fill:none;stroke-width:1.6;stroke-linejoin:round}.dashed{stroke-dasharray:6 4}"
                        ".legend{font-size:12px}.head{font-size:17px;font-weight:bold;text-anchor:middle}</style>\n"
                        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                        "<text x=\"%d\" y=\"26\" class=\"head\">",
                        w, h, w, h, w / 2);
    rc = rc || text(out, title) || buf_printf(out, "</text>\n");
    for (int i = 0; i < n_panels && !rc; i++)
        rc = panel(out, &panels[i], (i % cols) * PANEL_W, 40 + (i / cols) * PANEL_H);
    for (int r = 0; r < n_runs && !rc; r++) {
        int x = 20 + (r % 3) * (w / 3), y = 40 + rows * PANEL_H + 16 + 20 * (r / 3);
        rc = buf_printf(out,
                        "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>"
                        "<text x=\"%d\" y=\"%d\" class=\"legend\">",
                        x, y - 4, x + 24, y - 4, palette[r % (int)(sizeof palette / sizeof *palette)], x + 30, y) ||
             text(out, run_names[r]) || buf_printf(out, "</text>\n");
    }
    rc = rc || buf_printf(out, "</svg>\n");
    if (rc)
        ftk_err_set("out of memory");
    return rc ? -1 : 0;
}
