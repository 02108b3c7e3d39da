/* ops_grad.c — the finite-difference machinery of the gradient checks (ops_impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../libcommon/log.h"
#include "ops_impl.h"

double ops_fd_wdot(ops_fd_t *f, const float *y, int64_t n)
{
    double s = 0, t = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)f->w[i] * y[i];
        t += fabs((double)f->w[i] * y[i]);
    }
    f->T = t;
    return s;
}

static double loss_at(ops_fd_t *f, int in, float t)
{
    float *x[3];
    for (int i = 0; i < f->n_in; i++)
        x[i] = f->x[i];
    for (int64_t j = 0; j < f->len[in]; j++)
        f->scratch[in][j] = f->x[in][j] + t * f->e[in][j];
    x[in] = f->scratch[in];
    return f->loss(f, x);
}

void ops_fd_check(ops_fd_t *f, float *const *g, ops_grad_t *gs)
{
    char name[128];
    ops_case_name(f->c, name, sizeof name);
    const float h = 1.0f / 128;
    for (int i = 0; i < f->n_in; i++) {
        double d1 = (loss_at(f, i, h) - loss_at(f, i, -h)) / (2.0 * h);
        double d2 = (loss_at(f, i, h / 2) - loss_at(f, i, -h / 2)) / (double)h;
        double fd = (4 * d2 - d1) / 3, an = 0, S = 0;
        for (int64_t j = 0; j < f->len[i]; j++) {
            an += (double)g[i][j] * f->e[i][j];
            S += fabs((double)g[i][j] * f->e[i][j]);
        }
        double rel = fabs(fd - an) / (S + f->T);
        gs->checks++;
        gs->bad += !(rel <= OPS_FD_BOUND);
        if (rel > OPS_FD_BOUND)
            fprintf(stderr, "  %s d%s: finite differences %.9g, backward %.9g (error %.3e of %.3e)\n", name,
                    f->in_name[i], fd, an, rel, S);
        gs->worst[i] = rel > gs->worst[i] ? rel : gs->worst[i];
    }
    gs->cases++;
}

void ops_fd_input(ops_fd_t *f, ops_rng_t *rng, const char *name, int64_t len, float sc)
{
    int i = f->n_in++;
    f->in_name[i] = name;
    f->len[i] = len;
    f->x[i] = ops_rand(rng, len, sc, 1);
    f->e[i] = ops_xmalloc((size_t)len * sizeof(float));
    f->scratch[i] = ops_xmalloc((size_t)len * sizeof(float));
    for (int64_t j = 0; j < len; j++) {
        float u = (float)ops_urand(rng);
        f->e[i][j] = ops_round_bf16((u < 0.5f ? -1.0f : 1.0f) * (0.5f + 0.49f * (float)ops_urand(rng)));
    }
}
void ops_fd_free(ops_fd_t *f)
{
    for (int i = 0; i < f->n_in; i++) {
        free(f->x[i]);
        free(f->e[i]);
        free(f->scratch[i]);
    }
    free(f->w);
    free(f->ids);
}

bk_buf_t ops_fd_up(backend_t *be, const float *x, int64_t n)
{
    bk_buf_t b = bk_buf(bk_alloc(be, (size_t)n * sizeof(float), BK_MEM_OTHER, "a test buffer"), DT_F32);
    if (!b.p) {
        fprintf(stderr, "%s\n", ftk_err_msg());
        exit(1);
    }
    be->upload(be, b.p, x, (size_t)n * sizeof(float));
    return b;
}
