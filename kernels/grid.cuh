/* grid.cuh - launch geometry shared by the elementwise kernels of the cuda
 * backend: 256 threads a block, grid-stride loops over int counts.
 *
 * Index arithmetic is 32-bit (64-bit division and multiplication cost
 * several instructions each on the GPU); the launchers refuse a count over
 * INT_MAX with cudaErrorInvalidValue, which the host side reports as a
 * tensor too large, so no index can overflow. */
#ifndef PS_GRID_CUH
#define PS_GRID_CUH

#include <limits.h>
#include <stddef.h>

#define PS__BLOCK 256

/* Whether a count fits the kernels' int indices, grid-stride steps
 * included (at most 4096 blocks of PS__BLOCK past the last index). */
static inline int ps__fits_int(size_t n)
{
	return n <= (size_t)INT_MAX - (size_t)4096 * PS__BLOCK;
}

/* Blocks for total items: enough to fill any current GPU (132 SMs of 2048
 * threads hold 1056 blocks of 256), never more than the items need;
 * kernels loop with a grid stride over the rest. */
static inline unsigned int ps__grid(size_t total)
{
	size_t blocks = (total + PS__BLOCK - 1) / PS__BLOCK;

	if (blocks > 4096)
		blocks = 4096;
	return blocks ? (unsigned int)blocks : 1;
}

#endif
