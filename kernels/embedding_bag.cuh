/* embedding_bag.cuh - embedding bag forward and backward on the cuda
 * backend's stream (layout: struct ps_bag_shape, common/compute.h). */
#ifndef PS_EMBEDDING_BAG_CUH
#define PS_EMBEDDING_BAG_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues y's bag slots = sum (mean: / size) of each bag's rows; entries
 * whose idx is outside 0..nrows-1 are left out. */
cudaError_t ps__cuda_bag_fwd(cudaStream_t st, int nbags, int fields, int dim, int ldy,
			     int nrows, int mean, const float *rows, const int32_t *offsets,
			     const int32_t *idx, float *y);

/* Queues drows[r] = alpha * sum over row r's bags (row_offsets/row_bags,
 * in their order) of w * dy slot, w = 1 or 1/size (mean): one thread per
 * (row, element), so the sum order is fixed and no atomics are used. */
cudaError_t ps__cuda_bag_bwd(cudaStream_t st, int nbags, int fields, int dim, int ldy,
			     int nrows, int mean, const float *dy, const int32_t *offsets,
			     const int32_t *row_offsets, const int32_t *row_bags, float *drows,
			     float alpha);

#ifdef __cplusplus
}
#endif
#endif
