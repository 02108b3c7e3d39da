/* runtime.cu — the CUDA backend's memory, copies, streams, events and dtype conversion, and
 * the waits and scratch every family uses (cuda_internal.cuh). */
#include "cuda_internal.cuh"

/* ---- waits and scratch (declared, and said what they do, in cuda_internal.cuh) ---------- */

cudaError_t host_wait(cuda_t *c, cudaStream_t s, cudaEvent_t e)
{
    backend_t *be = c->be;
    if (!be->wait_hook)
        return e ? cudaEventSynchronize(e) : cudaStreamSynchronize(s);
    for (;;) {
        cudaError_t r = e ? cudaEventQuery(e) : cudaStreamQuery(s);
        if (r != cudaErrorNotReady)
            return r;
        be->wait_hook(be->wait_arg);
        usleep(50);
    }
}

void scratch_claim(cuda_t *c)
{
    if (c->scr_owner == c->cur)
        return;
    if (c->scr_owner)
        ck(c, cudaEventRecord(c->scr_ev, c->scr_owner), "scratch event");
    ck(c, cudaStreamWaitEvent(c->cur, c->scr_ev, 0), "scratch event");
    c->scr_owner = c->cur;
}

void *scratch(cuda_t *c, void **p, size_t *cap, size_t bytes, const char *what)
{
    if (bytes <= *cap)
        return *p;
    if (failed(c))
        return NULL;
    /* Kernels issued earlier may still read it; they all come before the current stream's
     * tail (scratch_claim). */
    if (ck(c, host_wait(c, c->cur, NULL), what) < 0)
        return NULL;
    bk_free(c->be, *p);
    *p = NULL;
    *cap = 0;
    if (!(*p = bk_alloc(c->be, bytes, BK_MEM_WORKSPACE, what))) {
        note_err(c, what, ftk_err_msg());
        return NULL;
    }
    *cap = bytes;
    return *p;
}

/* ---- memory, copies, streams, events ------------------------------------------------------ */

/* cudaMemGetInfo: free and total bytes of the device now, 0 or -1. */
static int mem_info(backend_t *be, size_t *f, size_t *t)
{
    enter(be);
    *f = *t = 0;
    if (cudaMemGetInfo(f, t) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

/* The device's free memory now (what --recompute auto plans against), or -1. */
int64_t cu_mem_avail(backend_t *be)
{
    size_t f, t;
    return mem_info(be, &f, &t) < 0 ? -1 : (int64_t)f;
}

/* Everything the device holds now (every context and process): what a GPU measures of the
 * plan's total (bk_mem_t used_peak), or -1. */
int64_t cu_mem_used(backend_t *be)
{
    size_t f, t;
    return mem_info(be, &f, &t) < 0 ? -1 : (int64_t)(t - f);
}

/* The scratch for shapes up to r's, allocated now in the order the planning backend counts
 * it (kernels/plan/backend_plan.c plan_reserve_cuda): no op grows it in a step, and the
 * plan holds it. A buffer already as large is kept. */
int cu_reserve(backend_t *be, const bk_reserve_t *r)
{
    cuda_t *c = enter(be);
    int64_t tmp, seg, map, side;
    bk_cuda_scratch(r, (int64_t)BK_CUDA_WORKSPACE_BYTES, c->vec, &tmp, &seg, &map, &side);
    scratch_claim(c);
    if (!scratch(c, &c->tmp, &c->tmp_cap, (size_t)tmp, "CUDA scratch") ||
        !scratch(c, (void **)&c->seg, &c->seg_cap, (size_t)seg, "attention segments") ||
        (map > 0 && !scratch(c, &c->am_map, &c->am_map_cap, (size_t)map, "adamw_multi block map")) ||
        (side > 0 &&
         !scratch(c, &c->side_part, &c->side_part_cap, (size_t)side, "sumsq's partial sums (side stream)"))) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

void *cu_mem_alloc(backend_t *be, size_t bytes)
{
    enter(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report (bk_alloc), not kept */
        return NULL;
    }
    return p;
}

void cu_mem_free(backend_t *be, void *p)
{
    if (!p)
        return;
    enter(be);
    cudaFree(p);
}

/* Page-locked host memory: the checkpoint snapshot (engine/bgsave.h) downloads into it
 * at the bus's speed, without the driver staging it through a bounce buffer. */
void *cu_host_alloc(backend_t *be, size_t bytes)
{
    enter(be);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 256, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report, not kept */
        return NULL;
    }
    return p;
}

void cu_host_free(backend_t *be, void *p)
{
    if (!p)
        return;
    enter(be);
    cudaFreeHost(p);
}

void cu_upload(backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = enter(be);
    if (!bytes || failed(c))
        return;
    if (bytes <= UP_STAGE) {
        /* Staged: the host buffer is free on return, and the host waits only for this
         * slot's previous copy, not for the stream (a copy from pageable memory would
         * drain it: the first kernels of every micro-batch would wait for the host). */
        up_slot_t *u = &c->up[c->up_next];
        c->up_next = (c->up_next + 1) % UP_SLOTS;
        if (!u->ev && ck(c, cudaEventCreateWithFlags(&u->ev, cudaEventDisableTiming), "upload") < 0)
            return;
        if (ck(c, host_wait(c, NULL, u->ev), "upload") < 0) /* at once when never recorded */
            return;
        if (!u->p && ck(c, cudaMallocHost(&u->p, UP_STAGE), "upload (pinned host memory)") < 0)
            return;
        memcpy(u->p, src, bytes);
        if (ck(c, cudaMemcpyAsync(dst, u->p, bytes, cudaMemcpyHostToDevice, c->cur), "upload") == 0)
            ck(c, cudaEventRecord(u->ev, c->cur), "upload");
        return;
    }
    /* Waiting makes the host buffer free on return whatever memory it is (pinned memory
     * would otherwise be read later). */
    if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->cur), "upload") == 0)
        ck(c, host_wait(c, c->cur, NULL), "upload");
}

