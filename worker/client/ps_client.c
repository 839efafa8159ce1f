/* ps_client.c - the client's life cycle and its I/O thread.
 *
 * ps_client_init waits for the shards' names to resolve (a worker may
 * start before the servers' DNS names exist), connects to every shard and
 * waits for the handshakes;
 * ps_client_free stops the I/O thread and frees what is left. The I/O
 * thread runs the libuv loop: the transport's callbacks
 * (ps_client_conn.c), a uv_async_t woken to send what the calling threads
 * queued and to handle the frames they read but left to it, and a 100 ms
 * tick for heartbeats, request deadlines and reconnects.
 * ps_client_int.h says how the files of the client share the work.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sodium.h>
#include "ps_time.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_log.h"

/* ---- I/O thread ---- */

static void close_all(struct ps_client *c)
{
	uv_close((uv_handle_t *)&c->wake, NULL);
	uv_close((uv_handle_t *)&c->tick, NULL);
	c->transport->ops->destroy(c->transport);
}

/* Sends queued requests (and stops when asked). */
static void on_wake(uv_async_t *a)
{
	struct ps_client *c = a->data;
	struct deferred *d;
	int stopping;

	pthread_mutex_lock(&c->mu);
	stopping = c->stopping;
	d = c->deferred;
	c->deferred = NULL;
	c->deferred_tail = &c->deferred;
	struct req *next;
	for (struct req *r = c->sendq_head; r; r = next) {
		next = r->send_next;
		r->send_next = NULL;
		if (!r->queued)
			continue;
		r->queued = 0;
		for (int k = 0; k < c->cfg->nshards; k++) {
			struct part *p = &r->parts[k];
			struct shard_conn *sh = &c->shards[k];
			int rc;
			if (!p->waiting || (p->gen && p->gen == sh->gen))
				continue;
			if (sh->state != SH_READY) {
				if (sh->lost_at == 0)
					ps__client_part_done(c, r, k, sh->status ? sh->status : PS_ECLOSED, sh->why);
				continue; /* reconnecting: resent once ready */
			}
			rc = ps__client_send_part(c, r, k);
			if (rc && sh->lost_at == 0 && c->cfg->limits.reconnect_timeout_ms == 0)
				ps__client_part_done(c, r, k, rc, "send failed");
		}
	}
	c->sendq_head = c->sendq_tail = NULL;
	pthread_mutex_unlock(&c->mu);
	while (d) { /* frames a waiting thread read and left to this thread */
		struct deferred *next = d->next;
		struct ps_conn *conn;
		pthread_mutex_lock(&c->mu);
		conn = c->shards[d->k].gen == d->gen && c->shards[d->k].state == SH_READY ?
		       c->shards[d->k].conn : NULL;
		pthread_mutex_unlock(&c->mu);
		if (conn)
			ps__client_on_frame(conn, d->f);
		else
			ps_frame_release(d->f); /* its connection is gone */
		free(d);
		d = next;
	}
	if (stopping)
		close_all(c);
}

/* Fails requests past their deadline (the shard may still answer: the
 * answer is then dropped), and starts the reconnects that are due. A part
 * that went out on the current connection may still sit in its write
 * queue, pointing into the caller's buffers, which are the caller's again
 * once the request fails: that connection is closed first, which cancels
 * the queued writes (a worker then reconnects and resends the others). */
