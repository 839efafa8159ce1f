/* compute.c - the registry of compute backends: a backend's name in the
 * config ("cpu", "cuda") to its ops (docs/architecture.md, Interfaces). */
#include <string.h>
#include "compute.h"

/* Every backend this build knows. cuda is always listed: without nvcc at
 * build time it is the stub whose create() says why it cannot run. */
static const struct ps_compute_ops *const backends[] = {
	&ps_compute_cpu_ops,
	&ps_compute_cuda_ops,
};

const struct ps_compute_ops *ps_compute_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
		if (strcmp(backends[i]->name, name) == 0)
			return backends[i];
	return NULL;
}
