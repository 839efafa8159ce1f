/* store.c - owned slices, BSP buckets, rank-ordered sums, optimizer calls. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ps_err.h"
#include "store.h"

struct ps_bucket {
	uint64_t clock;
	int have;                       /* workers that pushed this clock */
	struct ps_bucket *next;
	const float **g;                /* nworkers gradient pointers (NULL = not yet) */
	struct ps_frame_ref **fr;       /* the frames they live in */
};

void ps_frame_ref_put(struct ps_frame_ref *fr)
{
	if (fr && --fr->refs == 0) {
		ps_frame_release(fr->frame);
		free(fr);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ps_store_init(struct ps_store *st, const struct ps_config *cfg,
		  const struct ps_shardmap *map, int shard)
{
	int64_t maxcount = 0;

	memset(st, 0, sizeof(*st));
	st->cfg = cfg;
	st->map = map;
	st->shard = shard;
	st->opt = ps_optimizer_get(cfg->optim.kind);
	if (!st->opt)
		return PS_ECONFIG;
	st->slot_of = malloc(sizeof(*st->slot_of) * (map->nslices ? map->nslices : 1));
	if (!st->slot_of)
		return -ENOMEM;
	for (uint32_t i = 0; i < map->nslices; i++) {
		st->slot_of[i] = -1;
		if (map->slices[i].shard == shard)
			st->nslots++;
	}
	st->slots = calloc(st->nslots ? (size_t)st->nslots : 1, sizeof(*st->slots));
	if (!st->slots)
		goto err_free_store;
	int k = 0;
	for (uint32_t i = 0; i < map->nslices; i++) {
		const struct ps_slice *sl = &map->slices[i];
		if (sl->shard != shard)
			continue;
		struct ps_slot *s = &st->slots[k];
		st->slot_of[i] = k++;
		s->slice = sl;
		if (sl->count > maxcount)
			maxcount = sl->count;
		s->w = aligned_alloc(64, ((size_t)sl->count * sizeof(float) + 63) & ~(size_t)63);
		if (!s->w)
			goto err_free_store;
		for (int64_t e = 0; e < sl->count; e++)
			s->w[e] = ps_init_value(cfg, sl->tensor, sl->offset + e);
		for (int j = 0; j < st->opt->nstate; j++) {
			s->state[j] = calloc((size_t)sl->count, sizeof(float));
			if (!s->state[j])
				goto err_free_store;
		}
		if (st->opt->init_state)
			st->opt->init_state(&cfg->optim, s->state, (size_t)sl->count);
	}
	st->scratch = aligned_alloc(64, ((size_t)maxcount * sizeof(float) + 63) & ~(size_t)63 ?: 64);
	if (!st->scratch)
		goto err_free_store;
	return 0;

err_free_store:
	ps_store_free(st);
	return -ENOMEM;
}

static void bucket_free(struct ps_bucket *b, int nworkers)
{
	for (int r = 0; r < nworkers; r++)
		ps_frame_ref_put(b->fr[r]);
	free(b);
}

void ps_store_free(struct ps_store *st)
{
	for (int k = 0; st->slots && k < st->nslots; k++) {
		struct ps_slot *s = &st->slots[k];
		while (s->pending) {
			struct ps_bucket *b = s->pending;
			s->pending = b->next;
			bucket_free(b, st->cfg->nworkers);
		}
		free(s->w);
		for (int j = 0; j < PS_OPTIM_MAX_STATE; j++)
			free(s->state[j]);
	}
	free(st->slots);
	free(st->slot_of);
	free(st->scratch);
	memset(st, 0, sizeof(*st));
}

struct ps_slot *ps_store_slot(struct ps_store *st, uint32_t slice)
{
	if (slice >= st->map->nslices || st->slot_of[slice] < 0)
		return NULL;
	return &st->slots[st->slot_of[slice]];
}

static void apply(struct ps_store *st, struct ps_slot *s, const float *g)
{
	double t0 = now_s();
	size_t n = (size_t)s->slice->count;

	st->opt->apply(&st->cfg->optim, s->w, g, s->state, n, s->steps);
	s->steps++;
	s->version++;
	st->applies++;
	st->bytes_applied += n * sizeof(float);
	st->apply_seconds += now_s() - t0;
}

/* Sums a complete bucket in rank order and applies it. */
static void apply_bucket(struct ps_store *st, struct ps_slot *s, struct ps_bucket *b)
{
	size_t n = (size_t)s->slice->count;
	int nw = st->cfg->nworkers;
	const float *g = b->g[0];

	if (nw > 1) {
		float *restrict acc = st->scratch;
		const float *restrict g0 = b->g[0];
		const float *restrict g1 = b->g[1];
		for (size_t i = 0; i < n; i++)
			acc[i] = g0[i] + g1[i];
		for (int r = 2; r < nw; r++) {
			const float *restrict gr = b->g[r];
			for (size_t i = 0; i < n; i++)
				acc[i] += gr[i];
		}
		g = acc;
	}
	apply(st, s, g);
}

int ps_store_offer(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		   const float *g, struct ps_frame_ref *fr)
{
	const struct ps_config *cfg = st->cfg;
	struct ps_bucket **pp, *b;
	int changed = 0;

	if (cfg->consistency == PS_ASYNC) {
		apply(st, s, g);
		return 1;
	}
	if (clock < s->version || clock >= s->version + (uint64_t)cfg->limits.max_clock_ahead)
		return PS_ECLOCK;
	if (cfg->nworkers == 1 && clock == s->version && !s->pending) {
		apply(st, s, g);
		return 1;
	}
	for (pp = &s->pending; *pp && (*pp)->clock < clock; pp = &(*pp)->next)
		;
	b = *pp;
	if (!b || b->clock != clock) {
		size_t nw = (size_t)cfg->nworkers;
		b = calloc(1, sizeof(*b) + nw * (sizeof(*b->g) + sizeof(*b->fr)));
		if (!b)
			return -ENOMEM;
		b->g = (const float **)(b + 1);
		b->fr = (struct ps_frame_ref **)(b->g + nw);
		b->clock = clock;
		b->next = *pp;
		*pp = b;
	}
	if (b->g[rank])
		return PS_EDUP;
	b->g[rank] = g;
	b->fr[rank] = fr;
	fr->refs++;
	b->have++;
	/* Apply every complete bucket that is next in clock order. */
	while ((b = s->pending) && b->clock == s->version && b->have == cfg->nworkers) {
		apply_bucket(st, s, b);
		s->pending = b->next;
		bucket_free(b, cfg->nworkers);
		changed = 1;
	}
	return changed;
}

/* Exponent bits all ones means NaN or infinity; an OR over the batch keeps
 * the loop branch-free so it vectorizes (memory speed). */
int ps_store_all_finite(const float *g, size_t n)
{
	const uint32_t *u = (const uint32_t *)g;
	uint32_t bad = 0;

	for (size_t i = 0; i < n; i++)
		bad |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
	return !bad;
}

uint64_t ps_store_checksum(const struct ps_store *st)
{
	uint64_t h = PS_FNV_OFFSET;

	for (int k = 0; k < st->nslots; k++)
		h = ps_fnv1a(h, st->slots[k].w, (size_t)st->slots[k].slice->count * sizeof(float));
	return h;
}
