/* backend.c — what every backend shares (backend.h): the instance, bk_alloc()'s
 * accounting and its record of live allocations (an open-addressing table from address
 * to size and class: device memory cannot carry a header). */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../libcommon/log.h"
#include "prof.h"

const char *const bk_mem_class_names[BK_MEM_CLASSES] = {"weights",     "gradients", "optimizer state", "gathered units",
                                                        "activations", "workspaces", "other"};

typedef struct {
    void *p;
    size_t bytes;
    int cls;
} entry_t;

typedef struct {
    entry_t *e;
    size_t cap, used, tomb; /* cap: a power of two */
} amap_t;

#define TOMB ((void *)1)

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static int amap_grow(amap_t *m)
{
    size_t cap = m->cap ? 2 * m->cap : 64;
    entry_t *e = calloc(cap, sizeof *e);
    if (!e)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].p && m->e[i].p != TOMB) {
            size_t s = slot_of(m->e[i].p, cap);
            while (e[s].p)
                s = (s + 1) & (cap - 1);
            e[s] = m->e[i];
        }
    free(m->e);
    m->e = e;
    m->cap = cap;
    m->tomb = 0;
    return 0;
}

static int amap_put(amap_t *m, void *p, size_t bytes, int cls)
{
    if (4 * (m->used + m->tomb + 1) > 3 * m->cap && amap_grow(m) < 0)
        return -1;
    size_t s = slot_of(p, m->cap);
    while (m->e[s].p && m->e[s].p != TOMB)
        s = (s + 1) & (m->cap - 1);
    if (m->e[s].p == TOMB)
        m->tomb--;
    m->e[s] = (entry_t){p, bytes, cls};
    m->used++;
    return 0;
}

static entry_t *amap_find(amap_t *m, const void *p)
{
    if (!m->cap)
        return NULL;
    size_t s = slot_of(p, m->cap);
    while (m->e[s].p) {
        if (m->e[s].p == p)
            return &m->e[s];
        s = (s + 1) & (m->cap - 1);
    }
    return NULL;
}

static void human(char *out, size_t n, double bytes)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
}

/* The device's count of an allocation (sign +1) or a free (-1): with the driver's pages
 * where the backend has them (cuda_mem.h), else the bytes asked for. */
static void dev_count(backend_t *be, int64_t bytes, int sign)
{
    bk_mem_t *a = &be->mem;
    if (be->mem_pages) {
        bk_cuda_mem_add(&a->pages, bytes, sign);
        a->dev_in_use = bk_cuda_mem_total(&a->pages);
    } else {
        a->dev_in_use += sign * bytes;
    }
}

void bk_mem_sample(backend_t *be)
{
    int64_t u = be->mem_used ? be->mem_used(be) : -1;
    if (u > be->mem.used_peak)
        be->mem.used_peak = u;
    if (be->mem.used_other < 0 && u >= 0)
        be->mem.used_other = u - be->mem.dev_in_use;
}

void *bk_alloc(backend_t *be, size_t bytes, bk_mem_class_t cls, const char *what)
{
    amap_t *m = be->alloc_map;
    size_t n = bytes ? bytes : 1;
    void *p = be->mem_alloc(be, n);
    if (!p) {
        char h[32], u[32];
        human(h, sizeof h, (double)bytes);
        human(u, sizeof u, (double)be->mem.in_use);
        ftk_err_set("out of memory on %s allocating %s (%zu bytes = %s; %s already allocated)", be->device, what, bytes,
                    h, u);
        return NULL;
    }
    if (amap_put(m, p, bytes, (int)cls) < 0) {
        be->mem_free(be, p);
        ftk_err_set("out of memory (host) recording an allocation of %s on %s", what, be->device);
        return NULL;
    }
    be->zero(be, p, n);
    bk_mem_t *a = &be->mem;
    a->in_use += (int64_t)bytes;
    a->cls[cls] += (int64_t)bytes;
    a->allocs++;
    if (a->in_use > a->peak) {
        a->peak = a->in_use;
        memcpy(a->at_peak, a->cls, sizeof a->at_peak);
    }
    dev_count(be, (int64_t)bytes, 1);
    if (a->dev_in_use > a->dev_peak) {
        a->dev_peak = a->dev_in_use;
        bk_mem_sample(be);
    }
    return p;
}

