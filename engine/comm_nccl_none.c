/* comm_nccl_none.c — comm_nccl_ops() in a build without NCCL (no nvcc, or no nccl.h; and
 * the sanitizer build): the library's default. A build with NCCL links
 * engine/comm_nccl.c ahead of the library, whose definition then wins (Makefile). */
#include "../libcommon/log.h"
#include "comm_dev.h"

const comm_dev_ops_t *comm_nccl_ops(void)
{
    ftk_err_set("this build has no NCCL (nvcc or nccl.h was not found when it was built)");
    return NULL;
}
