/* bias.cu - bias add (forward) and bias gradient (backward) kernels.
 *
 * The gradient is a reduction per channel. Two shapes of it:
 *   spatial == 1 (dense): a channel's values are a column of dy; a block
 *     takes 32 adjacent columns so each row read is one coalesced segment,
 *     and its 8 thread rows stride down the batch;
 *   spatial > 1 (conv): a channel's values are n runs of oh*ow contiguous
 *     floats; one block per channel sums them.
 * Each thread keeps a private sum in a fixed order and the block combines
 * them in a fixed tree, so results do not depend on scheduling.
 */
#include "bias.cuh"
#include "grid.cuh"

#define COLS 32      /* dense: channels per block (one warp wide) */
#define ROWS 8       /* dense: thread rows striding down the batch */

static __global__ void bias_add_kernel(float *y, const float *b, size_t total, int channels,
				       size_t spatial)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
		y[i] += b[(i / spatial) % (size_t)channels];
}

static __global__ void bias_grad_cols_kernel(float *db, const float *dy, size_t rows,
					     int channels)
{
	__shared__ float part[ROWS][COLS + 1];
	int col = blockIdx.x * COLS + threadIdx.x;
	float sum = 0.0f;

	if (col < channels)
		for (size_t r = threadIdx.y; r < rows; r += ROWS)
			sum += dy[r * (size_t)channels + col];
	part[threadIdx.y][threadIdx.x] = sum;
	__syncthreads();
	if (threadIdx.y == 0 && col < channels) {
		for (int k = 1; k < ROWS; k++)
			sum += part[k][threadIdx.x];
		db[col] = sum;
	}
}

static __global__ void bias_grad_planes_kernel(float *db, const float *dy, size_t outer,
					       int channels, size_t spatial)
{
	__shared__ float part[PS__BLOCK];
	int ch = blockIdx.x;
	size_t per = outer * spatial;
	float sum = 0.0f;

	for (size_t i = threadIdx.x; i < per; i += PS__BLOCK) {
		size_t o = i / spatial, s = i - o * spatial;
		sum += dy[(o * (size_t)channels + ch) * spatial + s];
	}
	part[threadIdx.x] = sum;
	__syncthreads();
	for (int half = PS__BLOCK / 2; half > 0; half /= 2) {
		if ((int)threadIdx.x < half)
			part[threadIdx.x] += part[threadIdx.x + half];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		db[ch] = part[0];
}

extern "C" cudaError_t ps__cuda_bias_add(cudaStream_t st, float *y, const float *b,
					 size_t outer, int channels, size_t spatial)
{
	size_t total = outer * (size_t)channels * spatial;

	if (total == 0)
		return cudaSuccess;
	bias_add_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(y, b, total, channels, spatial);
	return cudaGetLastError();
}

extern "C" cudaError_t ps__cuda_bias_grad(cudaStream_t st, float *db, const float *dy,
					  size_t outer, int channels, size_t spatial)
{
	if (channels <= 0)
		return cudaSuccess;
	if (outer == 0 || spatial == 0)
		return cudaMemsetAsync(db, 0, (size_t)channels * sizeof(float), st);
	if (spatial == 1) {
		dim3 block(COLS, ROWS);
		unsigned int blocks = (unsigned int)((channels + COLS - 1) / COLS);
		bias_grad_cols_kernel<<<blocks, block, 0, st>>>(db, dy, outer, channels);
	} else {
		bias_grad_planes_kernel<<<channels, PS__BLOCK, 0, st>>>(db, dy, outer, channels,
									spatial);
	}
	return cudaGetLastError();
}
