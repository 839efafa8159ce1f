/* store.c - owned slices, BSP buckets, rank-ordered sums, optimizer calls. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "codec.h"
#include "finite.h"
#include "ps_err.h"
#include "ps_log.h"
#include "store.h"

struct ps_bucket {
	uint64_t clock;
	int have;                       /* workers that pushed this clock */
	struct ps_bucket *next;
	struct ps_grad *g;              /* nworkers gradients (data NULL = not yet) */
	struct ps_frame_ref **fr;       /* the frames they live in */
};

void ps_frame_ref_put(struct ps_frame_ref *fr)
{
	if (fr && --fr->refs == 0) {
		ps_frame_release(fr->frame);
		free(fr->expanded);
		free(fr);
	}
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
		s->ocfg = cfg->ngroups ? &cfg->groups[cfg->tensors[sl->tensor].group] : &cfg->optim;
		s->opt = ps_optimizer_get(s->ocfg->kind);
		if (!s->opt) {
			ps_store_free(st);
			return PS_ECONFIG;
		}
		for (int j = 0; j < s->opt->nstate; j++) {
			s->state[j] = calloc((size_t)sl->count, sizeof(float));
			if (!s->state[j])
				goto err_free_store;
		}
		if (s->opt->init_state)
			s->opt->init_state(s->ocfg, s->state, (size_t)sl->count);
	}
	st->scratch = aligned_alloc(64, ((size_t)maxcount * sizeof(float) + 63) & ~(size_t)63 ?: 64);
	st->check = aligned_alloc(64, ((size_t)maxcount * sizeof(float) + 63) & ~(size_t)63 ?: 64);
	if (!st->scratch || !st->check)
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

void ps_store_drop_pending(struct ps_store *st)
{
	for (int k = 0; st->slots && k < st->nslots; k++) {
		struct ps_slot *s = &st->slots[k];
		while (s->pending) {
			struct ps_bucket *b = s->pending;
			s->pending = b->next;
			bucket_free(b, st->cfg->nworkers);
		}
	}
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
	free(st->check);
	memset(st, 0, sizeof(*st));
}

struct ps_slot *ps_store_slot(struct ps_store *st, uint32_t slice)
{
	if (slice >= st->map->nslices || st->slot_of[slice] < 0)
		return NULL;
	return &st->slots[st->slot_of[slice]];
}

/* The rule's settings for one update of s: its group's, with the learning
 * rate the push gave when it gave one. */
static struct ps_optim_cfg step_cfg(const struct ps_slot *s, const struct ps_grad *g)
{
	struct ps_optim_cfg oc = *s->ocfg;

	if (g && g->has_lr)
		oc.lr = g->lr;
	return oc;
}

/* Whether applying g (n floats) to s now leaves every weight and every
 * optimizer state value finite, g included (a sum of finite gradients can
 * overflow). Changes nothing. */
static int update_finite(const struct ps_slot *s, const struct ps_optim_cfg *oc, const float *g)
{
	size_t n = (size_t)s->slice->count;

	return ps_words_finite(g, n) &&
	       ps_optimizer_finite_after(s->opt, oc, s->w, g, s->state, n, s->steps);
}

/* One optimizer step of g on s with settings oc. Unless checked
 * (ps_store_check probed this very update), an update that would leave a
 * value that is not finite is refused whole: the weights and state stay as
 * they were, the version moves on as for a clock passed over, and the
 * refusal is logged and counted. 1 when applied, 0 when refused. */
static int apply(struct ps_store *st, struct ps_slot *s, const struct ps_optim_cfg *oc,
		 const float *g, int checked)
{
	double t0 = ps_now_s();
	size_t n = (size_t)s->slice->count;

	if (!checked && !update_finite(s, oc, g)) {
		ps_error("slice %u: the gradients of clock %" PRIu64 " sum to values that are not "
			 "finite, or the %s update of them would leave weights or optimizer state "
			 "that are not finite; that clock is not applied to this slice (weights "
			 "and state unchanged)", s->slice->id, s->version, s->opt->name);
		st->refused++;
		if (st->errors)
			(*st->errors)++;
		s->version++;
		if (st->on_version)
			st->on_version(st->hook_arg, s);
		return 0;
	}
	s->opt->apply(oc, s->w, g, s->state, n, s->steps);
	s->steps++;
	s->version++;
	st->applies++;
	st->bytes_applied += n * sizeof(float);
	st->apply_seconds += ps_now_s() - t0;
	if (st->on_apply)
		st->on_apply(st->hook_arg, s, g, oc);
	return 1;
}

/* Async with an averaging rule: g (n floats) scaled by 1/nworkers into
 * out (which may be g). */
static const float *async_scaled(const struct ps_store *st, const struct ps_slot *s,
				 const float *g, float *out)
{
	size_t n = (size_t)s->slice->count;
	const float k = (float)st->cfg->nworkers;

	if (!s->ocfg->average || st->cfg->nworkers == 1)
		return g;
	for (size_t i = 0; i < n; i++)
		out[i] = g[i] / k;
	return out;
}

