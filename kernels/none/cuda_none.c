/* cuda_none.c — backend_cuda_new() in a build without nvcc (and in the sanitizer build):
 * the tools that take --device link this instead of kernels/cuda/, so they build and
 * say why there is no GPU path rather than failing to link. */
#include "../../libcommon/log.h"
#include "../backend.h"

backend_t *backend_cuda_new(int device)
{
    (void)device;
    ftk_err_set("this build has no CUDA backend (nvcc was not found when it was built; see the README)");
    return NULL;
}

int backend_cuda_devices(void) { return 0; }