void cu_download(backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = enter(be);
    if (!bytes)
        return;
    if (failed(c) || ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur), "download") < 0 ||
        ck(c, host_wait(c, c->cur, NULL), "download") < 0)
        memset(dst, 0xff, bytes); /* NaN where floats: a failed run cannot look healthy */
}

/* Queued on the current stream; dst is pinned (host_alloc), so the copy does not drain it. */
void cu_download_async(backend_t *be, void *dst, const void *src, size_t bytes)
{
    cuda_t *c = enter(be);
    if (!bytes)
        return;
    if (failed(c) || ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur), "download") < 0)
        memset(dst, 0xff, bytes); /* NaN where floats, as download */
}

void cu_zero(backend_t *be, void *p, size_t bytes)
{
    cuda_t *c = enter(be);
    if (bytes && !failed(c))
        ck(c, cudaMemsetAsync(p, 0, bytes, c->cur), "zero");
}

/* Overlapping regions go through scratch in chunks, front to back when dst is below src
 * and back to front otherwise, so no chunk overwrites source bytes not yet copied
 * (cudaMemcpy leaves overlap undefined). */
void copy_bytes(cuda_t *c, void *dst, const void *src, size_t bytes, const char *what)
{
    if (!bytes || failed(c) || dst == src)
        return;
    const char *s = (const char *)src;
    char *d = (char *)dst;
    if (d + bytes <= s || s + bytes <= d) {
        ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->cur), what);
        return;
    }
    scratch_claim(c);
    size_t ch = bytes < BK_CUDA_WORKSPACE_BYTES ? bytes : BK_CUDA_WORKSPACE_BYTES;
    char *t = (char *)tmp_for(c, ch);
    if (!t)
        return;
    for (size_t done = 0; done < bytes && !failed(c); done += ch) {
        size_t len = bytes - done < ch ? bytes - done : ch, off = d < s ? done : bytes - done - len;
        if (ck(c, cudaMemcpyAsync(t, s + off, len, cudaMemcpyDeviceToDevice, c->cur), what) == 0)
            ck(c, cudaMemcpyAsync(d + off, t, len, cudaMemcpyDeviceToDevice, c->cur), what);
    }
}

void cu_copy(backend_t *be, void *dst, const void *src, size_t bytes)
{
    copy_bytes(enter(be), dst, src, bytes, "copy");
}

/* Waits for every stream also after a failure (a dtype refused, an allocation that failed):
 * work queued before it still runs, and the caller may free or read what it uses once
 * sync() returns. The first error stays the one reported. */
int cu_sync(backend_t *be)
{
    cuda_t *c = enter(be);
    ck(c, host_wait(c, c->def, NULL), "synchronize");
    /* a stream whose work the default stream has already waited for (an event) is idle
     * now: asked, not waited for */
    for (bk_stream *s = c->streams; s; s = s->next)
        if (cudaStreamQuery(s->s) != cudaSuccess)
            ck(c, host_wait(c, s->s, NULL), "synchronize");
    ck(c, last_error(), "a kernel");
    if (failed(c)) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

/* Streams do not block on the legacy default stream: other libraries' work there does
 * not order ours. */
bk_stream_t *cu_stream_new(backend_t *be)
{
    cuda_t *c = enter(be);
    bk_stream *s = (bk_stream *)calloc(1, sizeof *s);
    if (!s) {
        ftk_err_set("out of memory");
        return NULL;
    }
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: creating a stream: %s", c->device, cudaGetErrorString(e));
        free(s);
        return NULL;
    }
    s->next = c->streams;
    c->streams = s;
    return s;
}

