/* transport.c - the registry of transports, found by the config's name. */
#include <string.h>
#include "transport.h"

static const struct ps_transport_ops *const transports[] = {
	&ps_tcp_transport_ops,
	&ps_rdma_transport_ops,
};

const struct ps_transport_ops *ps_transport_find(const char *name)
{
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (strcmp(transports[i]->name, name) == 0)
			return transports[i];
	return NULL;
}
