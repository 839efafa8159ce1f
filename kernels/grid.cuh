/* grid.cuh - launch geometry shared by the elementwise kernels of the cuda
 * backend: 256 threads a block, grid-stride loops over size_t counts. */
#ifndef PS_GRID_CUH
#define PS_GRID_CUH

#include <stddef.h>

#define PS__BLOCK 256

/* Blocks for total items: enough to fill any current GPU, never more than
 * the items need; kernels loop with a grid stride over the rest. */
static inline unsigned int ps__grid(size_t total)
{
	size_t blocks = (total + PS__BLOCK - 1) / PS__BLOCK;

	if (blocks > 65536)
		blocks = 65536;
	return blocks ? (unsigned int)blocks : 1;
}

#endif
