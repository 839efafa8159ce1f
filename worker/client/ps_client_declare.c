/* ps_client_declare.c - declaring the model's tensors at run time.
 *
 * With a config that names no dense model (cfg->declare), a worker tells
 * the shards the model's tensors (ps_client_declare): the client checks
 * the list, builds its own copy of the config with those tensors and the
 * shard map it gives, and sends every shard a Declare (names and shapes;
 * from rank 0 also the initial values of the slices that shard owns, from
 * the caller's arrays without a copy; with optimizer groups
 * (ps_client_declare_groups) the groups and each tensor's group, which the
 * shards compare like the shapes). A shard answers with an ack, with
 * PS_ECONFIG naming the first difference from the tensors it has, or with
 * -EAGAIN while rank 0 has not declared yet: those shards are asked again
 * every 20 ms until limits.request_timeout_ms. Once every shard accepted,
 * the client switches to the new config and map and pulls every tensor
 * into the caller's arrays, so every rank starts from the shards' values.
 *
 * A worker that follows a live re-shard ($PS_CONFIG_FOLLOW,
 * ps_client_follow.c) while it declares starts the declaration again on
 * the new map: built from the new shard count (rank 0's values cut by the
 * new map, from the caller's arrays, which nothing changed yet) and sent
 * to every new shard. A new shard that has the tensors (every old shard
 * had them: the new shards load them from the old checkpoints) compares
 * and acks; one without them takes rank 0's values, as at a first start.
 * Each Declare is built and submitted under maplock with the re-shard
 * count it was built for checked, so none built for the old map reaches
 * a new shard. A shard holding a re-shard's stop refuses a declaration
 * that would create its tensors (PS_ERESHARD, server/declare.c): asked
 * again every 20 ms like a shard waiting for rank 0, it reaches the new
 * shards once the client follows.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "optim_group.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_time.h"

/* Largest element count of one declared tensor (as server/declare.c). */
#define DECL_MAX_COUNT (INT64_C(1) << 36)

const struct ps_config *ps_client_config(struct ps_client *c)
{
	return c->cfg;
}

/* Converts and checks the caller's groups into cfg->groups and
 * group_of into the tensors' group. 0, or -EINVAL / PS_ECONFIG with the
 * reason set on c. */
static int declared_groups(struct ps_client *c, struct ps_config *cfg,
			   const struct ps_optim_group *groups, int ngroups, const int *group_of,
			   int n)
{
	char why[300];

	if (ngroups < 1 || ngroups > PS_MAX_GROUPS || !groups || !group_of) {
		ps__client_set_err(c, "%d optimizer groups: expected 1..%d, with groups and group_of "
				   "given", ngroups, PS_MAX_GROUPS);
		return -EINVAL;
	}
	for (int g = 0; g < ngroups; g++) {
		const struct ps_optim_group *u = &groups[g];
		struct ps_optim_cfg *o = &cfg->groups[g];

		memset(o, 0, sizeof(*o));
		if (ps_optim_group_kind(u->kind, u->momentum, &o->kind)) {
			ps__client_set_err(c, "optimizer group %d: unknown kind '%.40s' (expected sgd, "
					   "adam, adamw, adagrad or reduce)", g,
					   u->kind ? u->kind : "(null)");
			return PS_ECONFIG;
		}
		o->lr = u->lr;
		o->momentum = u->momentum;
		o->dampening = u->dampening;
		o->nesterov = u->nesterov != 0;
		o->beta1 = u->beta1;
		o->beta2 = u->beta2;
		o->eps = u->eps;
		o->weight_decay = u->weight_decay;
		o->lr_decay = u->lr_decay;
		o->initial_accumulator = u->initial_accumulator;
		o->average = u->average != 0;
		if (ps_optim_group_check(g, o, cfg->consistency == PS_ASYNC, why, sizeof(why))) {
			ps__client_set_err(c, "%s", why);
			return PS_ECONFIG;
		}
	}
	for (int i = 0; i < n; i++) {
		if (group_of[i] < 0 || group_of[i] >= ngroups) {
			ps__client_set_err(c, "parameter '%s': optimizer group %d, expected 0..%d",
					   cfg->tensors[i].name, group_of[i], ngroups - 1);
			return -EINVAL;
		}
		cfg->tensors[i].group = group_of[i];
	}
	cfg->ngroups = ngroups;
	return 0;
}