void bk_free(backend_t *be, void *p)
{
    if (!p)
        return;
    entry_t *e = amap_find(be->alloc_map, p);
    if (e) {
        be->mem.in_use -= (int64_t)e->bytes;
        be->mem.cls[e->cls] -= (int64_t)e->bytes;
        dev_count(be, (int64_t)e->bytes, -1);
        be->mem.allocs--;
        e->p = TOMB;
        ((amap_t *)be->alloc_map)->used--;
        ((amap_t *)be->alloc_map)->tomb++;
    }
    be->mem_free(be, p);
}

const bk_mem_t *bk_mem(const backend_t *be) { return &be->mem; }

/* ---- streams and events of a backend whose ops have finished when they return ---- */

struct bk_stream {
    int unused;
};
struct bk_event {
    int unused;
};

static bk_stream_t *host_stream_new(backend_t *be)
{
    (void)be;
    bk_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        ftk_err_set("out of memory");
    return s;
}
static void host_stream_free(backend_t *be, bk_stream_t *s)
{
    (void)be;
    free(s);
}
static void host_set_stream(backend_t *be, bk_stream_t *s)
{
    (void)be;
    (void)s;
}
static void *host_stream_native(backend_t *be, bk_stream_t *s)
{
    (void)be;
    (void)s;
    return NULL;
}
static bk_event_t *host_event_new(backend_t *be)
{
    (void)be;
    bk_event_t *e = calloc(1, sizeof *e);
    if (!e)
        ftk_err_set("out of memory");
    return e;
}
static void host_event_free(backend_t *be, bk_event_t *e)
{
    (void)be;
    free(e);
}
/* Nothing to record or wait for: every op issued before has finished. */
static void host_event_noop(backend_t *be, bk_event_t *e)
{
    (void)be;
    (void)e;
}
static int host_event_sync(backend_t *be, bk_event_t *e)
{
    (void)e;
    return be->sync(be);
}

void bk_host_streams(backend_t *be)
{
    be->stream_new = host_stream_new;
    be->stream_free = host_stream_free;
    be->set_stream = host_set_stream;
    be->stream_native = host_stream_native;
    be->event_new = host_event_new;
    be->event_free = host_event_free;
    be->event_record = host_event_noop;
    be->event_wait = host_event_noop;
    be->event_sync = host_event_sync;
}

backend_t *bk_instance_new(const char *name, const char *device)
{
    backend_t *be = calloc(1, sizeof *be);
    amap_t *m = calloc(1, sizeof *m);
    if (!be || !m) {
        free(be);
        free(m);
        ftk_err_set("out of memory");
        return NULL;
    }
    be->name = name;
    snprintf(be->device, sizeof be->device, "%s", device);
    be->alloc_map = m;
    be->mem.used_other = -1;
    return be;
}

backend_t *bk_instance_ctx_new(const char *name, const char *device, size_t ctx_bytes)
{
    backend_t *be = bk_instance_new(name, device);
    if (be && !(be->ctx = calloc(1, ctx_bytes))) {
        backend_free(be);
        ftk_err_set("out of memory");
        return NULL;
    }
    return be;
}

void backend_free(backend_t *be)
{
    if (!be)
        return;
    bk_prof_free(be); /* its timers are the instance's events */
    amap_t *m = be->alloc_map;
    /* What the owner did not free goes with the instance (before destroy: mem_free may
     * need the context). */
    for (size_t i = 0; m && i < m->cap; i++)
        if (m->e[i].p && m->e[i].p != TOMB)
            be->mem_free(be, m->e[i].p);
    if (m)
        free(m->e);
    free(m);
    be->alloc_map = NULL;
    if (be->destroy)
        be->destroy(be);
    free(be);
}

/* ---- FTK_FUSED: which optional fused ops an instance offers ---------------------------------- */

/* The FTK_FUSED switch of each op of BK_OPS, in order (NULL: not an optional fused op). */
#define OP_SWITCH(name, kind, params, args, cost) BK_KIND_SWITCH(kind),
static const char *const op_switch[] = {BK_OPS(OP_SWITCH)};
#undef OP_SWITCH
enum { N_OPS = sizeof op_switch / sizeof *op_switch };

