/* bias.cuh - per-channel bias of dense and conv2d layers on the cuda
 * backend's stream.
 *
 * Both views of a layer output are [outer, channels, spatial]:
 *   dense   y[n, out]            outer = n, channels = out, spatial = 1
 *   conv2d  y[n, k, oh, ow]      outer = n, channels = k,   spatial = oh * ow
 */
#ifndef PS_BIAS_CUH
#define PS_BIAS_CUH

#include <stddef.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues y[o, ch, s] += b[ch]. */
cudaError_t ps__cuda_bias_add(cudaStream_t st, float *y, const float *b, size_t outer,
			      int channels, size_t spatial);

/* Queues db[ch] = sum over o, s of dy[o, ch, s] (overwritten, not
 * accumulated). The summation order is fixed, so results repeat bit for bit. */
cudaError_t ps__cuda_bias_grad(cudaStream_t st, float *db, const float *dy, size_t outer,
			       int channels, size_t spatial);

#ifdef __cplusplus
}
#endif
#endif
