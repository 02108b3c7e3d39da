/* units.c — communication units (units.h). */
#include "units.h"

#include <limits.h>
#include <stdlib.h>

#include "../libcommon/log.h"

int units_parse(const char *text, units_policy_t *p)
{
    return ckpt_units_policy_parse(text ? text : "", &p->kind, &p->arg);
}

void units_name(const units_policy_t *p, char out[32]) { ckpt_units_policy_name(p->kind, p->arg, out); }

void units_map_free(units_map_t *m)
{
    free(m->first);
    free(m->count);
    free(m->of);
    *m = (units_map_t){0};
}

int units_map(const units_policy_t *p, const ckpt_unit_t *units, int n_units, size_t elem_bytes, int64_t S,
              units_map_t *m)
{
    char name[32];
    units_name(p, name);
    *m = (units_map_t){0};
    int L = n_units - 2; /* blocks: storage units 1 … L */
    if (p->kind == CKPT_UNITS_GROUP && p->arg > L) {
        ftk_err_set("--units %s: the model has %d block%s", name, L, L == 1 ? "" : "s");
        return -1;
    }
    m->first = malloc((size_t)n_units * sizeof *m->first);
    m->count = malloc((size_t)n_units * sizeof *m->count);
    m->of = malloc((size_t)n_units * sizeof *m->of);
    if (!m->first || !m->count || !m->of) {
        units_map_free(m);
        ftk_err_set("out of memory");
        return -1;
    }
    for (int u = 0; u < n_units;) {
        int k = 1;
        if (u >= 1 && u <= L) {
            if (p->kind == CKPT_UNITS_GROUP)
                k = (int)(p->arg < L + 1 - u ? p->arg : L + 1 - u);
            else if (p->kind == CKPT_UNITS_SIZE) {
                uint64_t bytes = (uint64_t)units[u].length * elem_bytes;
                while (u + k <= L && bytes + (uint64_t)units[u + k].length * elem_bytes <= (uint64_t)p->arg) {
                    bytes += (uint64_t)units[u + k].length * elem_bytes;
                    k++;
                }
            }
        }
        /* blocks are alike (padded equally), so a group's slices are of one length */
        if (k > 1 && (int64_t)k * (units[u].padded / S) > INT_MAX) {
            ftk_err_set("--units %s: a unit of %d blocks moves %lld elements per rank in one collective (at most "
                        "%d)",
                        name, k, (long long)k * (units[u].padded / S), INT_MAX);
            units_map_free(m);
            return -1;
        }
        m->first[m->n] = u;
        m->count[m->n] = k;
        for (int i = 0; i < k; i++)
            m->of[u + i] = m->n;
        m->n++;
        u += k;
    }
    return 0;
}

void units_interleave(backend_t *be, void *dst, const void *src, int n, int64_t S, size_t part_bytes, int to_blocks)
{
    for (int k = 0; k < n; k++)
        for (int64_t r = 0; r < S; r++) {
            size_t rank_major = ((size_t)r * (size_t)n + (size_t)k) * part_bytes,
                   block_major = ((size_t)k * (size_t)S + (size_t)r) * part_bytes;
            if (to_blocks)
                be->copy(be, (char *)dst + block_major, (const char *)src + rank_major, part_bytes);
            else
                be->copy(be, (char *)dst + rank_major, (const char *)src + block_major, part_bytes);
        }
}
