/* embedding_bag.cu - embedding bag kernels: one thread per output float
 * (bag x element forward, row x element backward). Each thread walks its
 * list in order, as the cpu backend does, so results do not depend on
 * scheduling: the backward gathers through the transpose of the batch's
 * index (CSR by row) instead of scattering with float atomics. */
#include "embedding_bag.cuh"
#include "grid.cuh"

static __global__ void bag_fwd_kernel(int nbags, int fields, int dim, int ldy, int nrows,
				      int mean, const float *rows, const int32_t *offsets,
				      const int32_t *idx, float *y)
{
	int total = nbags * dim, stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
		int b = i / dim, d = i % dim, first = offsets[b], end = offsets[b + 1];
		float acc = 0.0f;

		for (int e = first; e < end; e++) {
			int r = idx[e];
			if (r >= 0 && r < nrows)
				acc += rows[(size_t)r * dim + d];
		}
		if (mean && end - first > 1)
			acc *= 1.0f / (float)(end - first);
		y[(size_t)(b / fields) * ldy + (size_t)(b % fields) * dim + d] = acc;
	}
}

static __global__ void bag_bwd_kernel(int nbags, int fields, int dim, int ldy, int nrows,
				      int mean, const float *dy, const int32_t *offsets,
				      const int32_t *row_offsets, const int32_t *row_bags,
				      float *drows, float alpha)
{
	int total = nrows * dim, stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
		int r = i / dim, d = i % dim;
		float acc = 0.0f;

		for (int k = row_offsets[r]; k < row_offsets[r + 1]; k++) {
			int b = row_bags[k];
			if (b < 0 || b >= nbags)
				continue;
			int size = offsets[b + 1] - offsets[b];
			float w = mean && size > 1 ? 1.0f / (float)size : 1.0f;
			acc += w * dy[(size_t)(b / fields) * ldy + (size_t)(b % fields) * dim + d];
		}
		drows[(size_t)r * dim + d] = acc * alpha;
	}
}

extern "C" cudaError_t ps__cuda_bag_fwd(cudaStream_t st, int nbags, int fields, int dim, int ldy,
					int nrows, int mean, const float *rows,
					const int32_t *offsets, const int32_t *idx, float *y)
{
	size_t total = (size_t)nbags * (size_t)dim;

	if (total == 0)
		return cudaSuccess;
	if (!ps__fits_int(total))
		return cudaErrorInvalidValue;
	bag_fwd_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(nbags, fields, dim, ldy, nrows, mean,
							      rows, offsets, idx, y);
	return cudaGetLastError();
}

extern "C" cudaError_t ps__cuda_bag_bwd(cudaStream_t st, int nbags, int fields, int dim, int ldy,
					int nrows, int mean, const float *dy,
					const int32_t *offsets, const int32_t *row_offsets,
					const int32_t *row_bags, float *drows, float alpha)
{
	size_t total = (size_t)nrows * (size_t)dim;

	if (total == 0)
		return cudaSuccess;
	if (!ps__fits_int(total))
		return cudaErrorInvalidValue;
	bag_bwd_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(nbags, fields, dim, ldy, nrows, mean,
							      dy, offsets, row_offsets, row_bags,
							      drows, alpha);
	return cudaGetLastError();
}
