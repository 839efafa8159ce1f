/* shardmap.c - slices, their shard assignment, map hash, initial values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ps_err.h"
#include "shardmap.h"

uint64_t ps_fnv1a(uint64_t h, const void *data, size_t len)
{
	const uint8_t *p = data;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Order for the greedy: larger slices first, then lower id. */
static int cmp_slice_size(const void *a, const void *b)
{
	const struct ps_slice *x = *(const struct ps_slice *const *)a;
	const struct ps_slice *y = *(const struct ps_slice *const *)b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	return x->id < y->id ? -1 : (x->id > y->id);
}

static uint64_t hash_u64(uint64_t h, uint64_t v)
{
	return ps_fnv1a(h, &v, sizeof(v));
}

static uint64_t mix64(uint64_t z);

/* Placement 0: longest-processing-time greedy over order (n slices). */
static void place_greedy(struct ps_shardmap *m, struct ps_slice **order, uint64_t n)
{
	qsort(order, n, sizeof(*order), cmp_slice_size);
	for (uint64_t k = 0; k < n; k++) {
		int best = 0;
		for (int s = 1; s < m->nshards; s++)
			if (m->shard_bytes[s] < m->shard_bytes[best])
				best = s;
		order[k]->shard = best;
		m->shard_bytes[best] += (uint64_t)order[k]->count * sizeof(float);
	}
}

/* Rendezvous weight of slice id on shard k: the same for every shard
 * count, so adding a shard changes only the slices it outweighs. */
static uint64_t hrw_weight(uint32_t id, int k)
{
	return mix64(mix64((uint64_t)id) ^ mix64(0x5348415244ull + (uint64_t)k));
}

/* Placement 1: largest slice first (ties by id), each to its
 * highest-weight shard that stays within the load bound with it; when
 * none does (slices big next to a shard's share), to the least loaded
 * (ties by weight). So a shard holds at most the bound, or the mean plus
 * one slice. */
static void place_hrw(struct ps_shardmap *m, struct ps_slice **order)
{
	uint64_t total = 0, bound;

	for (uint32_t i = 0; i < m->nslices; i++)
		total += (uint64_t)m->slices[i].count * sizeof(float);
	bound = total / (uint64_t)m->nshards + total / (uint64_t)m->nshards / PS_HRW_SLACK + 1;
	qsort(order, m->nslices, sizeof(*order), cmp_slice_size);
	for (uint32_t i = 0; i < m->nslices; i++) {
		struct ps_slice *sl = order[i];
		uint64_t size = (uint64_t)sl->count * sizeof(float), bw = 0, lw = 0;
		int best = -1, least = 0;
		for (int k = 0; k < m->nshards; k++) {
			uint64_t w = hrw_weight(sl->id, k);
			if (m->shard_bytes[k] + size <= bound && (best < 0 || w > bw)) {
				best = k;
				bw = w;
			}
			if (!k || m->shard_bytes[k] < m->shard_bytes[least] ||
			    (m->shard_bytes[k] == m->shard_bytes[least] && w > lw)) {
				least = k;
				lw = w;
			}
		}
		if (best < 0)
			best = least;
		sl->shard = best;
		m->shard_bytes[best] += size;
	}
}

int ps_shardmap_init(struct ps_shardmap *m, const struct ps_config *cfg)
{
	return ps_shardmap_init_placed(m, cfg, PS_PLACEMENT);
}

