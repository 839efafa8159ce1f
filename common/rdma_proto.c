/* rdma_proto.c - credits, buffer pool and frame placement (rdma_proto.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "rdma_proto.h"

void ps_rdma_credits_init(struct ps_rdma_credits *c, uint32_t total)
{
	c->total = total;
	c->avail = total;
	c->owed = 0;
}

int ps_rdma_credit_take(struct ps_rdma_credits *c, int update)
{
	if (c->avail == 0 || (!update && c->avail == 1))
		return 0;
	c->avail--;
	return 1;
}

int ps_rdma_credit_grant(struct ps_rdma_credits *c, uint32_t n)
{
	if (n > c->total - c->avail)
		return -1;
	c->avail += n;
	return 0;
}

void ps_rdma_credit_reposted(struct ps_rdma_credits *c)
{
	c->owed++;
}

uint32_t ps_rdma_credit_collect(struct ps_rdma_credits *c)
{
	uint32_t n = c->owed;

	c->owed = 0;
	return n;
}

int ps_rdma_credit_update_due(const struct ps_rdma_credits *c)
{
	return c->owed > 0 && c->owed >= (c->total + 1) / 2;
}

int ps_rdma_pool_init(struct ps_rdma_pool *p, uint32_t n, size_t slot)
{
	memset(p, 0, sizeof(*p));
	slot = (slot + 63) & ~(size_t)63;
	if (!n || !slot || slot > SIZE_MAX / n)
		return -EINVAL;
	p->base = aligned_alloc(64, slot * n);
	p->free = malloc(sizeof(*p->free) * n);
	p->used = calloc(n, 1);
	if (!p->base || !p->free || !p->used) {
		ps_rdma_pool_free(p);
		return -ENOMEM;
	}
	p->slot = slot;
	p->n = n;
	for (uint32_t i = 0; i < n; i++)
		p->free[i] = n - 1 - i; /* buffer 0 is handed out first */
	p->nfree = n;
	return 0;
}

void ps_rdma_pool_free(struct ps_rdma_pool *p)
{
	free(p->base);
	free(p->free);
	free(p->used);
	memset(p, 0, sizeof(*p));
}

void *ps_rdma_pool_get(struct ps_rdma_pool *p)
{
	uint32_t i;

	if (!p->nfree)
		return NULL;
	i = p->free[--p->nfree];
	p->used[i] = 1;
	return p->base + (size_t)i * p->slot;
}

int64_t ps_rdma_pool_index(const struct ps_rdma_pool *p, const void *buf)
{
	const uint8_t *b = buf;

	if (!p->base || b < p->base || b >= p->base + p->slot * p->n)
		return -1;
	if ((size_t)(b - p->base) % p->slot)
		return -1;
	return (int64_t)((size_t)(b - p->base) / p->slot);
}

int ps_rdma_pool_put(struct ps_rdma_pool *p, void *buf)
{
	int64_t i = ps_rdma_pool_index(p, buf);

	if (i < 0 || !p->used[i])
		return -1;
	p->used[i] = 0;
	p->free[p->nfree++] = (uint32_t)i;
	return 0;
}

enum ps_rdma_place ps_rdma_place_frame(uint64_t len, size_t slot, uint64_t max_frame)
{
	if (len > max_frame)
		return PS_RDMA_TOO_BIG;
	return len <= slot ? PS_RDMA_SEND : PS_RDMA_WRITE;
}
