/* transport_rdma.c - `transport: rdma` (issue 7, docs/rdma.md).
 *
 * What exists: the probe that says, in one line, why RDMA cannot be used
 * on this machine (no kernel support, no device, not the named device),
 * and the device-independent rules in rdma_proto.c (credits, buffer pool,
 * frame placement) with their tests. What does not exist yet: the verbs
 * data path (queue pairs through rdma_cm, posted receives, RDMA writes,
 * the completion channel under uv_poll_t). Until it does, create() fails
 * with PS_ENOTSUP and says so, on every machine, instead of pretending.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>
#include "ps_err.h"
#include "ps_log.h"
#include "transport.h"
#include "transport_rdma.h"

int ps_rdma_probe(const char *device, char *why, size_t whylen)
{
	struct ibv_device **list;
	int n = 0, found = 0, len = 0;
	char names[200] = "";

	errno = 0;
	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		int e = errno;
		snprintf(why, whylen, "no RDMA device found (%s%s); use transport: tcp, or load an "
			 "HCA driver, or soft-RoCE (rdma link add rxe0 type rxe netdev IFACE)",
			 !list && e == ENOSYS ? "this kernel has no RDMA support: "
			 "ibv_get_device_list: " : "",
			 !list ? strerror(e) : "ibv_get_device_list returned none");
		if (list)
			ibv_free_device_list(list);
		return PS_ENOTSUP;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (device && device[0] && name && strcmp(name, device) == 0)
			found = 1;
		if (len < (int)sizeof(names))
			len += snprintf(names + len, sizeof(names) - (size_t)len, "%s%s",
					i ? ", " : "", name ? name : "?");
	}
	ibv_free_device_list(list);
	if (device && device[0] && !found) {
		snprintf(why, whylen, "RDMA device '%s' not found (rdma.device); this machine has: "
			 "%s; or use transport: tcp", device, names);
		return PS_ENOTSUP;
	}
	snprintf(why, whylen, "the RDMA data path is not built yet (devices here: %s); "
		 "use transport: tcp", names);
	return PS_ENOTSUP;
}

static int rdma_create(uv_loop_t *loop, const struct ps_transport_cbs *cbs,
		       const struct ps_wire_limits *limits, void *data, struct ps_transport **out)
{
	char why[400];
	int rc = ps_rdma_probe(NULL, why, sizeof(why));

	(void)loop;
	(void)cbs;
	(void)limits;
	(void)data;
	*out = NULL;
	ps_error("transport rdma: %s", why);
	return rc;
}

const struct ps_transport_ops ps_rdma_transport_ops = {
	.name = "rdma",
	.create = rdma_create,
};
