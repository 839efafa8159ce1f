/* compute_cuda_stub.c - the "cuda" backend of a build made without nvcc.
 *
 * The Makefile links this file only when kernels/ cannot be compiled, so the
 * registry and every caller look the same in both builds (no #ifdef): the
 * backend is found by name, and create() fails with PS_ENOTSUP and a reason
 * the worker can print before it falls back to cpu (where the config allows).
 * No other member is ever reached, because no backend object is ever made.
 */
#include <stdio.h>
#include "compute.h"
#include "ps_err.h"

static int stub_create(struct ps_compute **out, char *err, size_t errlen)
{
	*out = NULL;
	if (err && errlen)
		snprintf(err, errlen,
			 "this build has no CUDA backend (nvcc was not found at build time)");
	return PS_ENOTSUP;
}

const struct ps_compute_ops ps_compute_cuda_ops = {
	.name = "cuda",
	.create = stub_create,
};
