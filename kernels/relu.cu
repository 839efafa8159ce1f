/* relu.cu - relu forward and backward: one thread per element. */
#include "relu.cuh"
#include "grid.cuh"

static __global__ void relu_fwd_kernel(const float *x, float *y, int n)
{
	int stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		float v = x[i];
		y[i] = v > 0.0f ? v : 0.0f;
	}
}

static __global__ void relu_bwd_kernel(const float *y, const float *dy, float *dx, int n)
{
	int stride = gridDim.x * blockDim.x;

	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

extern "C" cudaError_t ps__cuda_relu_fwd(cudaStream_t st, const float *x, float *y, size_t n)
{
	if (n == 0)
		return cudaSuccess;
	if (!ps__fits_int(n))
		return cudaErrorInvalidValue;
	relu_fwd_kernel<<<ps__grid(n), PS__BLOCK, 0, st>>>(x, y, (int)n);
	return cudaGetLastError();
}

extern "C" cudaError_t ps__cuda_relu_bwd(cudaStream_t st, const float *y, const float *dy,
					 float *dx, size_t n)
{
	if (n == 0)
		return cudaSuccess;
	if (!ps__fits_int(n))
		return cudaErrorInvalidValue;
	relu_bwd_kernel<<<ps__grid(n), PS__BLOCK, 0, st>>>(y, dy, dx, (int)n);
	return cudaGetLastError();
}