/* The floats of g: the raw data itself, or decoded into buf. */
static const float *grad_floats(const struct ps_grad *g, size_t n, float *buf)
{
	char err[8];

	if (g->codec == 0)
		return g->data;
	/* validated on arrival (ps_store_check), so this cannot fail */
	ps_codec_get(g->codec)->decode(g->data, g->len, n, buf, err, sizeof(err));
	return buf;
}

/* A bucket is complete when every live rank has pushed into it or has
 * ended its clock without pushing this slice (a shard restarted from a
 * checkpoint: those pushes were acknowledged before it died and are lost). */
static int bucket_complete(const struct ps_store *st, const struct ps_bucket *b)
{
	int nw = st->cfg->nworkers;

	if (!st->live)
		return b->have == nw;
	for (int r = 0; r < nw; r++)
		if (!b->g[r].data && st->live[r] && !(st->finished && st->finished[r] > b->clock))
			return 0;
	return b->have > 0;
}

/* The lowest clock every live rank has ended (0 when unknown or nobody is
 * live): no push for a clock below it will come. */
static uint64_t all_ended(const struct ps_store *st)
{
	uint64_t m = UINT64_MAX;

	if (!st->finished || !st->live)
		return 0;
	for (int r = 0; r < st->cfg->nworkers; r++)
		if (st->live[r] && st->finished[r] < m)
			m = st->finished[r];
	return m == UINT64_MAX ? 0 : m;
}

/* Sums a complete bucket in rank order (ranks that pushed) and applies it.
 * Encoded gradients are decoded straight into the sum (decode_add), never
 * expanded apart. An averaging rule gets the sum over the number of ranks
 * that pushed. */
static void apply_bucket(struct ps_store *st, struct ps_slot *s, struct ps_bucket *b)
{
	size_t n = (size_t)s->slice->count;
	int nw = st->cfg->nworkers, raw = 1, np = 0, first = -1;
	float *restrict acc = st->scratch;
	char err[8];

	for (int r = 0; r < nw; r++) {
		if (!b->g[r].data)
			continue;
		raw &= b->g[r].codec == 0;
		np++;
		if (first < 0)
			first = r;
	}
	/* the learning rate of the lowest rank that pushed: deterministic */
	struct ps_optim_cfg oc = step_cfg(s, &b->g[first]);

	if (np == 1) {
		apply(st, s, &oc, grad_floats(&b->g[first], n, acc), 0);
		return;
	}
	if (raw) {
		int second = first + 1;
		while (!b->g[second].data)
			second++;
		const float *restrict g0 = b->g[first].data;
		const float *restrict g1 = b->g[second].data;
		for (size_t i = 0; i < n; i++)
			acc[i] = g0[i] + g1[i];
		for (int r = second + 1; r < nw; r++) {
			const float *restrict gr = b->g[r].data;
			if (!gr)
				continue;
			for (size_t i = 0; i < n; i++)
				acc[i] += gr[i];
		}
	} else {
		const float *g0 = grad_floats(&b->g[first], n, acc);

		if (g0 != acc)
			memcpy(acc, g0, n * sizeof(float));
		for (int r = first + 1; r < nw; r++) {
			const struct ps_grad *g = &b->g[r];

			if (!g->data)
				continue;
			if (g->codec == 0) {
				const float *restrict gr = g->data;
				for (size_t i = 0; i < n; i++)
					acc[i] += gr[i];
			} else {
				ps_codec_get(g->codec)->decode_add(g->data, g->len, n, 1.0f, acc, err,
								   sizeof(err));
			}
		}
	}
	if (oc.average) {
		/* the mean: the sum over how many pushed (not over nworkers: a
		 * dropped worker's share is not there) */
		const float k = (float)np;
		for (size_t i = 0; i < n; i++)
			acc[i] /= k;
	}
	apply(st, s, &oc, acc, 0);
}

/* Applies every complete bucket that is next in clock order; 1 if any.
 * Clocks below ended (all_ended: every live rank has ended them) with no
 * push for this slice (none will come) are passed over: the version moves
 * on, nothing is applied. */
static int apply_ready(struct ps_store *st, struct ps_slot *s, uint64_t ended)
{
	struct ps_bucket *b;
	int changed = 0;

	for (;;) {
		b = s->pending;
		if (b && b->clock == s->version && bucket_complete(st, b)) {
			apply_bucket(st, s, b);
			s->pending = b->next;
			bucket_free(b, st->cfg->nworkers);
			changed = 1;
			continue;
		}
		uint64_t to = b && b->clock < ended ? b->clock : ended;
		if (to > s->version && (!b || b->clock > s->version)) {
			s->version = to;
			changed = 1;
			if (st->on_version)
				st->on_version(st->hook_arg, s);
			continue;
		}
		return changed;
	}
}

int ps_store_advance(struct ps_store *st)
{
	uint64_t ended;
	int n = 0;

	if (st->cfg->consistency != PS_SYNC)
		return 0;
	ended = all_ended(st);
	for (int k = 0; k < st->nslots; k++)
		n += apply_ready(st, &st->slots[k], ended);
	return n;
}