static void on_tick(uv_timer_t *t)
{
	struct ps_client *c = t->data;
	double now = ps_now_s();
	char why[sizeof(c->shards[0].why) + sizeof(c->shards[0].held)];

	pthread_mutex_lock(&c->mu);
	ps__client_heartbeats(c, now);
	for (struct req *r = c->reqs; r; r = r->next) {
		if (r->queued || r->done || now < r->deadline)
			continue;
		for (int k = 0; k < c->cfg->nshards; k++) {
			struct shard_conn *sh = &c->shards[k];
			if (!r->parts[k].waiting)
				continue;
			if (sh->held[0] && sh->lost_at == 0 &&
			    sh->held_at >= r->deadline - c->cfg->limits.request_timeout_ms / 1000.0)
				/* the shard said why it holds a pull: not its fault */
				snprintf(why, sizeof(why), "shard %d (%s:%d) is %s; no answer within "
					 "%d ms (limits.request_timeout_ms)", k,
					 c->cfg->shards[k].host, c->cfg->shards[k].port, sh->held,
					 c->cfg->limits.request_timeout_ms);
			else
				snprintf(why, sizeof(why), "shard %d (%s:%d): no answer within %d ms "
					 "(limits.request_timeout_ms)%s", k, c->cfg->shards[k].host,
					 c->cfg->shards[k].port, c->cfg->limits.request_timeout_ms,
					 sh->lost_at > 0 ? "; the connection is lost and being retried" : "");
			if (sh->conn && sh->state == SH_READY && r->parts[k].gen == sh->gen) {
				snprintf(sh->why, sizeof(sh->why), "%.*s", (int)sizeof(sh->why) - 1, why);
				sh->status = PS_ETIMEDOUT;
				sh->conn->t->ops->close(sh->conn, PS_ETIMEDOUT);
			}
			ps__client_part_done(c, r, k, PS_ETIMEDOUT, why);
		}
	}
	ps__client_reconnect_due(c, now);
	pthread_mutex_unlock(&c->mu);
	ps__client_follow_tick(c); /* takes maplock, then c->mu */
}

/* The I/O thread: all the client's writes through libuv happen here (the
 * callers' direct sends use MSG_NOSIGNAL). libuv writes with plain writev,
 * so a write to a connection the shard has just reset raises SIGPIPE, whose
 * default action would end the program that links libps: blocked in this
 * thread (and so left pending on it, never delivered), the write fails with
 * EPIPE instead, whatever the program did with the signal. */
static void *io_main(void *arg)
{
	struct ps_client *c = arg;
	sigset_t pipe;

	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, NULL);
	uv_run(&c->loop, UV_RUN_DEFAULT);
	return NULL;
}

/* ---- life cycle ---- */

/* Shards that resumed from checkpoints of different clocks (each writes
 * its own, on its own timer; one was killed between two): the workers
 * continue at the newest (c->clock), and a fresh shard behind it is brought
 * forward to it (StatsRequest.resume_clock), else its barrier would wait
 * for clocks nobody pushes again. Said in one line. A shard behind that is
 * not fresh has taken pushes since it started: it is only a clock behind
 * in a running cluster (its slices wait for a slow worker), not to be
 * moved. Returns 0 or the failed request's code, with err. */
static int resume_together(struct ps_client *c, char *err, size_t errlen)
{
	char behind[300] = "";
	size_t at = 0;
	uint64_t lo = UINT64_MAX;
	int rc;

	for (int k = 0; k < c->cfg->nshards; k++) {
		struct shard_conn *sh = &c->shards[k];

		if (!sh->fresh || sh->hello_clock >= c->clock)
			continue;
		rc = ps__client_resume(c, k, c->clock);
		if (rc) {
			snprintf(err, errlen, "shard %d resumed at clock %llu, another at %llu; "
				 "bringing it forward failed: %s", k,
				 (unsigned long long)sh->hello_clock, (unsigned long long)c->clock,
				 ps_client_error(c));
			return rc;
		}
		if (at < sizeof(behind))
			at += (size_t)snprintf(behind + at, sizeof(behind) - at, "%sshard %d at %llu",
					       at ? ", " : "", k, (unsigned long long)sh->hello_clock);
		lo = sh->hello_clock < lo ? sh->hello_clock : lo;
	}
	if (at)
		ps_warn("the shards resumed from checkpoints of different clocks: %s, the others "
			"at %llu; continuing at %llu: those shards were brought forward and their "
			"updates of clocks %llu..%llu are lost", behind, (unsigned long long)c->clock,
			(unsigned long long)c->clock, (unsigned long long)lo,
			(unsigned long long)c->clock - 1);
	return 0;
}

int ps_client_from_checkpoint(struct ps_client *c)
{
	int v = 0;

	pthread_mutex_lock(&c->mu);
	for (int k = 0; k < c->cfg->nshards; k++)
		v |= c->shards[k].from_ckpt;
	pthread_mutex_unlock(&c->mu);
	return v;
}

