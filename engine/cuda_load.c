/* cuda_load.c — the loader of the CUDA library (cuda_load.h). In libftk.a, compiled with
 * CUDA_LOAD_LIB=1 (and FTK_LIBDIR) in a build that makes libftk-cuda.so, 0 in one that does
 * not; the program's own table is looked for in every build. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../libcommon/log.h"
#include "cuda_load.h"

#ifndef CUDA_LOAD_LIB
#define CUDA_LOAD_LIB 0
#endif
#ifndef FTK_LIBDIR
#define FTK_LIBDIR "/usr/local/lib/ftk"
#endif
#define CUDA_LOAD_SO "libftk-cuda.so"

typedef const cuda_lib_t *(*cuda_lib_entry_fn)(void);

static int load_tried;
static const cuda_lib_t *load_lib;
static int load_linked; /* the table is the program's own (cuda_load.h, 1) */
static char load_why[4 * PATH_MAX + 512];

/* libftk-cuda.so opened, or NULL with load_why saying what is missing (dlerror: a CUDA
 * library libftk-cuda.so needs, or where libftk-cuda.so itself was looked for). */
static void *load_open(void)
{
    char exe[PATH_MAX], cand[3][PATH_MAX + 32];
    int n_cand = 0;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(cand[n_cand++], sizeof cand[0], "%s/../lib/%s", exe, CUDA_LOAD_SO);
            snprintf(cand[n_cand++], sizeof cand[0], "%s/../lib/ftk/%s", exe, CUDA_LOAD_SO);
        }
    }
    snprintf(cand[n_cand++], sizeof cand[0], "%s/%s", FTK_LIBDIR, CUDA_LOAD_SO);
    for (int i = 0; i < n_cand; i++) {
        if (access(cand[i], F_OK) != 0)
            continue;
        void *handle = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (handle)
            return handle;
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why, "cannot load the CUDA backend: %s (install the CUDA runtime and cuBLAS, "
                 "or put their folder on LD_LIBRARY_PATH)", e ? e : cand[i]);
        return NULL;
    }
    int at = snprintf(load_why, sizeof load_why, "the CUDA backend %s is not found (looked for", CUDA_LOAD_SO);
    for (int i = 0; i < n_cand && at > 0 && (size_t)at < sizeof load_why; i++)
        at += snprintf(load_why + at, sizeof load_why - at, "%s %s", i ? "," : "", cand[i]);
    if (at > 0 && (size_t)at < sizeof load_why)
        snprintf(load_why + at, sizeof load_why - at, "): this build or installation has no GPU path");
    return NULL;
}

/* load_lib from the program itself, else from libftk-cuda.so; else load_why says why. */
static void load_find(void)
{
    cuda_lib_entry_fn entry = (cuda_lib_entry_fn)dlsym(RTLD_DEFAULT, CUDA_LIB_ENTRY);
    if (entry) {
        load_linked = 1;
        load_lib = entry();
        return;
    }
    if (!CUDA_LOAD_LIB) {
        snprintf(load_why, sizeof load_why,
                 "this build has no CUDA backend (nvcc was not found when it was built; see the README)");
        return;
    }
    void *handle = load_open();
    if (!handle)
        return;
    entry = (cuda_lib_entry_fn)dlsym(handle, CUDA_LIB_ENTRY);
    if (entry)
        load_lib = entry();
    else
        snprintf(load_why, sizeof load_why, "the CUDA backend has no %s: %s", CUDA_LIB_ENTRY, dlerror());
}

/* The table or NULL, leaving the error slot alone. */
static const cuda_lib_t *load_get(void)
{
    if (!load_tried) {
        load_tried = 1;
        load_find();
    }
    return load_lib;
}

const cuda_lib_t *cuda_load(void)
{
    if (!load_get())
        ftk_err_set("%s", load_why);
    return load_lib;
}

backend_t *cuda_load_backend(int device)
{
    const cuda_lib_t *lib = cuda_load();
    return lib ? lib->backend_new(device) : NULL;
}

int cuda_load_devices(void)
{
    const cuda_lib_t *lib = load_get();
    return lib ? lib->devices() : 0;
}

/* Where the program carries no library and the build made none, or carries one built
 * without NCCL, the answer names both things the build lacked; a library opened at run
 * time was built with nvcc, so only nccl.h can have been missing. */
const comm_dev_ops_t *cuda_load_nccl(void)
{
    const cuda_lib_t *lib = cuda_load();
    if ((!lib && !CUDA_LOAD_LIB) || (lib && load_linked && !lib->nccl_ops)) {
        ftk_err_set("this build has no NCCL (nvcc or nccl.h was not found when it was built)");
        return NULL;
    }
    if (!lib)
        return NULL;
    if (!lib->nccl_ops) {
        ftk_err_set("this build has no NCCL (nccl.h was not found when it was built)");
        return NULL;
    }
    return lib->nccl_ops();
}