/* A copy of base with p[0..n) as its tensors, or NULL with the reason
 * set on c (*rc the code). */
static struct ps_config *declared_cfg(struct ps_client *c, const struct ps_config *base,
				      const struct ps_param *p, int n, int *rc)
{
	struct ps_config *cfg = malloc(sizeof(*cfg));

	*rc = -ENOMEM;
	if (!cfg) {
		ps__client_set_err(c, "out of memory");
		return NULL;
	}
	memcpy(cfg, base, sizeof(*cfg));
	*rc = -EINVAL;
	for (int i = 0; i < n; i++) {
		struct ps_tensor_cfg *t = &cfg->tensors[i];
		size_t len = p[i].name ? strlen(p[i].name) : 0;

		memset(t, 0, sizeof(*t));
		if (!len || len >= PS_NAME_MAX) {
			ps__client_set_err(c, "parameter %d: name of %zu bytes, expected 1..%d", i, len,
					   PS_NAME_MAX - 1);
			goto err_free_cfg;
		}
		memcpy(t->name, p[i].name, len + 1);
		if (p[i].ndims < 0 || p[i].ndims > PS_MAX_DIMS || (p[i].ndims && !p[i].dims) ||
		    !p[i].data) {
			ps__client_set_err(c, "parameter '%s': %d dims (expected 0..%d), dims and data "
					   "given", t->name, p[i].ndims, PS_MAX_DIMS);
			goto err_free_cfg;
		}
		t->ndims = p[i].ndims;
		t->count = 1;
		for (int j = 0; j < t->ndims; j++) {
			int64_t v = p[i].dims[j];
			if (v < 1 || v > DECL_MAX_COUNT || t->count > DECL_MAX_COUNT / v) {
				ps__client_set_err(c, "parameter '%s': dim %d is %" PRId64 ", expected "
						   ">= 1 and at most %" PRId64 " elements", t->name, j,
						   v, DECL_MAX_COUNT);
				*rc = PS_ETOOBIG;
				goto err_free_cfg;
			}
			t->dims[j] = v;
			t->count *= v;
		}
		t->init = PS_INIT_ZEROS;
		for (int k = 0; k < i; k++)
			if (!strcmp(cfg->tensors[k].name, t->name)) {
				ps__client_set_err(c, "parameter '%s' declared twice (#%d and #%d)",
						   t->name, k, i);
				goto err_free_cfg;
			}
	}
	cfg->ntensors = n;
	/* compression.tensors by declared name, as the shards do */
	char why[400];
	*rc = ps_config_declared_codecs(cfg, why, sizeof(why));
	if (*rc) {
		ps__client_set_err(c, "%s", why);
		goto err_free_cfg;
	}
	return cfg;

err_free_cfg:
	free(cfg);
	return NULL;
}