int ps_store_check(struct ps_store *st, const struct ps_slot *s, const struct ps_grad *g,
		   char *err, size_t errlen)
{
	size_t n = (size_t)s->slice->count;
	const struct ps_codec_ops *co;
	int rc;

	if (g->codec == 0) {
		if (g->len != n * sizeof(float)) {
			snprintf(err, errlen, "%" PRIu64 " bytes for %zu floats", g->len, n);
			return PS_ESHAPE;
		}
		/* the transport may have checked the frame's words already */
		rc = g->finite_known || ps_words_finite(g->data, n);
	} else {
		co = ps_codec_get(g->codec);
		if (!co) {
			snprintf(err, errlen, "unknown codec %d", g->codec);
			return PS_EPROTO;
		}
		rc = co->decode(g->data, g->len, n, st->check, err, errlen);
		if (rc)
			return rc;
		rc = ps_words_finite(st->check, n);
	}
	if (!rc) {
		snprintf(err, errlen, "gradient holds NaN or infinite values");
		return PS_ENOFINITE;
	}
	/* async: the update follows at once, so it is probed now and a push
	 * whose update would not be finite is refused before any of it applies */
	if (st->cfg->consistency == PS_ASYNC) {
		struct ps_optim_cfg oc = step_cfg(s, g);
		const float *f = async_scaled(st, s, g->codec ? st->check : g->data, st->check);

		if (!ps_optimizer_finite_after(s->opt, &oc, s->w, f, s->state, n, s->steps)) {
			snprintf(err, errlen, "the %s update of these finite gradients would leave "
				 "weights or optimizer state that are not finite (values too large)",
				 s->opt->name);
			return PS_ENOFINITE;
		}
	}
	return 0;
}

int ps_store_offer(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		   const float *g, struct ps_frame_ref *fr)
{
	struct ps_grad gr = { g, (uint64_t)s->slice->count * sizeof(float), 0, 0, 0, 0 };
	struct ps_optim_cfg oc = step_cfg(s, NULL);

	/* async applies at once, and g has not been through ps_store_check */
	if (st->cfg->consistency == PS_ASYNC &&
	    !update_finite(s, &oc, async_scaled(st, s, g, st->check)))
		return PS_ENOFINITE;
	return ps_store_offer_grad(st, s, rank, clock, &gr, fr);
}

int ps_store_offer_grad(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
			const struct ps_grad *g, struct ps_frame_ref *fr)
{
	const struct ps_config *cfg = st->cfg;
	struct ps_bucket **pp, *b;
	size_t n = (size_t)s->slice->count;

	if (cfg->consistency == PS_ASYNC) {
		struct ps_optim_cfg oc = step_cfg(s, g);
		const float *f = grad_floats(g, n, st->scratch);

		apply(st, s, &oc, async_scaled(st, s, f, st->scratch), 1);
		return 1;
	}
	if (clock < s->version || clock >= s->version + (uint64_t)cfg->limits.max_clock_ahead)
		return PS_ECLOCK;
	if (cfg->nworkers == 1 && clock == s->version && !s->pending) {
		const float *f = grad_floats(g, n, st->scratch);
		struct ps_optim_cfg oc = step_cfg(s, g);
		if (st->on_offer)
			st->on_offer(st->hook_arg, s, rank, clock, f);
		apply(st, s, &oc, f, 0);
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
		b->g = (struct ps_grad *)(b + 1);
		b->fr = (struct ps_frame_ref **)(b->g + nw);
		b->clock = clock;
		b->next = *pp;
		*pp = b;
	}
	if (b->g[rank].data)
		return PS_EDUP;
	b->g[rank] = *g;
	b->fr[rank] = fr;
	fr->refs++;
	b->have++;
	if (st->on_offer)
		st->on_offer(st->hook_arg, s, rank, clock, grad_floats(g, n, st->check));
	/* Apply every complete bucket that is next in clock order. */
	return apply_ready(st, s, all_ended(st));
}

void ps_store_each_kept(struct ps_store *st,
			void (*fn)(void *arg, struct ps_slot *s, int rank, uint64_t clock,
				   const float *g),
			void *arg)
{
	if (st->cfg->consistency != PS_SYNC)
		return;
	for (int k = 0; k < st->nslots; k++) {
		struct ps_slot *s = &st->slots[k];
		size_t n = (size_t)s->slice->count;

		for (struct ps_bucket *b = s->pending; b; b = b->next)
			for (int r = 0; r < st->cfg->nworkers; r++)
				if (b->g[r].data)
					fn(arg, s, r, b->clock, grad_floats(&b->g[r], n, st->check));
	}
}

uint64_t ps_store_checksum(const struct ps_store *st)
{
	uint64_t h = PS_FNV_OFFSET;

	for (int k = 0; k < st->nslots; k++)
		h = ps_fnv1a(h, st->slots[k].w, (size_t)st->slots[k].slice->count * sizeof(float));
	return h;
}
