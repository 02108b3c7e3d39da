/* cuda_dl.c — backend_cuda_new(), backend_cuda_devices() and comm_nccl_ops() for the tools
 * that take --device, by opening the CUDA backend, libftk-cuda.so (kernels/cuda and
 * engine/comm_nccl.c, linked against libcudart and libcublasLt), at run time: the tools then
 * start, plan and train on the CPU where the CUDA libraries are not installed, and only
 * --device cuda says that they are missing (docs/gpu.md, "Without the CUDA libraries"). The
 * library is looked for beside the executable's folder ($ORIGIN/../lib: the build's lib/, a
 * bundle's lib/; $ORIGIN/../lib/ftk: an installation, wherever it was moved), then in the
 * installation's FTK_LIBDIR (PREFIX/lib/ftk, as built). The tools export their
 * symbols (-rdynamic), so the library's calls into libftk (ftk_err_set, the instance's
 * helpers) reach the tool's own copies: one error slot, one log.
 *
 * Lives in engine/ because comm_nccl_ops is an engine symbol; not in libftk.a (the Makefile
 * links it ahead of the library, whose comm_nccl_none.c it then replaces). The first call
 * loads; the tools make it from their main thread, before any team of threads. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/backend.h"
#include "../libcommon/log.h"
#include "comm_dev.h"

#ifndef FTK_LIBDIR
#define FTK_LIBDIR "/usr/local/lib/ftk"
#endif
#define CUDA_DL_NAME "libftk-cuda.so"

static int dl_tried;
static void *dl_handle;
static char dl_why[4 * PATH_MAX + 512];

/* 0 with dl_handle open, or -1 with dl_why saying what is missing (dlerror: a CUDA library
 * libftk-cuda.so needs, or where libftk-cuda.so itself was looked for). */
static int dl_load(void)
{
    if (dl_tried)
        return dl_handle ? 0 : -1;
    dl_tried = 1;
    char exe[PATH_MAX], cand[3][PATH_MAX + 32];
    int n_cand = 0;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cand[n_cand++], sizeof cand[0], "%s/../lib/%s", exe, CUDA_DL_NAME);
            snprintf(cand[n_cand++], sizeof cand[0], "%s/../lib/ftk/%s", exe, CUDA_DL_NAME);
        }
    }
    snprintf(cand[n_cand++], sizeof cand[0], "%s/%s", FTK_LIBDIR, CUDA_DL_NAME);
    for (int i = 0; i < n_cand; i++) {
        if (access(cand[i], F_OK) != 0)
            continue;
        dl_handle = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (dl_handle)
            return 0;
        const char *e = dlerror();
        snprintf(dl_why, sizeof dl_why, "cannot load the CUDA backend: %s (install the CUDA runtime and cuBLAS, "
                 "or put their folder on LD_LIBRARY_PATH)", e ? e : cand[i]);
        return -1;
    }
    int at = snprintf(dl_why, sizeof dl_why, "the CUDA backend %s is not found (looked for", CUDA_DL_NAME);
    for (int i = 0; i < n_cand && at > 0 && (size_t)at < sizeof dl_why; i++)
        at += snprintf(dl_why + at, sizeof dl_why - at, "%s %s", i ? "," : "", cand[i]);
    if (at > 0 && (size_t)at < sizeof dl_why)
        snprintf(dl_why + at, sizeof dl_why - at, "): this build or installation has no GPU path");
    return -1;
}

/* The symbol from the library, or NULL with ftk_err_msg() saying why. */
static void *dl_sym(const char *name)
{
    if (dl_load() < 0) {
        ftk_err_set("%s", dl_why);
        return NULL;
    }
    void *f = dlsym(dl_handle, name);
    if (!f)
        ftk_err_set("the CUDA backend has no %s: %s", name, dlerror());
    return f;
}

backend_t *backend_cuda_new(int device)
{
    backend_t *(*f)(int) = (backend_t * (*)(int)) dl_sym("backend_cuda_new");
    return f ? f(device) : NULL;
}

/* No library, no GPU: 0, as in a build without CUDA; --device cuda then asks
 * backend_cuda_new, which names what is missing. */
int backend_cuda_devices(void)
{
    if (dl_load() < 0)
        return 0;
    int (*f)(void) = (int (*)(void))dlsym(dl_handle, "backend_cuda_devices");
    return f ? f() : 0;
}

/* The library's comm_nccl_ops (engine/comm_nccl.c): absent where it was built without nccl.h. */
const comm_dev_ops_t *comm_nccl_ops(void)
{
    if (dl_load() < 0) {
        ftk_err_set("%s", dl_why);
        return NULL;
    }
    const comm_dev_ops_t *(*f)(void) = (const comm_dev_ops_t *(*)(void))dlsym(dl_handle, "comm_nccl_ops");
    if (!f) {
        ftk_err_set("this build has no NCCL (nccl.h was not found when it was built)");
        return NULL;
    }
    return f();
}
