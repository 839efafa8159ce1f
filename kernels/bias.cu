/* bias.cu - bias add (forward) and bias gradient (backward) kernels.
 *
 * The gradient is a reduction per channel, in two passes so that a layer
 * with few channels (10 classes, 32 filters) still spreads over every SM:
 *   pass 1: the reduction of each channel is cut into `splits` ranges;
 *     block (channel group, split) writes one partial per channel;
 *       spatial == 1 (dense): a channel's values are a column of dy; a
 *         block takes 32 adjacent columns so each row read is one
 *         coalesced segment, its 8 thread rows striding down its rows;
 *       spatial > 1 (conv): a channel's values are outer runs of spatial
 *         contiguous floats; a block sums its range of runs.
 *   pass 2: one thread per channel adds its partials in split order and
 *     multiplies by alpha (the 1/batch and 1/workers of the step).
 * Each thread keeps a private sum in a fixed order and blocks combine in a
 * fixed tree, so results do not depend on scheduling.
 */
#include "bias.cuh"
#include "grid.cuh"

#define COLS 32      /* dense: channels per block (one warp wide) */
#define ROWS 8       /* dense: thread rows striding down the batch */
#define MAX_SPLITS 256

static __global__ void bias_add_kernel(float *y, const float *b, int total, int channels,
				       int spatial)
{
	int stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
		y[i] += b[(i / spatial) % channels];
}

/* Dense: block (x: 32 columns, y: split) sums rows [r0, r1) of its columns. */
static __global__ void grad_cols_kernel(float *part, const float *dy, int rows, int channels,
					int per_split)
{
	__shared__ float sh[ROWS][COLS + 1];
	int col = blockIdx.x * COLS + threadIdx.x;
	int r0 = blockIdx.y * per_split, r1 = min(rows, r0 + per_split);
	float sum = 0.0f;

	if (col < channels)
		for (int r = r0 + threadIdx.y; r < r1; r += ROWS)
			sum += dy[r * channels + col];
	sh[threadIdx.y][threadIdx.x] = sum;
	__syncthreads();
	if (threadIdx.y == 0 && col < channels) {
		for (int k = 1; k < ROWS; k++)
			sum += sh[k][threadIdx.x];
		part[blockIdx.y * channels + col] = sum;
	}
}

/* Conv: block (x: channel, y: split) sums runs [o0, o1) of its channel. */
static __global__ void grad_planes_kernel(float *part, const float *dy, int outer, int channels,
					  int spatial, int per_split)
{
	__shared__ float sh[PS__BLOCK];
	int ch = blockIdx.x;
	int o0 = blockIdx.y * per_split, o1 = min(outer, o0 + per_split);
	int count = (o1 > o0 ? o1 - o0 : 0) * spatial;
	float sum = 0.0f;

	for (int i = threadIdx.x; i < count; i += PS__BLOCK) {
		int o = o0 + i / spatial, s = i % spatial;
		sum += dy[(o * channels + ch) * spatial + s];
	}
	sh[threadIdx.x] = sum;
	__syncthreads();
	for (int half = PS__BLOCK / 2; half > 0; half /= 2) {
		if ((int)threadIdx.x < half)
			sh[threadIdx.x] += sh[threadIdx.x + half];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		part[blockIdx.y * channels + ch] = sh[0];
}

static __global__ void grad_sum_kernel(float *db, const float *part, int channels, int splits,
				       float alpha)
{
	int ch = blockIdx.x * blockDim.x + threadIdx.x;
	float sum = 0.0f;

	if (ch >= channels)
		return;
	for (int k = 0; k < splits; k++)
		sum += part[k * channels + ch];
	db[ch] = alpha * sum;
}

extern "C" cudaError_t ps__cuda_bias_add(cudaStream_t st, float *y, const float *b,
					 size_t outer, int channels, size_t spatial)
{
	size_t total = outer * (size_t)channels * spatial;

	if (total == 0)
		return cudaSuccess;
	if (!ps__fits_int(total))
		return cudaErrorInvalidValue;
	bias_add_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(y, b, (int)total, channels,
							       (int)spatial);
	return cudaGetLastError();
}

/* Splits of a reduction of `len` items among `groups` block columns so
 * that about 2 blocks per SM run, each split at least `min_len` long, and
 * splits x channels partials fit the scratch. */
static int pick_splits(size_t len, int groups, int channels, int sms, int min_len)
{
	long want = (2L * (sms > 0 ? sms : 132) + groups - 1) / groups;
	long most = (long)((len + min_len - 1) / min_len);

	if (want > most)
		want = most;
	if (want > MAX_SPLITS)
		want = MAX_SPLITS;
	if (want * channels > PS__BIAS_SCRATCH_FLOATS)
		want = PS__BIAS_SCRATCH_FLOATS / channels;
	return want < 1 ? 1 : (int)want;
}

extern "C" cudaError_t ps__cuda_bias_grad(cudaStream_t st, float *db, const float *dy,
					  size_t outer, int channels, size_t spatial, float alpha,
					  float *scratch, int sms)
{
	int splits, per;

	if (channels <= 0)
		return cudaSuccess;
	if (outer == 0 || spatial == 0)
		return cudaMemsetAsync(db, 0, (size_t)channels * sizeof(float), st);
	if (!ps__fits_int(outer * (size_t)channels * spatial) ||
	    channels > PS__BIAS_SCRATCH_FLOATS)
		return cudaErrorInvalidValue;
	if (spatial == 1) {
		int groups = (channels + COLS - 1) / COLS;
		splits = pick_splits(outer, groups, channels, sms, ROWS);
		per = (int)((outer + splits - 1) / splits);
		splits = (int)((outer + per - 1) / per);
		dim3 grid(groups, splits), block(COLS, ROWS);
		grad_cols_kernel<<<grid, block, 0, st>>>(scratch, dy, (int)outer, channels, per);
	} else {
		splits = pick_splits(outer, channels, channels, sms, 1);
		per = (int)((outer + splits - 1) / splits);
		splits = (int)((outer + per - 1) / per);
		dim3 grid(channels, splits);
		grad_planes_kernel<<<grid, PS__BLOCK, 0, st>>>(scratch, dy, (int)outer, channels,
							       (int)spatial, per);
	}
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	grad_sum_kernel<<<(channels + PS__BLOCK - 1) / PS__BLOCK, PS__BLOCK, 0, st>>>(
		db, scratch, channels, splits, alpha);
	return cudaGetLastError();
}
