/* scale.cu - the scale op of the cuda backend (elementwise y = a * x). */
#include "scale.cuh"
#include "grid.cuh"

static __global__ void scale_kernel(float *y, const float *x, float a, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		y[i] = a * x[i];
}

extern "C" cudaError_t ps__cuda_scale(cudaStream_t st, float *y, const float *x, float a,
				      size_t n)
{
	if (n == 0)
		return cudaSuccess;
	scale_kernel<<<ps__grid(n), PS__BLOCK, 0, st>>>(y, x, a, n);
	return cudaGetLastError();
}
