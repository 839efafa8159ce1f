/* scale.cu - y = a * x elementwise: one thread per element. */
#include "scale.cuh"
#include "grid.cuh"

static __global__ void scale_kernel(float *y, const float *x, float a, int n)
{
	int stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = a * x[i];
}

extern "C" cudaError_t ps__cuda_scale(cudaStream_t st, float *y, const float *x, float a,
				      size_t n)
{
	if (n == 0)
		return cudaSuccess;
	if (!ps__fits_int(n))
		return cudaErrorInvalidValue;
	scale_kernel<<<ps__grid(n), PS__BLOCK, 0, st>>>(y, x, a, (int)n);
	return cudaGetLastError();
}
