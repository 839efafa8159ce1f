/* relu.cuh - relu forward and backward on the cuda backend's stream. */
#ifndef PS_RELU_CUH
#define PS_RELU_CUH

#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues y = x > 0 ? x : 0 over n floats (NaN gives 0, as the cpu backend). */
cudaError_t ps__cuda_relu_fwd(cudaStream_t st, const float *x, float *y, size_t n);

/* Queues dx = y > 0 ? dy : 0 over n floats, y being relu_fwd's output. */
cudaError_t ps__cuda_relu_bwd(cudaStream_t st, const float *y, const float *dy, float *dx,
			      size_t n);

#ifdef __cplusplus
}
#endif
#endif
