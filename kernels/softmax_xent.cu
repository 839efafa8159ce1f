/* softmax_xent.cu - softmax cross-entropy kernels.
 *
 * One warp per example (rows are short: tens to thousands of classes). Two
 * launches: rows_kernel has each block sum its warps' examples into one
 * partial (a fixed number of blocks, at most MAX_BLOCKS, chosen from n
 * alone); sum_kernel adds the partials in block order. No atomics, so the
 * loss is the same bit for bit on every run.
 */
#include <limits.h>
#include <math.h>
#include "softmax_xent.cuh"

#define WARPS 8                 /* warps (examples in flight) per block */
#define MAX_BLOCKS 256          /* bound of the partials in scratch */
#define FULL 0xffffffffu

struct partial {
	double loss;
	int correct;
	int bad_row;                /* smallest bad row in the block, or INT_MAX */
};

/* Max with its first index across a warp; ties go to the smaller index. */
static __device__ void warp_argmax(float *v, int *i)
{
	for (int off = 16; off > 0; off /= 2) {
		float ov = __shfl_xor_sync(FULL, *v, off);
		int oi = __shfl_xor_sync(FULL, *i, off);
		if (ov > *v || (ov == *v && oi < *i)) {
			*v = ov;
			*i = oi;
		}
	}
}

static __device__ float warp_sum(float v)
{
	for (int off = 16; off > 0; off /= 2)
		v += __shfl_xor_sync(FULL, v, off);
	return v;
}

static __global__ void rows_kernel(const float *logits, const int32_t *labels, int n,
				   int classes, float *dlogits, struct partial *parts)
{
	__shared__ double wloss[WARPS];
	__shared__ int wright[WARPS], wbad[WARPS];
	int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	double loss = 0.0;
	int right = 0, bad = INT_MAX;

	for (int r = blockIdx.x * WARPS + warp; r < n; r += gridDim.x * WARPS) {
		const float *z = logits + (size_t)r * classes;
		int label = labels[r];
		float max = -INFINITY;
		int arg = INT_MAX;

		/* First maximum, as the cpu backend's strict > scan finds it: each
		 * lane scans its columns in order, the warp keeps the lowest index. */
		if (lane < classes) {
			max = z[lane];
			arg = lane;
		}
		for (int j = lane + 32; j < classes; j += 32)
			if (z[j] > max) {
				max = z[j];
				arg = j;
			}
		warp_argmax(&max, &arg);
		float sum = 0.0f;
		for (int j = lane; j < classes; j += 32)
			sum += expf(z[j] - max);
		sum = warp_sum(sum);
		int valid = label >= 0 && label < classes;
		if (dlogits) {
			float *d = dlogits + (size_t)r * classes;
			float inv = 1.0f / (sum * (float)n);
			for (int j = lane; j < classes; j += 32)
				d[j] = expf(z[j] - max) * inv - (j == label ? 1.0f / (float)n : 0.0f);
		}
		if (lane == 0) {
			if (valid) {
				loss += (double)logf(sum) - ((double)z[label] - (double)max);
				right += arg == label;
			} else if (r < bad) {
				bad = r;
			}
		}
	}
	if (lane == 0) {
		wloss[warp] = loss;
		wright[warp] = right;
		wbad[warp] = bad;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		struct partial p = { 0.0, 0, INT_MAX };
		for (int k = 0; k < WARPS; k++) {
			p.loss += wloss[k];
			p.correct += wright[k];
			if (wbad[k] < p.bad_row)
				p.bad_row = wbad[k];
		}
		parts[blockIdx.x] = p;
	}
}

static __global__ void sum_kernel(const struct partial *parts, int blocks,
				  const int32_t *labels, struct ps__xent_result *out)
{
	struct ps__xent_result res = { 0.0, 0, -1, 0, 0 };
	int bad = INT_MAX;

	for (int b = 0; b < blocks; b++) {
		res.loss_sum += parts[b].loss;
		res.correct += parts[b].correct;
		if (parts[b].bad_row < bad)
			bad = parts[b].bad_row;
	}
	if (bad != INT_MAX) {
		res.bad_row = bad;
		res.bad_label = labels[bad];
	}
	*out = res;
}

extern "C" size_t ps__cuda_xent_scratch_bytes(void)
{
	return MAX_BLOCKS * sizeof(struct partial);
}

extern "C" cudaError_t ps__cuda_softmax_xent(cudaStream_t st, const float *logits,
					     const int32_t *labels, int n, int classes,
					     float *dlogits, void *scratch,
					     struct ps__xent_result *out)
{
	int blocks = (n + WARPS - 1) / WARPS;

	if (n <= 0 || classes <= 0)
		return cudaErrorInvalidValue;
	if (blocks > MAX_BLOCKS)
		blocks = MAX_BLOCKS;
	rows_kernel<<<blocks, WARPS * 32, 0, st>>>(logits, labels, n, classes, dlogits,
						   (struct partial *)scratch);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	sum_kernel<<<1, 1, 0, st>>>((const struct partial *)scratch, blocks, labels, out);
	return cudaGetLastError();
}
