/* softmax_xent.cu - softmax cross-entropy kernels.
 *
 * Four steps on the stream, no host wait:
 *   check_kernel  every label, the first bad one into scratch (atomicMin);
 *   rows_kernel   one warp per example (rows are short: tens to thousands
 *                 of classes); each block sums its warps' examples into
 *                 one partial (a fixed number of blocks, at most
 *                 MAX_BLOCKS, chosen from n alone); writes nothing if a
 *                 label was bad;
 *   sum_kernel    one block adds the partials, each thread a fixed stride
 *                 of them, then a fixed tree;
 *   a copy of the result to the caller's pinned struct.
 * No atomics in the sums, so the loss is the same bit for bit on every run.
 */
#include <limits.h>
#include <math.h>
#include "softmax_xent.cuh"

#define WARPS 8                 /* warps (examples in flight) per block */
#define MAX_BLOCKS 256          /* bound of the partials in scratch */
#define SUM_THREADS 256
#define FULL 0xffffffffu
#define NO_BAD 0x7f7f7f7f       /* what cudaMemsetAsync(0x7f) leaves: > any n */

struct partial {
	double loss;
	int correct;
	int pad;
};

/* The scratch: partials, the first bad row, the result. */
struct scratch {
	struct partial parts[MAX_BLOCKS];
	int bad_row;
	int pad;
	struct ps_xent_stats result;
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

static __global__ void check_kernel(const int32_t *labels, int n, int classes, int *bad_row)
{
	for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < n; r += gridDim.x * blockDim.x)
		if (labels[r] < 0 || labels[r] >= classes)
			atomicMin(bad_row, r);
}

static __global__ void rows_kernel(const float *logits, const int32_t *labels, int n,
				   int classes, float *dlogits, struct scratch *sc)
{
	__shared__ double wloss[WARPS];
	__shared__ int wright[WARPS];
	int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	double loss = 0.0;
	int right = 0;

	if (sc->bad_row != NO_BAD)
		return;  /* a bad label: nothing is written */
	for (int r = blockIdx.x * WARPS + warp; r < n; r += gridDim.x * WARPS) {
		const float *z = logits + r * classes;
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
		if (dlogits) {
			float *d = dlogits + r * classes;
			float inv = 1.0f / sum;
			for (int j = lane; j < classes; j += 32)
				d[j] = expf(z[j] - max) * inv - (j == label ? 1.0f : 0.0f);
		}
		if (lane == 0) {
			loss += (double)logf(sum) - ((double)z[label] - (double)max);
			right += arg == label;
		}
	}
	if (lane == 0) {
		wloss[warp] = loss;
		wright[warp] = right;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		struct partial p = { 0.0, 0, 0 };
		for (int k = 0; k < WARPS; k++) {
			p.loss += wloss[k];
			p.correct += wright[k];
		}
		sc->parts[blockIdx.x] = p;
	}
}

static __global__ void sum_kernel(struct scratch *sc, int blocks, int n, const int32_t *labels)
{
	__shared__ double sl[SUM_THREADS];
	__shared__ int sr[SUM_THREADS];
	int t = threadIdx.x;
	double loss = 0.0;
	int right = 0;

	if (sc->bad_row != NO_BAD) {
		if (t == 0)
			sc->result = (struct ps_xent_stats){ 0.0, 0, sc->bad_row,
							     labels[sc->bad_row], n };
		return;
	}
	for (int b = t; b < blocks; b += SUM_THREADS) {
		loss += sc->parts[b].loss;
		right += sc->parts[b].correct;
	}
	sl[t] = loss;
	sr[t] = right;
	__syncthreads();
	for (int half = SUM_THREADS / 2; half > 0; half /= 2) {
		if (t < half) {
			sl[t] += sl[t + half];
			sr[t] += sr[t + half];
		}
		__syncthreads();
	}
	if (t == 0)
		sc->result = (struct ps_xent_stats){ sl[0], sr[0], -1, 0, n };
}

extern "C" size_t ps__cuda_xent_scratch_bytes(void)
{
	return sizeof(struct scratch);
}

extern "C" cudaError_t ps__cuda_softmax_xent(cudaStream_t st, const float *logits,
					     const int32_t *labels, int n, int classes,
					     float *dlogits, void *scratch,
					     struct ps_xent_stats *out)
{
	struct scratch *sc = (struct scratch *)scratch;
	int blocks = (n + WARPS - 1) / WARPS;
	cudaError_t e;

	/* int indices, a grid-stride step of margin */
	if (n <= 0 || classes <= 0 || (long long)n * classes > INT_MAX - 65536)
		return cudaErrorInvalidValue;
	if (blocks > MAX_BLOCKS)
		blocks = MAX_BLOCKS;
	if ((e = cudaMemsetAsync(&sc->bad_row, 0x7f, sizeof(int), st)) != cudaSuccess)
		return e;
	check_kernel<<<(n + 255) / 256 < 64 ? (n + 255) / 256 : 64, 256, 0, st>>>(labels, n, classes,
									      &sc->bad_row);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	rows_kernel<<<blocks, WARPS * 32, 0, st>>>(logits, labels, n, classes, dlogits, sc);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	sum_kernel<<<1, SUM_THREADS, 0, st>>>(sc, blocks, n, labels);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	return cudaMemcpyAsync(out, &sc->result, sizeof(*out), cudaMemcpyDeviceToHost, st);
}
