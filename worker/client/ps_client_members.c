/* ps_client_members.c - a worker joining and leaving a running cluster,
 * and the membership its data loader divides the examples by
 * (server/members.c has the shard's side; docs/reliability.md the
 * reasoning).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"

/* One join step (StatsRequest.member_op) to shard k, waited for; the
 * answer in *st. 0 or a negative code. */
static int member_step(struct ps_client *c, int k, Ps__MemberOp op, uint64_t clock,
		       struct ps_shard_stats *st)
{
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r = ps__client_req_new(c, REQ_STATS);
	int64_t id;

	if (!r)
		return -ENOMEM;
	if (k >= r->nparts) {
		/* the map has fewer shards since the caller counted them (a
		 * re-shard followed): asked again from the first shard */
		ps__client_req_free(c, r);
		return PS_EMAP;
	}
	memset(st, 0, sizeof(*st));
	r->stats = st;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.member_op = op;
	m.member_clock = clock;
	if (ps__client_pack_part(&r->parts[k], &m.base)) {
		ps__client_req_free(c, r);
		return -ENOMEM;
	}
	id = ps__client_submit_built(c, 0, r);
	return id < 0 ? (int)id : ps_client_wait(c, id);
}

/* A join or leave step that shard k refused while a re-shard's stop is
 * pending there (member_status PS_ERESHARD, server/members.c): not mixed
 * into the stop, it is asked again after it, every 0.2 s for up to
 * limits.reconnect_timeout_ms (60 s when 0) from the first refusal
 * (*since, 0 before it). 1 to ask again, 0 to give up. */
static int again_after_reshard(struct ps_client *c, int k, const char *what, const char *why,
			       double *since)
{
	double now = ps_now_s(), limit = c->cfg->limits.reconnect_timeout_ms > 0 ?
					     c->cfg->limits.reconnect_timeout_ms / 1000.0 : 60.0;
	struct timespec ts = { 0, 200 * 1000 * 1000 };

	if (!*since) {
		*since = now;
		ps_warn("worker %d: %s waits: shard %d: %s", c->rank, what, k, why);
	}
	if (now - *since > limit)
		return 0;
	nanosleep(&ts, NULL);
	return 1;
}

/* The shard count of the map now, and in *gen the re-shards this client
 * followed (ps_client_follow.c changes both). */