/* Submits a Declare to shard k alone: its request id, or a negative code. */
static int64_t send_declare(struct ps_client *c, const struct ps_config *cfg,
			    const struct ps_shardmap *map, const struct ps_param *p, int k)
{
	Ps__Declare m = PS__DECLARE__INIT;
	struct req *r = ps__client_req_new(c, REQ_DECLARE);
	int n = cfg->ntensors, rc = -ENOMEM;
	size_t nd = 0;
	uint32_t *ndims = malloc(sizeof(*ndims) * (size_t)n);
	int64_t *dims = malloc(sizeof(*dims) * ((size_t)n * PS_MAX_DIMS + 1));
	char **names = malloc(sizeof(*names) * (size_t)n);
	uint32_t *group_of = cfg->ngroups ? malloc(sizeof(*group_of) * (size_t)n) : NULL;
	Ps__OptimGroup groups[PS_MAX_GROUPS], *gptr[PS_MAX_GROUPS];
	struct part *pt;

	if (!r || !ndims || !dims || !names || (cfg->ngroups && !group_of))
		goto out;
	for (int g = 0; g < cfg->ngroups; g++) {
		ps_optim_group_to_msg(&cfg->groups[g], &groups[g]);
		gptr[g] = &groups[g];
	}
	for (int i = 0; cfg->ngroups && i < n; i++)
		group_of[i] = (uint32_t)cfg->tensors[i].group;
	m.n_groups = (size_t)cfg->ngroups;
	m.groups = gptr;
	m.n_group_of = cfg->ngroups ? (size_t)n : 0;
	m.group_of = group_of;
	for (int i = 0; i < n; i++) {
		names[i] = (char *)cfg->tensors[i].name;
		ndims[i] = (uint32_t)cfg->tensors[i].ndims;
		for (int j = 0; j < cfg->tensors[i].ndims; j++)
			dims[nd++] = cfg->tensors[i].dims[j];
	}
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_names = (size_t)n;
	m.names = names;
	m.n_ndims = (size_t)n;
	m.ndims = ndims;
	m.n_dims = nd;
	m.dims = dims;
	m.values = c->rank == 0;
	pt = &r->parts[k];
	if (m.values) {
		/* copied into one piece: a model of thousands of small tensors
		 * would otherwise be as many pieces in one write */
		size_t bytes = (size_t)map->shard_bytes[k], pos = 0;
		pt->enc = malloc(bytes ? bytes : 1);
		pt->iov = malloc(sizeof(*pt->iov));
		if (!pt->enc || !pt->iov)
			goto out;
		for (uint32_t s = 0; s < map->nslices; s++) {
			const struct ps_slice *sl = &map->slices[s];
			if (sl->shard != k)
				continue;
			memcpy(pt->enc + pos, p[sl->tensor].data + sl->offset,
			       (size_t)sl->count * sizeof(float));
			pos += (size_t)sl->count * sizeof(float);
		}
		pt->iov[0].base = pt->enc;
		pt->iov[0].len = bytes;
		pt->niov = bytes ? 1 : 0;
	}
	if (ps__client_pack_part(pt, &m.base))
		goto out;
	rc = 0;
out:
	free(group_of);
	free(ndims);
	free(dims);
	free(names);
	if (rc) {
		if (r)
			ps__client_req_free(c, r);
		return rc;
	}
	return ps__client_submit_built(c, 0, r);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* send(c, arg, k) under maplock, unless the client followed a re-shard
 * since gen: then 0 (never a request id), nothing sent. */
static int64_t send_on_map(struct ps_client *c, uint64_t gen,
			   int64_t (*send)(struct ps_client *c, void *arg, int k), void *arg, int k)
{
	int64_t id;

	/* the I/O thread changes c->reshards and the map with maplock
	 * held for writing: neither changes until this Declare is queued,
	 * and a switch after that cuts it again (it fails with PS_EMAP) */
	pthread_rwlock_rdlock(&c->maplock);
	id = c->reshards != gen ? 0 : send(c, arg, k);
	pthread_rwlock_unlock(&c->maplock);
	return id;
}

int ps__client_declare_all(struct ps_client *c, uint64_t gen,
			   int64_t (*send)(struct ps_client *c, void *arg, int k), void *arg,
			   char *why, size_t whylen)
{
	int nsh, left, rc = 0, moved = 0, held = 0;
	int done[PS_MAX_SHARDS] = { 0 };
	double deadline = ps_now_s() + c->cfg->limits.request_timeout_ms / 1000.0;

	pthread_rwlock_rdlock(&c->maplock);
	nsh = c->cfg->nshards;
	moved = c->reshards != gen;
	pthread_rwlock_unlock(&c->maplock);
	if (moved)
		return PS__AGAIN_ON_NEW_MAP;
	left = nsh;
	while (left) {
		int64_t ids[PS_MAX_SHARDS];
		int again = 0;

		for (int k = 0; k < nsh; k++)
			ids[k] = done[k] ? 0 : send_on_map(c, gen, send, arg, k);
		for (int k = 0; k < nsh; k++) {
			int st;
			if (done[k])
				continue;
			if (ids[k] == 0) {
				moved = 1;
				continue;
			}
			st = ids[k] < 0 ? (int)ids[k] : ps_client_wait(c, ids[k]);
			if (st == 0) {
				done[k] = 1;
				left--;
			} else if (st == -EAGAIN) {
				again = 1;
			} else if (st == PS_ERESHARD) {
				/* the shard holds a re-shard's stop: asked again,
				 * on the new map once the client follows it */
				again = held = 1;
			} else if (st == PS_EMAP && ps__client_reshards(c) != gen) {
				moved = 1; /* in flight at the switch (ps_client_follow.c) */
			} else if (!rc) {
				rc = st;
				snprintf(why, whylen, "%s", ps_client_error(c));
			}
		}
		if (moved || (rc && ps__client_reshards(c) != gen))
			return PS__AGAIN_ON_NEW_MAP; /* every id above was waited for */
		if (rc)
			return rc;
		if (left && again && ps_now_s() > deadline) {
			if (held)
				snprintf(why, whylen, "a shard held a re-shard's stop for %d ms "
					 "(limits.request_timeout_ms) and no new map came: declare "
					 "again once the re-shard is done",
					 c->cfg->limits.request_timeout_ms);
			else
				snprintf(why, whylen, "no declaration from rank 0 reached every shard "
					 "within %d ms (limits.request_timeout_ms): is rank 0 "
					 "running?", c->cfg->limits.request_timeout_ms);
			return PS_ETIMEDOUT;
		}
		if (left)
			sleep_ms(20);
	}
	return 0;
}

/* send_declare() for ps__client_declare_all. */
struct decl_arg {
	const struct ps_config *cfg;
	const struct ps_shardmap *map;
	const struct ps_param *p;
};

static int64_t send_declare_arg(struct ps_client *c, void *arg, int k)
{
	const struct decl_arg *a = arg;

	return send_declare(c, a->cfg, a->map, a->p, k);
}

int ps_client_declare(struct ps_client *c, const struct ps_param *p, int n)
{
	return ps_client_declare_groups(c, p, n, NULL, 0, NULL);
}

int ps_client_set_lr(struct ps_client *c, int group, float lr)
{
	char why[200];

	if (group < 0 || group >= c->cfg->ngroups) {
		ps__client_set_err(c, "optimizer group %d: the declared tensors have %d groups", group,
				   c->cfg->ngroups);
		return -EINVAL;
	}
	if (ps_optim_group_lr_check(group, lr, why, sizeof(why))) {
		ps__client_set_err(c, "%s", why);
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	c->group_lr[group] = lr;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* Whether p (with its groups) is the declaration this client made. */
static int same_as_declared(struct ps_client *c, const struct ps_param *p, int n,
			    const struct ps_optim_group *groups, int ngroups, const int *group_of)
{
	const struct ps_config *d = c->cfg;
	struct ps_config *cand;
	char why[300];
	int rc, same = n == d->ntensors && ngroups == d->ngroups;

	if (!same || !(cand = declared_cfg(c, d, p, n, &rc)))
		return 0;
	if ((groups || ngroups) && declared_groups(c, cand, groups, ngroups, group_of, n))
		same = 0;
	for (int i = 0; same && i < n; i++) {
		const struct ps_tensor_cfg *a = &cand->tensors[i], *b = &d->tensors[i];
		same = !strcmp(a->name, b->name) && a->ndims == b->ndims && a->group == b->group &&
		       !memcmp(a->dims, b->dims, sizeof(a->dims[0]) * (size_t)a->ndims);
	}
	for (int g = 0; same && g < ngroups; g++)
		same = !ps_optim_group_diff(g, &cand->groups[g], &d->groups[g], why, sizeof(why));
	free(cand);
	return same;
}

/* The shards' values of the declared tensors into p[i].data: the pull that
 * ends a declaration. */
static int pull_declared(struct ps_client *c, const struct ps_config *cfg,
			 const struct ps_param *p, int n)
{
	struct ps_tensor *t = calloc((size_t)n, sizeof(*t));
	int64_t id;
	int rc = -ENOMEM;

	if (t) {
		for (int i = 0; i < n; i++)
			t[i] = ps_tensor_of(cfg, i, p[i].data);
		id = ps_client_pull(c, 0, t, n);
		rc = id < 0 ? (int)id : ps_client_wait(c, id);
		free(t);
	} else {
		ps__client_set_err(c, "out of memory");
	}
	c->declared_unpulled = rc != 0;
	if (rc) { /* the declaration stands: the same call again pulls them */
		char why[400];

		snprintf(why, sizeof(why), "%s", ps_client_error(c));
		ps__client_set_err(c, "declared %d tensors, but pulling their values failed: %s "
				   "(declare the same again to pull them)", n, why);
	}
	return rc;
}

int ps_client_declare_groups(struct ps_client *c, const struct ps_param *p, int n,
			     const struct ps_optim_group *groups, int ngroups, const int *group_of)
{
	struct ps_config *cfg;
	const struct ps_config *base;
	struct ps_shardmap map;
	float **resid, **old_resid;
	uint64_t gen;
	double since = 0;
	int rc;
	char why[600] = "";

	if (!c->cfg->declare) {
		ps__client_set_err(c, "%s names its model (model.preset, .layers or .tensors): "
				   "there is nothing to declare", c->cfg->path);
		return PS_ECONFIG;
	}
	if (c->declared_tensors) {
		/* declared, but the pull that ended the call failed: the same
		 * declaration again only pulls the values */
		if (c->declared_unpulled && same_as_declared(c, p, n, groups, ngroups, group_of))
			return pull_declared(c, c->cfg, p, n);
		ps__client_set_err(c, "this client has declared its tensors already");
		return PS_ESTATE;
	}
	if (n < 1 || n > PS_MAX_TENSORS || !p) {
		ps__client_set_err(c, "declaring %d tensors: expected 1..%d", n, PS_MAX_TENSORS);
		return PS_ETOOBIG;
	}
again:
	/* the map now, and the re-shards followed so far (changed together,
	 * under c->mu, by ps_client_follow.c) */
	pthread_mutex_lock(&c->mu);
	gen = c->reshards;
	base = c->cfg; /* a replaced config stays allocated until ps_client_free */
	pthread_mutex_unlock(&c->mu);
	cfg = declared_cfg(c, base, p, n, &rc);
	if (!cfg)
		return rc;
	if ((groups || ngroups) &&
	    (rc = declared_groups(c, cfg, groups, ngroups, group_of, n)))
		goto err_free_cfg;
	rc = ps_shardmap_init(&map, cfg);
	if (rc) {
		ps__client_set_err(c, "cannot build the shard map: %s", ps_strerror(rc));
		goto err_free_cfg;
	}
	resid = calloc((size_t)n, sizeof(*resid));
	if (!resid) {
		rc = -ENOMEM;
		ps__client_set_err(c, "out of memory");
		goto err_free_map;
	}
	struct decl_arg a = { cfg, &map, p };

	rc = ps__client_declare_all(c, gen, send_declare_arg, &a, why, sizeof(why));
	if (!rc) {
		pthread_mutex_lock(&c->mu); /* held to the switch below */
		if (c->reshards != gen) {
			/* a re-shard followed since the last ack: cfg and map are
			 * of the old shard count. Every old shard had the tensors,
			 * so the new ones have them: declared again, they ack */
			pthread_mutex_unlock(&c->mu);
			rc = PS__AGAIN_ON_NEW_MAP;
		}
	}
	if (rc == PS__AGAIN_ON_NEW_MAP) {
		free(resid);
		if (!ps__client_again_on_new_map(c, "the declaration of its tensors", gen, &since)) {
			rc = PS_EMAP;
			ps__client_set_err(c, "declaring %d tensors: the shards were re-sharded again "
					   "and again for limits.reconnect_timeout_ms: declare again", n);
			goto err_free_map;
		}
		ps_shardmap_free(&map);
		free(cfg);
		goto again;
	}
	if (rc) {
		free(resid);
		ps__client_set_err(c, "declaring %d tensors: %s", n, why);
		goto err_free_map;
	}
	/* every shard of the map now has the tensors: the client takes the
	 * new config (c->mu held) */
	old_resid = c->resid;
	ps_shardmap_free(&c->map);
	c->map = map;
	c->resid = resid;
	ps__client_retire_cfg(c, c->own_cfg); /* kept until ps_client_free */
	c->own_cfg = cfg;
	c->cfg = cfg;
	c->declared_tensors = 1;
	for (int g = 0; g < cfg->ngroups; g++)
		c->group_lr[g] = cfg->groups[g].lr;
	pthread_mutex_unlock(&c->mu);
	free(old_resid);
	return pull_declared(c, cfg, p, n);

err_free_map:
	ps_shardmap_free(&map);
err_free_cfg:
	free(cfg);
	return rc;
}