/* The switches, each once, in the order of their first op; their count. */
static int fused_names(const char *names[N_OPS])
{
    int n = 0;
    for (int i = 0; i < N_OPS; i++) {
        int k = 0;
        while (op_switch[i] && k < n && strcmp(names[k], op_switch[i]))
            k++;
        if (op_switch[i] && k == n)
            names[n++] = op_switch[i];
    }
    return n;
}

static int switch_is(const char *op_sw, const char *sw) { return op_sw && !strcmp(op_sw, sw); }

/* Clears the ops of switch sw. */
static void fused_clear(backend_t *be, const char *sw)
{
#define CLEAR(name, kind, params, args, cost)                                                                        \
    if (switch_is(BK_KIND_SWITCH(kind), sw))                                                                         \
        be->name = NULL;
    BK_OPS(CLEAR)
#undef CLEAR
}

int bk_fused_select(backend_t *be, int default_all)
{
    const char *env = getenv("FTK_FUSED");
    const char *fused[N_OPS];
    int n_fused = fused_names(fused), on[N_OPS];
    for (int k = 0; k < n_fused; k++)
        on[k] = default_all;
    if (env && *env && !strcmp(env, "all")) {
        for (int k = 0; k < n_fused; k++)
            on[k] = 1;
    } else if (env && *env) {
        for (int k = 0; k < n_fused; k++)
            on[k] = 0;
        if (strcmp(env, "none")) {
            const char *p = env;
            while (*p) {
                size_t len = strcspn(p, ",");
                int found = 0;
                for (int k = 0; k < n_fused; k++)
                    if (strlen(fused[k]) == len && !strncmp(p, fused[k], len))
                        on[k] = found = 1;
                if (!found) {
                    char list[128] = "";
                    for (int k = 0; k < n_fused; k++)
                        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                                 fused[k]);
                    ftk_err_set("FTK_FUSED=%s: unknown fused op '%.*s' (expected all, none or a comma list of %s)",
                                env, (int)len, p, list);
                    return -1;
                }
                p += len;
                if (*p == ',')
                    p++;
            }
        }
    }
    for (int k = 0; k < n_fused; k++)
        if (!on[k])
            fused_clear(be, fused[k]);
    return 0;
}

/* ---- which device ---- */

/* gpus is the caller's: this file is in every program, the CUDA backend only in those
 * that take --device. */
const char *backend_default_device(int (*gpus)(void), int *from_env)
{
    const char *e = getenv("FTK_DEVICE");
    if ((*from_env = e && *e))
        return e;
    return gpus && gpus() > 0 ? "cuda" : "cpu";
}

const char *const backend_devices[BK_N_DEVICES] = {"cpu", "cuda"};

int backend_device_index(const char *name)
{
    for (int i = 0; i < BK_N_DEVICES; i++)
        if (!strcmp(name, backend_devices[i]))
            return i;
    return -1;
}

int backend_check_device(const char *name, int from_env)
{
    if (backend_device_index(name) >= 0)
        return 0;
    ftk_err_set("--device %s: need cpu or cuda%s", name, from_env ? " (from FTK_DEVICE)" : "");
    return -1;
}

/* ---- cuDNN attention's workspace (backend.h) ------------------------------------------------ */

static int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

int64_t bk_cudnn_hopper_bwd_ws(int64_t max_seg, int64_t max_len, int n_head)
{
    return max_seg * n_head * max_len * max_len * 2;
}

int64_t bk_cudnn_ws_bytes(int64_t engine_ws, int64_t max_seg, int64_t max_len, int n_head)
{
    return round256(engine_ws) + 2 * round256(max_seg * n_head * max_len * (int64_t)sizeof(float));
}

int64_t bk_cudnn_plan_bytes(const char *device, dtype_t dt, int64_t max_seg, int64_t max_len, int n_head, int n_kv,
                            int hd)
{
    const char *at = getenv("FTK_CUDA_ATTN");
    (void)n_kv;
    if (strcmp(device, "cuda") || !at || strcmp(at, "cudnn") || dt != DT_BF16 || hd % 8 || hd > 128 || max_seg < 1 ||
        max_len < 1)
        return 0;
    return bk_cudnn_ws_bytes(bk_cudnn_hopper_bwd_ws(max_seg, max_len, n_head), max_seg, max_len, n_head);
}