/* Whether shard k has an address that resolves now (its cluster.servers
 * entry, or with replicas its backup's). */
static int shard_resolves(const struct ps_config *cfg, int k)
{
	struct sockaddr_storage ss;

	for (int r = 0; r <= cfg->replicas; r++) {
		const struct ps_endpoint *ep = ps_config_replica_addr(cfg, k, r);
		if (ps_transport_resolve(ep->host, ep->port, &ss) == 0)
			return 1;
	}
	return 0;
}

/* Waits until every shard's name resolves, for up to
 * limits.connect_timeout_ms: where servers are named by DNS names that
 * exist only once their process does (a Kubernetes StatefulSet's pods
 * behind a headless Service), a worker may start first. Says what it
 * waits for at once and every 10 s. 0, or PS_ERESOLVE with the shard in
 * err. */
static int wait_for_names(const struct ps_config *cfg, char *err, size_t errlen)
{
	double t0 = ps_now_s(), limit = cfg->limits.connect_timeout_ms / 1000.0, said = -10;
	double pause = 0.05;

	for (int k = 0; k < cfg->nshards;) {
		double now;
		struct timespec ts;

		if (shard_resolves(cfg, k)) {
			k++;
			continue;
		}
		now = ps_now_s();
		if (now - t0 >= limit) {
			snprintf(err, errlen, "shard %d (%s:%d): the name did not resolve within %d ms "
				 "(limits.connect_timeout_ms): %s", k, cfg->shards[k].host,
				 cfg->shards[k].port, cfg->limits.connect_timeout_ms,
				 ps_strerror(PS_ERESOLVE));
			return PS_ERESOLVE;
		}
		if (now - said >= 10) {
			ps_warn("shard %d (%s:%d): the name does not resolve yet; waiting for it "
				"(%.0f of %d s, limits.connect_timeout_ms)", k, cfg->shards[k].host,
				cfg->shards[k].port, now - t0, cfg->limits.connect_timeout_ms / 1000);
			said = now;
		}
		pause = pause * 2 < 1 ? pause * 2 : 1;
		if (pause > t0 + limit - now)
			pause = t0 + limit - now;
		ts.tv_sec = (time_t)pause;
		ts.tv_nsec = (long)((pause - (double)ts.tv_sec) * 1e9);
		nanosleep(&ts, NULL);
	}
	return 0;
}

