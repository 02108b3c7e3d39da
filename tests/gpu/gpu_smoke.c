/* GPU smoke test: skipped (exit 77) without a GPU; otherwise runs a kernel and checks it. */
#include <stdio.h>

#include "../../kernels/cuda/device.h"

int main(void)
{
    int n = ftk_cuda_device_count();
    if (n == 0) {
        printf("skipped (no GPU)\n");
        return 77;
    }
    char name[256] = "?";
    ftk_cuda_device_name(0, name, sizeof name);
    double err = ftk_cuda_axpy_check(1 << 20);
    printf("%d device(s), device 0: %s; axpy max error %g\n", n, name, err);
    return err >= 0 && err < 1e-5 ? 0 : 1;
}
