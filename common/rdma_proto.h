/* rdma_proto.h - the device-independent rules of the RDMA transport
 * (issue 7; docs/rdma.md): receive-buffer credits, the pool of registered
 * buffers, and where a frame goes. Pure code, so it is tested on machines
 * without an RDMA device; the verbs code uses it.
 *
 * Credits: each end posts `total` receive buffers per connection, and the
 * peer may have at most that many sends outstanding: one send takes one
 * credit. A receiver that has handled a message and posted its buffer
 * again owes the sender one credit; owed credits ride back in the
 * immediate data of its next send, or in a credit-only message once half
 * of them are owed and it has nothing to send. The last credit is kept for
 * such a message, so two ends that both run out can always unblock each
 * other. A grant that would take a sender above `total` is a protocol
 * error (the peer lies about its buffers).
 *
 * Placement: a frame (header, metadata, payload, MAC) that fits one
 * buffer is copied into a send buffer and sent (send/receive); a larger
 * one goes by RDMA write with immediate straight into a buffer the
 * receiver registered for it (announced by a small request, answered with
 * its address and key), so a large payload crosses without a copy.
 */
#ifndef PS_RDMA_PROTO_H
#define PS_RDMA_PROTO_H

#include <stddef.h>
#include <stdint.h>

struct ps_rdma_credits {
	uint32_t total;   /* receive buffers each end posts */
	uint32_t avail;   /* sends this end may still make */
	uint32_t owed;    /* buffers re-posted whose credit the peer has not got back */
};

void ps_rdma_credits_init(struct ps_rdma_credits *c, uint32_t total);

/* Takes a credit for a data message (1), or returns 0 when only the
 * reserved one is left (queue the frame). A credit-only message (update 1)
 * may take the last one. */
int ps_rdma_credit_take(struct ps_rdma_credits *c, int update);

/* The peer returned n credits: 0, or -1 when that would exceed total. */
int ps_rdma_credit_grant(struct ps_rdma_credits *c, uint32_t n);

/* A received message was handled and its buffer posted again. */
void ps_rdma_credit_reposted(struct ps_rdma_credits *c);

/* The credits to piggyback on the next send (and forget them). */
uint32_t ps_rdma_credit_collect(struct ps_rdma_credits *c);

/* 1 when enough is owed that a credit-only message should go now. */
int ps_rdma_credit_update_due(const struct ps_rdma_credits *c);

/* A pool of equal buffers carved from one region (registered once with
 * the device, reused for the life of the connection). */
struct ps_rdma_pool {
	uint8_t *base;
	size_t slot;      /* bytes per buffer */
	uint32_t n;
	uint32_t nfree;
	uint32_t *free;   /* stack of free indices */
	uint8_t *used;    /* per buffer: 1 while handed out */
};

/* Allocates n buffers of slot bytes (64-byte aligned). 0 or -ENOMEM. */
int ps_rdma_pool_init(struct ps_rdma_pool *p, uint32_t n, size_t slot);
void ps_rdma_pool_free(struct ps_rdma_pool *p);
/* A free buffer, or NULL when all are out. */
void *ps_rdma_pool_get(struct ps_rdma_pool *p);
/* Returns buf: 0, or -1 when buf is not a buffer of p or is not out
 * (nothing changes then). */
int ps_rdma_pool_put(struct ps_rdma_pool *p, void *buf);
/* Index of buf in p, or -1 when it is not the start of one of its buffers. */
int64_t ps_rdma_pool_index(const struct ps_rdma_pool *p, const void *buf);

enum ps_rdma_place {
	PS_RDMA_SEND,      /* copied into one send buffer, send/receive */
	PS_RDMA_WRITE,     /* RDMA write with immediate into the receiver's buffer */
	PS_RDMA_TOO_BIG,   /* over the frame limit: refused before anything moves */
};

/* Where a frame of len bytes (header to MAC) goes with buffers of slot
 * bytes and frames of at most max_frame bytes. */
enum ps_rdma_place ps_rdma_place_frame(uint64_t len, size_t slot, uint64_t max_frame);

#endif
