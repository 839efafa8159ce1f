/* scale.cuh - y = a * x over n floats on the cuda backend's stream. */
#ifndef PS_SCALE_CUH
#define PS_SCALE_CUH

#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues y[i] = a * x[i] for i < n (y == x allowed); returns the launch
 * error, if any (cudaGetLastError). */
cudaError_t ps__cuda_scale(cudaStream_t st, float *y, const float *x, float a, size_t n);

#ifdef __cplusplus
}
#endif
#endif
