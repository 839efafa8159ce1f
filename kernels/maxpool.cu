/* maxpool.cu - max pooling kernels: one thread per output element. */
#include "maxpool.cuh"
#include "grid.cuh"

static __global__ void maxpool_fwd_kernel(const float *x, float *y, int32_t *idx, size_t total,
					  int h, int w, int size, int oh, int ow)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
		int ox = (int)(o % (size_t)ow);
		size_t t = o / (size_t)ow;
		int oy = (int)(t % (size_t)oh);
		size_t p = t / (size_t)oh;
		const float *xp = x + p * (size_t)h * w;
		int y0 = oy * size, x0 = ox * size;
		int best = y0 * w + x0;
		float bv = xp[best];

		for (int dy = 0; dy < size; dy++) {
			const float *r = xp + (size_t)(y0 + dy) * w + x0;
			for (int dx = 0; dx < size; dx++) {
				if (r[dx] > bv) {
					bv = r[dx];
					best = (y0 + dy) * w + x0 + dx;
				}
			}
		}
		y[o] = bv;
		idx[o] = best;
	}
}

static __global__ void maxpool_bwd_kernel(const float *dy, const int32_t *idx, float *dx,
					  size_t total, size_t in_plane, size_t out_plane)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
		int32_t at = idx[o];
		if (at >= 0 && (size_t)at < in_plane)
			dx[(o / out_plane) * in_plane + (size_t)at] = dy[o];
	}
}

extern "C" cudaError_t ps__cuda_maxpool_fwd(cudaStream_t st, const float *x, float *y,
					    int32_t *idx, size_t planes, int h, int w, int size,
					    int oh, int ow)
{
	size_t total = planes * (size_t)oh * ow;

	if (total == 0)
		return cudaSuccess;
	maxpool_fwd_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(x, y, idx, total, h, w, size,
								 oh, ow);
	return cudaGetLastError();
}

extern "C" cudaError_t ps__cuda_maxpool_bwd(cudaStream_t st, const float *dy,
					    const int32_t *idx, float *dx, size_t planes, int h,
					    int w, int oh, int ow)
{
	size_t in_plane = (size_t)h * w, out_plane = (size_t)oh * ow;
	size_t total = planes * out_plane;
	cudaError_t e = cudaMemsetAsync(dx, 0, planes * in_plane * sizeof(float), st);

	if (e != cudaSuccess || total == 0)
		return e;
	maxpool_bwd_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(dy, idx, dx, total, in_plane,
								 out_plane);
	return cudaGetLastError();
}
