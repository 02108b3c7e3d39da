#include <cuda_runtime.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

extern "C" int ftk_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

extern "C" int ftk_cuda_device_name(int dev, char *buf, int n)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess)
        return -1;
    strncpy(buf, p.name, (size_t)n - 1);
    buf[n - 1] = 0;
    return 0;
}

__global__ void axpy_kernel(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i] + y[i];
}

extern "C" double ftk_cuda_axpy_check(int n)
{
    float *hx = (float *)malloc(sizeof(float) * (size_t)n), *hy = (float *)malloc(sizeof(float) * (size_t)n);
    float *dx = NULL, *dy = NULL;
    double err = -1;
    if (!hx || !hy)
        goto out;
    for (int i = 0; i < n; i++) {
        hx[i] = (float)(i % 97) * 0.25f;
        hy[i] = (float)(i % 13) - 6.0f;
    }
    if (cudaMalloc(&dx, sizeof(float) * (size_t)n) != cudaSuccess ||
        cudaMalloc(&dy, sizeof(float) * (size_t)n) != cudaSuccess ||
        cudaMemcpy(dx, hx, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dy, hy, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice) != cudaSuccess)
        goto out;
    axpy_kernel<<<(n + 255) / 256, 256>>>(n, 1.5f, dx, dy);
    if (cudaGetLastError() != cudaSuccess ||
        cudaMemcpy(hx, dy, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost) != cudaSuccess)
        goto out;
    err = 0;
    for (int i = 0; i < n; i++) {
        double want = 1.5 * ((double)(i % 97) * 0.25) + ((double)(i % 13) - 6.0);
        double d = fabs((double)hx[i] - want);
        if (d > err)
            err = d;
    }
out:
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    return err;
}