static void stream_release(cuda_t *c, bk_stream *s)
{
    if (c->cur == s->s)
        c->cur = c->def;
    if (c->scr_owner == s->s) { /* later scratch users wait for what it has queued */
        ck(c, cudaEventRecord(c->scr_ev, s->s), "scratch event");
        c->scr_owner = NULL;
    }
    cudaStreamDestroy(s->s); /* work already queued on it still runs */
    free(s);
}

void cu_stream_free(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = enter(be);
    for (bk_stream **pp = &c->streams; s && *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            stream_release(c, s);
            return;
        }
}

void cu_set_stream(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = (cuda_t *)be->ctx;
    c->cur = s ? s->s : c->def;
}

void *cu_stream_native(backend_t *be, bk_stream_t *s)
{
    cuda_t *c = (cuda_t *)be->ctx;
    return s ? (void *)s->s : (void *)c->def;
}

/* Ordering events skip the timestamp (cheaper to record); FTK_PROFILE's timers keep it. */
static bk_event_t *event_make(backend_t *be, unsigned flags)
{
    cuda_t *c = enter(be);
    bk_event *ev = (bk_event *)calloc(1, sizeof *ev);
    if (!ev) {
        ftk_err_set("out of memory");
        return NULL;
    }
    cudaError_t e = cudaEventCreateWithFlags(&ev->e, flags);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ftk_err_set("CUDA device %d: creating an event: %s", c->device, cudaGetErrorString(e));
        free(ev);
        return NULL;
    }
    ev->next = c->events;
    c->events = ev;
    return ev;
}

bk_event_t *cu_event_new(backend_t *be) { return event_make(be, cudaEventDisableTiming); }
bk_event_t *cu_timer_new(backend_t *be) { return event_make(be, cudaEventDefault); }

/* Not complete or never recorded (the instance had failed): unknown, and the runtime's last
 * error cleared, or sync() would report it as a kernel's. */
double cu_timer_elapsed(backend_t *be, bk_event_t *a, bk_event_t *b)
{
    enter(be);
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a->e, b->e) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return ms * 1e-3;
}

void cu_event_free(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    for (bk_event **pp = &c->events; ev && *pp; pp = &(*pp)->next)
        if (*pp == ev) {
            *pp = ev->next;
            cudaEventDestroy(ev->e);
            free(ev);
            return;
        }
}

void cu_event_record(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    if (!failed(c))
        ck(c, cudaEventRecord(ev->e, c->cur), "event record");
}

void cu_event_wait(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    if (!failed(c))
        ck(c, cudaStreamWaitEvent(c->cur, ev->e, 0), "event wait");
}

int cu_event_sync(backend_t *be, bk_event_t *ev)
{
    cuda_t *c = enter(be);
    ck(c, host_wait(c, NULL, ev->e), "event synchronize"); /* waits also after a failure, as sync() */
    if (failed(c)) {
        ftk_err_set("%s", c->err);
        return -1;
    }
    return 0;
}

/* ---- conversion ---------------------------------------------------------------------------- */

template <int K, typename TD, typename TS> __device__ __forceinline__ void convert_at(TD *dst, const TS *src, int64_t i)
{
    float x[K];
    ldk<K>(src, i, x);
    stk<K>(dst, i, x);
}
template <typename TD, typename TS> __global__ void convert_kernel(TD *dst, const TS *src, int64_t n, int vec)
{
    ELEMENTWISE(n, vec, convert_at, dst, src);
}

void cu_convert(backend_t *be, bk_buf_t dst, bk_buf_t src, int64_t n)
{
    cuda_t *c = enter(be);
    if (n == 0 || failed(c) || !dt_ok(c, "convert", dst.dt) || !dt_ok(c, "convert", src.dt))
        return;
    if (dst.dt == src.dt) {
        copy_bytes(c, dst.p, src.p, (size_t)n * dtype_size(dst.dt), "convert");
        return;
    }
    on_dt(dst.dt, [&](auto td) {
        on_dt(src.dt,
              [&](auto ts) {
                  int v = vec_ok(c, {dst.p, src.p});
                  convert_kernel<<<ew_blocks(n, v), 256, 0, c->cur>>>(AS(td, dst), AS(ts, src), n, v);
              });
    });
    launched(c, "convert");
}