int ps_shardmap_init_placed(struct ps_shardmap *m, const struct ps_config *cfg, int placement)
{
	int64_t per = (int64_t)(cfg->slice_bytes / sizeof(float));
	struct ps_slice **order = NULL;
	uint64_t n = 0, h = PS_FNV_OFFSET;

	memset(m, 0, sizeof(*m));
	if (cfg->nshards < 1 || per < 1)
		return PS_ECONFIG;
	for (int t = 0; t < cfg->ntensors; t++)
		n += (uint64_t)((cfg->tensors[t].count + per - 1) / per);
	if (n > UINT32_MAX)
		return PS_ETOOBIG;
	m->nshards = cfg->nshards;
	m->placement = placement;
	m->ntensors = cfg->ntensors;
	m->nslices = (uint32_t)n;
	m->slices = calloc(n ? n : 1, sizeof(*m->slices));
	m->tensor_first = calloc((size_t)cfg->ntensors + 1, sizeof(*m->tensor_first));
	m->shard_bytes = calloc((size_t)cfg->nshards, sizeof(*m->shard_bytes));
	order = calloc(n ? n : 1, sizeof(*order));
	if (!m->slices || !m->tensor_first || !m->shard_bytes || !order)
		goto err_free_map;

	uint32_t id = 0;
	for (int t = 0; t < cfg->ntensors; t++) {
		m->tensor_first[t] = id;
		for (int64_t off = 0; off < cfg->tensors[t].count; off += per, id++) {
			struct ps_slice *s = &m->slices[id];
			s->id = id;
			s->tensor = t;
			s->offset = off;
			s->count = cfg->tensors[t].count - off < per ? cfg->tensors[t].count - off : per;
			order[id] = s;
		}
	}
	m->tensor_first[cfg->ntensors] = id;

	if (placement == PS_PLACE_GREEDY)
		place_greedy(m, order, n);
	else
		place_hrw(m, order);
	free(order);

	/* The hash covers everything that decides where a byte lives. The
	 * placement's id is left out for placement 0, so its hash is the one
	 * the checkpoints made with it hold. */
	h = hash_u64(h, (uint64_t)cfg->nshards);
	if (placement != PS_PLACE_GREEDY)
		h = hash_u64(h, 0x504c414345ull + (uint64_t)placement); /* "PLACE" + id */
	h = hash_u64(h, cfg->slice_bytes);
	/* Declared tensors (cfg->declare) are left out: a worker connects
	 * before it declares, and the declaration itself is compared with the
	 * shard's tensors (server/declare.c), so the same config gives the
	 * same hash before and after. */
	if (cfg->declare)
		h = hash_u64(h, 1);
	for (int t = 0; !cfg->declare && t < cfg->ntensors; t++) {
		h = ps_fnv1a(h, cfg->tensors[t].name, strlen(cfg->tensors[t].name) + 1);
		h = hash_u64(h, (uint64_t)cfg->tensors[t].count);
	}
	for (uint32_t i = 0; !cfg->declare && i < m->nslices; i++)
		h = hash_u64(h, (uint64_t)m->slices[i].shard);
	/* Embedding tables: their names place the rows; dim and optimizer
	 * decide what a row is (a client with another dim is refused at the
	 * handshake instead of at its first request). Declared tables are
	 * left out, like declared tensors: a worker connects before it
	 * declares them, and the declaration is compared instead
	 * (server/decl_tables.c). */
	for (int t = 0; t < cfg->ntables - cfg->ndecl_tables; t++) {
		h = ps_fnv1a(h, cfg->tables[t].name, strlen(cfg->tables[t].name) + 1);
		h = hash_u64(h, (uint64_t)cfg->tables[t].dim);
		h = hash_u64(h, (uint64_t)cfg->tables[t].optimizer);
	}
	m->hash = h;
	return 0;

err_free_map:
	free(order);
	ps_shardmap_free(m);
	return -ENOMEM;
}

void ps_shardmap_free(struct ps_shardmap *m)
{
	free(m->slices);
	free(m->tensor_first);
	free(m->shard_bytes);
	memset(m, 0, sizeof(*m));
}

/* splitmix64 finaliser: a good 64-bit mix of a counter. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1) from 24 random bits. */
static double unit(uint64_t r)
{
	return ((double)(r >> 40) + 0.5) / 16777216.0;
}

float ps_init_value(const struct ps_config *cfg, int t, int64_t i)
{
	const struct ps_tensor_cfg *tc = &cfg->tensors[t];
	uint64_t r = mix64(cfg->seed ^ mix64(((uint64_t)t << 40) ^ (uint64_t)i));

	switch (tc->init) {
	case PS_INIT_ZEROS:
		return 0.0f;
	case PS_INIT_CONST:
		return tc->init_value;
	case PS_INIT_UNIFORM:
		return (float)((2.0 * unit(r) - 1.0) * tc->init_value);
	case PS_INIT_NORMAL: {
		/* Box-Muller from two independent draws. */
		double u1 = unit(r), u2 = unit(mix64(r));
		return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * tc->init_value);
	}
	case PS_INIT_ARANGE:
		return (float)(i % 1024);
	}
	return 0.0f;
}
