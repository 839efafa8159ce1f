/* maxpool.cuh - max pooling with window = stride = size on the cuda
 * backend's stream, NCHW. idx holds, per output, the position iy * w + ix
 * of its maximum inside the (n, c) plane: the cpu backend's convention. */
#ifndef PS_MAXPOOL_CUH
#define PS_MAXPOOL_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues y[p, oy, ox] = max of the size x size window and idx = its
 * position, for planes p < planes (n * c). The first maximum in row-major
 * window order wins ties. */
cudaError_t ps__cuda_maxpool_fwd(cudaStream_t st, const float *x, float *y, int32_t *idx,
				 size_t planes, int h, int w, int size, int oh, int ow);

/* Queues dx = 0, then dx[p, idx] = dy[p, oy, ox] for every output. Windows
 * do not overlap, so no two outputs write the same input. */
cudaError_t ps__cuda_maxpool_bwd(cudaStream_t st, const float *dy, const int32_t *idx,
				 float *dx, size_t planes, int h, int w, int oh, int ow);

#ifdef __cplusplus
}
#endif
#endif
