/* maxpool.cu - max pooling kernels.
 *
 * Forward: one thread per output element. Backward is a gather, one thread
 * per input element: windows do not overlap (stride = size), so each input
 * has at most one output whose window holds it, and dx is written once,
 * without atomics or a separate zeroing pass. A check pass before it
 * refuses indices maxpool_fwd cannot have written (outside the window), as
 * the cpu backend does, and then nothing is written. */
#include "maxpool.cuh"
#include "grid.cuh"

static __global__ void maxpool_fwd_kernel(const float *x, float *y, int32_t *idx, int total,
					  int h, int w, int size, int oh, int ow)
{
	int stride = gridDim.x * blockDim.x;

	for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
		int ox = o % ow, t = o / ow;
		int oy = t % oh, p = t / oh;
		const float *xp = x + p * h * w;
		int y0 = oy * size, x0 = ox * size;
		int best = y0 * w + x0;
		float bv = xp[best];

		for (int dy = 0; dy < size; dy++) {
			const float *r = xp + (y0 + dy) * w + x0;
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

static __global__ void maxpool_check_kernel(const int32_t *idx, int total, int w, int size,
					    int oh, int ow, struct ps__cuda_flags *flags)
{
	int stride = gridDim.x * blockDim.x;

	for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
		int at = idx[o], oo = o % (oh * ow);
		int oy = oo / ow, ox = oo % ow;
		int iy = at / w, ix = at % w;
		if (at < 0 || iy / size != oy || ix / size != ox) {
			if (atomicCAS(&flags->bad_pool, 0, 1) == 0) {
				flags->bad_pool_value = at;
				flags->bad_pool_at = o;
			}
		}
	}
}

static __global__ void maxpool_bwd_kernel(const float *dy, const int32_t *idx, float *dx,
					  int total, int h, int w, int size, int oh, int ow,
					  const struct ps__cuda_flags *flags)
{
	int stride = gridDim.x * blockDim.x, plane = h * w;

	if (flags->bad_pool)
		return;
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
		int p = i / plane, r = i % plane;
		int oy = (r / w) / size, ox = (r % w) / size;
		float v = 0.0f;
		if (oy < oh && ox < ow) {
			int o = (p * oh + oy) * ow + ox;
			if (idx[o] == r)
				v = dy[o];
		}
		dx[i] = v;
	}
}

extern "C" cudaError_t ps__cuda_maxpool_fwd(cudaStream_t st, const float *x, float *y,
					    int32_t *idx, size_t planes, int h, int w, int size,
					    int oh, int ow)
{
	size_t total = planes * (size_t)oh * ow;

	if (total == 0)
		return cudaSuccess;
	if (!ps__fits_int(planes * (size_t)h * w))
		return cudaErrorInvalidValue;
	maxpool_fwd_kernel<<<ps__grid(total), PS__BLOCK, 0, st>>>(x, y, idx, (int)total, h, w,
								 size, oh, ow);
	return cudaGetLastError();
}

extern "C" cudaError_t ps__cuda_maxpool_bwd(cudaStream_t st, const float *dy,
					    const int32_t *idx, float *dx, size_t planes, int h,
					    int w, int size, int oh, int ow,
					    struct ps__cuda_flags *flags)
{
	size_t out = planes * (size_t)oh * ow, in = planes * (size_t)h * w;
	cudaError_t e;

	if (in == 0)
		return cudaSuccess;
	if (!ps__fits_int(in))
		return cudaErrorInvalidValue;
	if (out) {
		maxpool_check_kernel<<<ps__grid(out), PS__BLOCK, 0, st>>>(idx, (int)out, w, size,
									  oh, ow, flags);
		if ((e = cudaGetLastError()) != cudaSuccess)
			return e;
	}
	maxpool_bwd_kernel<<<ps__grid(in), PS__BLOCK, 0, st>>>(dy, idx, dx, (int)in, h, w, size,
							       oh, ow, flags);
	return cudaGetLastError();
}
