/* bias.cuh - bias add and bias gradient on the cuda backend's stream
 * (bias.cu). A tensor is outer x channels x spatial: dense layers have
 * spatial 1 (outer = batch), convolutions outer = batch, spatial = oh*ow. */
#ifndef PS_BIAS_CUH
#define PS_BIAS_CUH

#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[o, c, s] += b[c]. */
cudaError_t ps__cuda_bias_add(cudaStream_t st, float *y, const float *b, size_t outer,
			      int channels, size_t spatial);

/* Floats of device scratch bias_grad needs at most. */
#define PS__BIAS_SCRATCH_FLOATS (1 << 18)

/* db[c] = alpha * sum over o, s of dy[o, c, s], in two passes through
 * scratch (PS__BIAS_SCRATCH_FLOATS floats of device memory) so that about
 * 2 blocks per SM (sms: the device's multiprocessor count) share the work
 * whatever the channel count; sums run in a fixed order, so results repeat
 * bit for bit. */
cudaError_t ps__cuda_bias_grad(cudaStream_t st, float *db, const float *dy, size_t outer,
			       int channels, size_t spatial, float alpha, float *scratch, int sms);

#ifdef __cplusplus
}
#endif
#endif
