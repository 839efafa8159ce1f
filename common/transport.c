/* transport.c - the registry of transports, found by the config's name. */
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "ps_err.h"
#include "transport.h"
#include "transport_rdma.h"

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

const struct ps_transport_ops *ps_transport_for(const struct ps_config *cfg, char *why,
						size_t whylen, int *rc)
{
	const struct ps_transport_ops *ops;

	if (cfg->transport == PS_TRANSPORT_RDMA) {
		char reason[400];
		*rc = ps_rdma_probe(cfg->rdma_device, reason, sizeof(reason));
		if (*rc) {
			snprintf(why, whylen, "transport rdma: %s", reason);
			return NULL;
		}
	}
	ops = ps_transport_find(cfg->transport == PS_TRANSPORT_TCP ? "tcp" : "rdma");
	if (!ops) {
		*rc = PS_ENOTSUP;
		snprintf(why, whylen, "transport not available in this build; use 'tcp'");
	}
	return ops;
}
