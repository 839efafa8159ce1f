/* transport_rdma.h - what the RDMA transport can tell before it is used,
 * and the hooks its tests use to play a misbehaving peer. */
#ifndef PS_TRANSPORT_RDMA_H
#define PS_TRANSPORT_RDMA_H

#include <stddef.h>
#include <stdint.h>

struct ps_conn;

/* Whether `transport: rdma` can run here with device (NULL or "" = any):
 * 0 with the devices found in why, or PS_ENOTSUP with one line in why that
 * names what is missing (kernel support, any device, the named device; the
 * devices found) and suggests tcp. */
int ps_rdma_probe(const char *device, char *why, size_t whylen);

/* Tests only. Posts one raw message on rdma connection c, bypassing every
 * rule: immediate data of kind, credits and id (transport_rdma.c), body of
 * len bytes (at most one buffer). 0 or PS_ESTATE / PS_ECLOSED. */
int ps_rdma_test_post(struct ps_conn *c, unsigned kind, unsigned credits, unsigned id,
		      const void *body, uint32_t len);
/* Tests only. The RDMA write of the next big frame sent on c writes delta
 * bytes more (or fewer) than the receiver granted. */
void ps_rdma_test_write_delta(struct ps_conn *c, int32_t delta);

#endif
