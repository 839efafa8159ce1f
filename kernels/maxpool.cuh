/* maxpool.cuh - max pooling on the cuda backend's stream (maxpool.cu). */
#ifndef PS_MAXPOOL_CUH
#define PS_MAXPOOL_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include "cuda_flags.h"

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t ps__cuda_maxpool_fwd(cudaStream_t st, const float *x, float *y, int32_t *idx,
				 size_t planes, int h, int w, int size, int oh, int ow);

/* dx = dy at the recorded maxima, 0 elsewhere. An idx entry outside its
 * own window (maxpool_fwd writes none) sets flags->bad_pool and then dx
 * is not written at all. */
cudaError_t ps__cuda_maxpool_bwd(cudaStream_t st, const float *dy, const int32_t *idx,
				 float *dx, size_t planes, int h, int w, int size, int oh, int ow,
				 struct ps__cuda_flags *flags);

#ifdef __cplusplus
}
#endif
#endif
