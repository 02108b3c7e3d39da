/* device.h — the CUDA runtime probe and a smoke kernel, callable from C.
 *
 * The backend itself is kernels/cuda/cuda.cu and its op families; this needs only the runtime,
 * so the test suite can say "skipped (no GPU)" or run one real kernel before the op
 * tests (tests/gpu/).
 */
#ifndef FTK_CUDA_DEVICE_H
#define FTK_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no device. */
int ftk_cuda_device_count(void);

/* Name of device `dev` into buf (n bytes). Returns 0 or -1. */
int ftk_cuda_device_name(int dev, char *buf, int n);

/* Runs y = a*x + y on n floats on device 0 and compares with the host result.
 * Returns the largest absolute difference, or a negative value on a CUDA error. */
double ftk_cuda_axpy_check(int n);

#ifdef __cplusplus
}
#endif

#endif