static int nshards_now(struct ps_client *c, uint64_t *gen)
{
	int n;

	pthread_mutex_lock(&c->mu);
	n = c->cfg->nshards;
	*gen = c->reshards;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* A join or leave step that failed with PS_EMAP after the client followed
 * a re-shard while it was in flight or between two steps starts again
 * from the first shard of the new map (ps__client_again_on_new_map). What
 * the old shards held for it went with them: a stop is refused while a
 * join holds a clock or an async leave is under way, and a join or leave
 * step while a stop is pending, so their checkpoints hold no half of it. */
int ps_client_join(struct ps_client *c)
{
	static __thread struct ps_shard_stats st;
	int nsh, held, rc;
	uint64_t join, hold_max, member_from;
	int member_shard;
	uint64_t gen;
	double since = 0, since_map = 0;

	if (c->rank < 0) {
		ps__client_set_err(c, "a monitor is no worker: it cannot join");
		return -EINVAL;
	}
again:
	nsh = nshards_now(c, &gen);
	held = 0;
	join = hold_max = member_from = 0;
	member_shard = -1;
	/* 1: every shard holds its first open clock for this worker (or says
	 * it is a member already, from which clock) */
	for (int k = 0; k < nsh; k++) {
		rc = member_step(c, k, PS__MEMBER_OP__MEMBER_HOLD, 0, &st);
		if (!rc && st.member_status == PS_ERESHARD &&
		    again_after_reshard(c, k, "the join", st.member_error, &since))
			goto again; /* from the first shard: a hold made on another
				     * shard is taken again (at its clock then) */
		if (rc == PS_EMAP && ps__client_again_on_new_map(c, "the join", gen, &since_map))
			goto again;
		if (!rc && st.member_status < 0)
			rc = st.member_status;
		if (rc) {
			if (st.member_status < 0)
				ps__client_set_err(c, "join refused by shard %d: %s", k, st.member_error);
			return rc;
		}
		if (st.member_status == 1) {
			if (member_shard >= 0 && st.member_clock != member_from) {
				ps__client_set_err(c, "cannot join: shards %d and %d count worker %d "
						   "from clocks %llu and %llu", member_shard, k, c->rank,
						   (unsigned long long)member_from,
						   (unsigned long long)st.member_clock);
				return PS_EREFUSED;
			}
			member_shard = k;
			member_from = st.member_clock;
		} else {
			held++;
			hold_max = st.member_clock > hold_max ? st.member_clock : hold_max;
		}
	}
	/* no shard closed (sync) or answered a pull for (async: a hold keeps
	 * pulls past it back) a clock past its P: a join at max P + 1 changes
	 * the members of no clock a worker computes already
	 * (docs/reliability.md, "Data") */
	join = hold_max + 1;
	if (member_shard >= 0) {
		/* a member already (of some shards, when half a join survived a
		 * crash): from member_from, which the holding shards can still take
		 * when none has passed it */
		if (held && hold_max > member_from) {
			ps__client_set_err(c, "cannot join: shard %d counts worker %d from clock %llu, "
					   "another shard has passed that clock (it is at %llu): "
					   "restart that shard, or wait for its drop timeout",
					   member_shard, c->rank, (unsigned long long)member_from,
					   (unsigned long long)hold_max);
			return PS_EREFUSED;
		}
		join = member_from;
	}
	if (!held) {
		/* a member everywhere: it pushes from the clock it joined at on
		 * (after the shards restarted from checkpoints older than its join) */
		pthread_mutex_lock(&c->mu);
		if (c->clock < member_from)
			c->clock = member_from;
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	/* 2: every shard counts it from `join`; none closed join - 1 yet */
	for (int k = 0; k < nsh; k++) {
		rc = member_step(c, k, PS__MEMBER_OP__MEMBER_JOIN, join, &st);
		if (rc == PS_EMAP && ps__client_again_on_new_map(c, "the join", gen, &since_map))
			goto again;
		if (!rc && st.member_status < 0) {
			ps__client_set_err(c, "join at clock %llu refused by shard %d: %s",
					   (unsigned long long)join, k, st.member_error);
			rc = st.member_status;
		}
		if (rc)
			return rc;
	}
	pthread_mutex_lock(&c->mu);
	if (c->clock < join)
		c->clock = join;
	pthread_mutex_unlock(&c->mu);
	ps_info("worker %d joined the cluster at clock %llu", c->rank, (unsigned long long)join);
	return 0;
}

int ps_client_leave_begin(struct ps_client *c, uint64_t *last)
{
	static __thread struct ps_shard_stats st;
	uint64_t clock, f, gen, sl = (uint64_t)c->cfg->staleness;
	double since = 0, since_map = 0;
	int rc, nsh;

	if (c->rank < 0) {
		ps__client_set_err(c, "a monitor is no worker: it cannot leave");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	clock = c->clock;
	pthread_mutex_unlock(&c->mu);
	*last = f = clock;
	if (c->cfg->consistency != PS_ASYNC || !sl)
		return 0; /* the members of a clock are final before anyone starts it */
again:
	nsh = nshards_now(c, &gen);
	f = clock;
	/* each shard freezes this worker at F, the highest clock it may have
	 * told with it as a member, and tells no other worker a later clock
	 * until it leaves; the second round raises every shard's F to the
	 * highest, the last clock this worker trains */
	for (int round = 0; round < 2; round++)
		for (int k = 0; k < nsh; k++) {
			rc = member_step(c, k, PS__MEMBER_OP__MEMBER_FREEZE, round ? f : 0, &st);
			if (!rc && st.member_status == PS_ERESHARD &&
			    again_after_reshard(c, k, "the leave", st.member_error, &since)) {
				k--; /* this shard again (a freeze taken stays: it is never lowered) */
				continue;
			}
			if (rc == PS_EMAP &&
			    ps__client_again_on_new_map(c, "the leave", gen, &since_map))
				goto again;
			if (!rc && st.member_status < 0) {
				ps__client_set_err(c, "leave refused by shard %d: %s", k,
						   st.member_error);
				rc = st.member_status;
			}
			if (rc)
				return rc;
			f = st.member_clock > f ? st.member_clock : f;
		}
	*last = f;
	ps_info("worker %d leaving: it trains up to clock %llu and leaves with that push", c->rank,
		(unsigned long long)*last);
	return 0;
}

int ps_client_leave(struct ps_client *c, uint64_t clock)
{
	int64_t id;

	if (c->rank < 0) {
		ps__client_set_err(c, "a monitor is no worker: it cannot leave");
		return -EINVAL;
	}
	id = ps_client_push(c, clock, NULL, 0, PS_PUSH_END_CLOCK | PS_PUSH_LEAVE);
	if (id < 0)
		return (int)id;
	return ps_client_wait(c, id);
}

void ps__client_note_members(struct ps_client *c, const Ps__PullReply *m)
{
	if (c->mem_have && m->member_clock < c->mem_clock)
		return; /* an older clock's answer */
	c->mem_have = 1;
	c->mem_clock = m->member_clock;
	c->mem_epoch = m->member_epoch;
	c->mem_before = m->member_before;
	c->mem_count = (int)m->n_members;
	c->mem_index = -1;
	for (size_t i = 0; i < m->n_members; i++)
		if (m->members[i] == c->rank)
			c->mem_index = (int)i;
}

int ps_client_members(struct ps_client *c, struct ps_members_info *out)
{
	if (c->rank < 0) {
		ps__client_set_err(c, "a monitor is no worker: it has no membership");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	if (c->mem_have) {
		out->clock = c->mem_clock;
		out->epoch = c->mem_epoch;
		out->before = c->mem_before;
		out->count = c->mem_count;
		out->index = c->mem_index;
	} else {
		/* never told: every rank a member of every clock */
		out->clock = c->clock;
		out->epoch = 0;
		out->count = c->cfg->nworkers;
		out->before = c->clock * (uint64_t)c->cfg->nworkers;
		out->index = c->rank;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}
