/* transport.c - the registry of transports, found by the config's name. */
#include <malloc.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
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

int ps_frame_check_auth(const struct ps_frame_hdr *h, int keyed, int cipher, uint64_t recv_seq,
			char *why, size_t whylen)
{
	if (!keyed) {
		if (!(h->flags & PS_FRAME_F_MAC))
			return 0;
		snprintf(why, whylen, "%s frame with a MAC before authentication",
			 ps_wire_type_name(h->type));
		return PS_EPROTO;
	}
	if (!(h->flags & PS_FRAME_F_MAC)) {
		snprintf(why, whylen, "%s frame without a MAC on an authenticated connection",
			 ps_wire_type_name(h->type));
		return PS_EAUTH;
	}
	if (!(h->flags & PS_FRAME_F_ENC) != (cipher < 0)) {
		snprintf(why, whylen, "%s frame %s on a connection whose frames are %s",
			 ps_wire_type_name(h->type), cipher < 0 ? "encrypted" : "in clear",
			 cipher < 0 ? "MACed, not encrypted" : "encrypted");
		return PS_EAUTH;
	}
	if (h->seq != (uint32_t)recv_seq) {
		snprintf(why, whylen, "%s frame numbered %u where %u was due (replayed, dropped "
			 "or reordered)", ps_wire_type_name(h->type), h->seq, (uint32_t)recv_seq);
		return PS_EAUTH;
	}
	return 0;
}

/* Frame bodies of up to a few MB are allocated and freed at the rate of
 * pushes and pulls. By default glibc gives a freed body at the top of the
 * heap back to the kernel (brk, trim threshold) and the next body faults
 * its pages in again, zeroed: in a 2 shard + 2 worker mlp run that was 10%
 * of the machine's CPU, in the shards. Bodies up to 32 MB (glibc's most)
 * come from the heap, and up to 64 MB of free heap is kept. Fixing the
 * thresholds also stops glibc's own moving of them. */
static void tune_malloc(void)
{
	mallopt(M_MMAP_THRESHOLD, 32 << 20);
	mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

uint8_t *ps_frame_body_alloc(uint32_t meta_len, uint64_t payload_len, uint8_t **data)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	size_t head = (sizeof(struct ps_frame) + meta_len + 63) & ~(size_t)63;
	uint64_t tail = payload_len + PS_MAC_TAG_LEN; /* room for a tag */
	uint8_t *b;

	if (payload_len > SIZE_MAX - 2 * 64 - head - PS_MAC_TAG_LEN)
		return NULL;
	pthread_once(&once, tune_malloc);
	b = aligned_alloc(64, head + ((tail + 63) & ~(uint64_t)63));
	if (b)
		*data = b + head - meta_len;
	return b;
}

int ps_transport_resolve(const char *host, int port, struct sockaddr_storage *ss)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;

	if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0 ||
	    uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
		return 0;
	/* Names: resolved synchronously (start-up only). A name that does not
	 * resolve says so (PS_ERESOLVE), not "cannot assign address". */
	if (getaddrinfo(host, NULL, &hints, &res) != 0)
		return PS_ERESOLVE;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
	freeaddrinfo(res);
	return 0;
}