int ps_client_init(struct ps_client **out, const struct ps_config *cfg, int rank, char *err,
		   size_t errlen)
{
	struct ps_transport_cbs cbs = { .on_connect = ps__client_on_connect,
					.on_frame = ps__client_on_frame,
					.on_close = ps__client_on_close };
	struct ps_wire_limits hs = { .max_frame = PS_WIRE_HANDSHAKE_MAX,
				     .max_meta = PS_WIRE_HANDSHAKE_MAX };
	const struct ps_transport_ops *ops;
	struct ps_client *c;
	struct timespec until;
	int rc;

	*out = NULL;
	if (rank < PS_RANK_READER) {
		snprintf(err, errlen, "rank %d: a worker rank is 0 or more, -1 is a monitor, %d "
			 "(PS_RANK_READER) a reader", rank, PS_RANK_READER);
		return -EINVAL;
	}
	if (rank >= cfg->nworkers) {
		snprintf(err, errlen, "rank %d outside 0..%d (cluster.workers is %d)", rank,
			 cfg->nworkers - 1, cfg->nworkers);
		return -EINVAL;
	}
	ops = ps_transport_for(cfg, err, errlen, &rc);
	if (!ops)
		return rc;
	/* a monitor starts with whatever it reaches, so it waits for no name */
	if (rank != -1 && (rc = wait_for_names(cfg, err, errlen)))
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->cfg = cfg;
	c->rank = rank;
	c->spin_s = cfg->limits.wait_spin_us / 1e6;
	ps_auth_random((uint8_t *)&c->incarnation, sizeof(c->incarnation));
	ps_config_agreement(cfg, c->settings_plain, sizeof(c->settings_plain));
	/* a reader proves the reader key (auth.h), every other role the secret */
	if (cfg->security.auth && (rc = rank == PS_RANK_READER
			? ps_auth_load_reader_key(cfg, NULL, c->secret, err, errlen)
			: ps_auth_load_secret(cfg, c->secret, err, errlen))) {
		free(c);
		return rc;
	}
	/* as sent: digests keyed with the secret (config_agree.h) */
	ps_config_agreement_wire(c->settings_plain, cfg->security.auth ? c->secret : NULL,
				 c->settings, sizeof(c->settings));
	c->shards = calloc((size_t)cfg->nshards, sizeof(*c->shards));
	c->resid = calloc((size_t)(cfg->ntensors > 0 ? cfg->ntensors : 1), sizeof(*c->resid));
	if (!c->shards || !c->resid) {
		free(c->resid);
		free(c->shards);
		free(c);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rc = ps_shardmap_init(&c->map, cfg);
	if (rc) {
		snprintf(err, errlen, "cannot build the shard map: %s", ps_strerror(rc));
		goto err_free_client;
	}
	rc = ps__client_follow_init(c, err, errlen);
	if (rc) {
		ps_shardmap_free(&c->map);
		goto err_free_client;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_rwlock_init(&c->maplock, NULL);
	c->deferred_tail = &c->deferred;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* both allocate (the loop's watchers, the wake-up's eventfd) */
	if ((rc = uv_loop_init(&c->loop))) {
		snprintf(err, errlen, "cannot start the I/O loop: %s", uv_strerror(rc));
		goto err_destroy_locks;
	}
	if ((rc = uv_async_init(&c->loop, &c->wake, on_wake))) {
		snprintf(err, errlen, "cannot start the I/O loop: %s", uv_strerror(rc));
		goto err_close_loop;
	}
	c->wake.data = c;
	uv_timer_init(&c->loop, &c->tick);
	c->tick.data = c;
	uv_timer_start(&c->tick, on_tick, 100, 100);
	rc = ops->create(&c->loop, &cbs, &hs, c, &c->transport);
	if (rc) {
		snprintf(err, errlen, "cannot create the transport: %s", ps_strerror(rc));
		uv_close((uv_handle_t *)&c->wake, NULL);
		uv_close((uv_handle_t *)&c->tick, NULL);
		uv_run(&c->loop, UV_RUN_DEFAULT);
		goto err_close_loop;
	}
	for (int k = 0; k < cfg->nshards; k++) {
		const struct ps_endpoint *ep = ps_config_replica_addr(cfg, k, c->shards[k].alt);
		rc = ops->connect(c->transport, ep->host, ep->port, (void *)(intptr_t)k,
				  &c->shards[k].conn);
		c->shards[k].state = SH_CONNECTING;
		if (rc) {
			c->shards[k].state = SH_FAILED;
			c->shards[k].status = rc;
			snprintf(c->shards[k].why, sizeof(c->shards[k].why), "shard %d (%s:%d): %s", k,
				 cfg->shards[k].host, cfg->shards[k].port, ps_strerror(rc));
			c->nfailed++;
		}
	}
	if (pthread_create(&c->thread, NULL, io_main, c)) {
		snprintf(err, errlen, "cannot start the I/O thread");
		close_all(c);
		uv_run(&c->loop, UV_RUN_DEFAULT);
		rc = -EAGAIN;
		goto err_close_loop;
	}
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += cfg->limits.connect_timeout_ms / 1000;
	until.tv_nsec += (long)(cfg->limits.connect_timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->mu);
	/* A worker or a reader needs every shard: it stops at the first
	 * failure. A monitor (rank -1) waits for every answer and starts with
	 * whatever it reached; the others report their reason through
	 * ps_client_shard_error and fail their requests. */
	while ((rank == -1 || c->nfailed == 0) && c->nready + c->nfailed < cfg->nshards)
		if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT)
			break;
	rc = 0;
	if (rank == -1) {
		for (int k = 0; k < cfg->nshards; k++) {
			struct shard_conn *sh = &c->shards[k];
			if (sh->state != SH_READY && sh->state != SH_FAILED && !sh->why[0]) {
				snprintf(sh->why, sizeof(sh->why),
					 "shard %d (%s:%d): no handshake within %d ms "
					 "(limits.connect_timeout_ms)", k, cfg->shards[k].host,
					 cfg->shards[k].port, cfg->limits.connect_timeout_ms);
				sh->status = PS_ETIMEDOUT;
			}
		}
	} else if (c->nfailed) {
		for (int k = 0; k < cfg->nshards; k++)
			if (c->shards[k].state == SH_FAILED) {
				snprintf(err, errlen, "%s", c->shards[k].why);
				rc = c->shards[k].status ? c->shards[k].status : PS_ECLOSED;
				break;
			}
	} else if (c->nready < cfg->nshards) {
		for (int k = 0; k < cfg->nshards; k++)
			if (c->shards[k].state != SH_READY) {
				snprintf(err, errlen,
					 "shard %d (%s:%d): no handshake within %d ms (limits.connect_timeout_ms)%s%s",
					 k, cfg->shards[k].host, cfg->shards[k].port,
					 cfg->limits.connect_timeout_ms, c->shards[k].untrusted[0] ?
					 "; the last answer, from a peer that had not proven the secret: "
					 : "", c->shards[k].untrusted);
				break;
			}
		rc = PS_ETIMEDOUT;
	}
	c->started = rc == 0;
	pthread_mutex_unlock(&c->mu);
	if (rc) {
		ps_client_free(c);
		return rc;
	}
	if (rank >= 0 && (rc = resume_together(c, err, errlen))) {
		ps_client_free(c);
		return rc;
	}
	/* an elastic cluster: a rank that is not a member (above
	 * cluster.initial_workers, or one that left) joins by starting */
	if (rank >= 0 && cfg->initial_workers && cfg->initial_workers < cfg->nworkers &&
	    (rc = ps_client_join(c))) {
		snprintf(err, errlen, "%s", c->err);
		ps_client_free(c);
		return rc;
	}
	*out = c;
	return 0;

err_close_loop:
	uv_loop_close(&c->loop);
err_destroy_locks:
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	pthread_rwlock_destroy(&c->maplock);
	ps_shardmap_free(&c->map);
err_free_client:
	ps__client_follow_free(c);
	for (int k = 0; k < cfg->nshards; k++)
		free(c->shards[k].hello);
	sodium_memzero(c->secret, sizeof(c->secret));
	free(c->resid);
	free(c->shards);
	free(c);
	return rc;
}

void ps_client_free(struct ps_client *c)
{
	struct req *r;

	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->stopping = 1;
	pthread_mutex_unlock(&c->mu);
	uv_async_send(&c->wake);
	pthread_join(c->thread, NULL);
	uv_loop_close(&c->loop);
	while ((r = c->reqs)) {
		c->reqs = r->next;
		ps__client_req_free(c, r);
	}
	while (c->deferred) {
		struct deferred *d = c->deferred;
		c->deferred = d->next;
		ps_frame_release(d->f);
		free(d);
	}
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	pthread_rwlock_destroy(&c->maplock);
	ps_shardmap_free(&c->map);
	ps__client_follow_free(c);
	for (int i = 0; c->resid && i < c->cfg->ntensors; i++)
		free(c->resid[i]);
	free(c->resid);
	for (int k = 0; k < c->cfg->nshards; k++)
		free(c->shards[k].hello);
	sodium_memzero(c->secret, sizeof(c->secret));
	free(c->shards);
	free(c->own_cfg);
	free(c->old_cfg);
	free(c);
}

void ps_client_push_bytes(struct ps_client *c, uint64_t *raw, uint64_t *wire)
{
	*raw = c->push_raw;
	*wire = c->push_wire;
}

uint64_t ps_client_clock(struct ps_client *c)
{
	uint64_t v;

	pthread_mutex_lock(&c->mu);
	v = c->clock;
	pthread_mutex_unlock(&c->mu);
	return v;
}
