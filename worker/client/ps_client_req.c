/* ps_client_req.c - requests and their completion, and the public calls.
 *
 * A request (struct req) has one part per shard it involves. Built whole by
 * the calling thread (ps_client_build.c), it is submitted: written at once
 * from the calling thread when nothing is queued before it and the
 * transport can (send_now), else queued for the I/O thread. Every shard's
 * answer, read by the I/O thread or by a thread spinning in ps_client_wait,
 * completes its part under c->mu; the last one completes the request and
 * wakes the waiters. ps_client_wait is the only place a request is freed.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "codec.h"
#include "ps_client_int.h"
#include "ps_err.h"

#if defined(__x86_64__) || defined(__i386__)
#define PS_CPU_RELAX() __builtin_ia32_pause()
#else
#define PS_CPU_RELAX() ((void)0)
#endif

/* Sets the text ps_client_error returns. */
void ps__client_set_err(struct ps_client *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

/* ---- request completion (I/O thread, c->mu held) ---- */

struct req *ps__client_find_req(struct ps_client *c, int64_t id)
{
	for (struct req *r = c->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

/* Records one shard's answer; completes the request when it was the last. */
void ps__client_part_done(struct ps_client *c, struct req *r, int shard, int status,
			  const char *why)
{
	if (!r->parts[shard].waiting)
		return;
	r->parts[shard].waiting = 0;
	if (status && !r->status) {
		r->status = status;
		if (why)
			r->why = strdup(why);  /* NULL when out of memory: the code alone */
	}
	if (--r->pending == 0) {
		r->done = 1; /* read under c->mu, like everything of r */
		if (c->sleepers)
			pthread_cond_broadcast(&c->cv);
	}
}

/* Fails every request waiting on shard k. */
void ps__client_fail_shard_reqs(struct ps_client *c, int k, int status, const char *why)
{
	for (struct req *r = c->reqs; r; r = r->next)
		if (!r->queued)
			ps__client_part_done(c, r, k, status, why);
}

/* ---- replies ---- */

/* Whether the reply of shard k names exactly the slices the pull asked of
 * it, in the order asked (the shard answers in request order, as the
 * request was built: the caller's tensors in turn, each one's slices on
 * k). A slice left out would leave the caller's weights for it stale with
 * no error, a slice twice would mask one left out. */
static int pull_reply_complete(const struct ps_client *c, const struct req *r, int k,
			       const Ps__PullReply *m)
{
	size_t i = 0;

	for (int j = 0; j < r->n; j++)
		for (uint32_t s = c->map.tensor_first[r->tidx[j]];
		     s < c->map.tensor_first[r->tidx[j] + 1]; s++) {
			if (c->map.slices[s].shard != k)
				continue;
			if (i == m->n_slices || m->slices[i]->slice != s)
				return 0;
			i++;
		}
	return i == m->n_slices;
}

void ps__client_on_pull_reply(struct ps_client *c, int k, const Ps__PullReply *m,
			      const struct ps_frame *f)
{
	struct req *r = ps__client_find_req(c, (int64_t)m->req_id);
	int status = 0;
	char why[300] = "";

	if (!r || r->kind != REQ_PULL || !r->parts[k].waiting)
		return; /* timed out or unknown: nothing to write */
	/* every slice checked before any is written: a malformed reply fails
	 * the pull and leaves the caller's weights as they were */
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *s = m->slices[i];
		const struct ps_slice *sl = s->slice < c->map.nslices ? &c->map.slices[s->slice] : NULL;
		/* fp16's length too: a decode failing after a slice before it
		 * was copied would leave those weights half updated */
		if (!sl || sl->shard != k || (s->codec != 0 && s->codec != PS_CODEC_FP16) ||
		    (s->codec == 0 && s->length != (uint64_t)sl->count * sizeof(float)) ||
		    (s->codec == PS_CODEC_FP16 && s->length != (uint64_t)sl->count * sizeof(uint16_t)) ||
		    s->offset > f->hdr.payload_len || s->length > f->hdr.payload_len - s->offset) {
			snprintf(why, sizeof(why), "shard %d sent a malformed pull reply (slice %u)", k,
				 s->slice);
			ps__client_part_done(c, r, k, PS_EPROTO, why);
			return;
		}
	}
	if (!pull_reply_complete(c, r, k, m)) {
		snprintf(why, sizeof(why), "shard %d sent a malformed pull reply (%zu slice(s), "
			 "not the ones asked of it in their order)", k, m->n_slices);
		ps__client_part_done(c, r, k, PS_EPROTO, why);
		return;
	}
	for (size_t i = 0; i < m->n_slices && !status; i++) {
		const Ps__SliceRef *s = m->slices[i];
		const struct ps_slice *sl = &c->map.slices[s->slice];
		int j;
		for (j = 0; j < r->n && r->tidx[j] != sl->tensor; j++)
			;
		if (j == r->n)
			continue;
		if (s->codec == 0) {
			memcpy(r->t[j].data + sl->offset, f->payload + s->offset, s->length);
		} else if (ps_codec_get(PS_CODEC_FP16)->decode(f->payload + s->offset, s->length,
								(size_t)sl->count,
								r->t[j].data + sl->offset, why,
								sizeof(why))) {
			status = PS_EPROTO;
			break;
		}
		if (s->version < r->t[j].version)
			r->t[j].version = s->version;
	}
	if (!status && m->has_members)
		ps__client_note_members(c, m);
	ps__client_part_done(c, r, k, status, why[0] ? why : NULL);
}

void ps__client_on_stats_reply(struct ps_client *c, int k, const Ps__Stats *m)
{
	struct req *r = ps__client_find_req(c, (int64_t)m->req_id);
	struct ps_shard_stats *o;

	if (!r || r->kind != REQ_STATS)
		return;
	o = r->stats;
	memset(o, 0, sizeof(*o));
	o->shard = m->shard;
	o->uptime_s = m->uptime_s;
	o->pushes = m->pushes;
	o->pulls = m->pulls;
	o->bytes_in = m->bytes_in;
	o->bytes_out = m->bytes_out;
	o->applies = m->applies;
	o->apply_seconds = m->apply_seconds;
	o->apply_bytes = m->apply_bytes;
	o->errors = m->errors;
	o->rejected_frames = m->rejected_frames;
	o->auth_failures = m->auth_failures;
	o->duplicate_pushes = m->duplicate_pushes;
	o->reader_refused = m->reader_refused;
	o->member_current = m->member_current;
	o->stop_at = m->stop_at;
	o->top_clock = m->top_clock;
	o->stop_committed = m->stop_committed;
	o->map_epoch = m->map_epoch;
	o->reshard_in_bytes = m->reshard_in_bytes;
	o->reshard_in_slices = m->reshard_in_slices;
	o->reshard_in_rows = m->reshard_in_rows;
	o->decl_digest = m->decl_digest;
	o->decl_tensors = (int)m->decl_tensors;
	o->decl_tables = (int)m->decl_tables;
	for (size_t i = 0; i < m->n_joining && i < m->n_joining_clock && i < 16; i++) {
		o->joining[i] = m->joining[i];
		o->joining_clock[i] = m->joining_clock[i];
		o->njoining = (int)i + 1;
	}
	for (size_t i = 0; i < m->n_leaving && i < m->n_leaving_clock && i < 16; i++) {
		o->leaving[i] = m->leaving[i];
		o->leaving_clock[i] = m->leaving_clock[i];
		o->nleaving = (int)i + 1;
	}
	o->member_epoch = m->member_epoch;
	o->joins = m->joins;
	o->leaves = m->leaves;
	o->nmembers = (int)m->n_members;
	for (size_t i = 0; i < m->n_members && i < 64; i++)
		o->members[i] = m->members[i];
	o->member_status = m->member_status;
	o->member_clock = m->member_clock;
	snprintf(o->member_error, sizeof(o->member_error), "%s",
		 m->member_error ? m->member_error : "");
	o->reply_queue_bytes = m->reply_queue_bytes;
	o->reply_queue_peak = m->reply_queue_peak;
	o->reply_queue_total_peak = m->reply_queue_total_peak;
	o->paused_connections = m->paused_connections;
	o->connections = m->connections;
	o->max_clock_gap = m->max_clock_gap;
	o->param_checksum = m->param_checksum;
	o->repl_state = (int)m->repl_state;
	o->repl_epoch = m->repl_epoch;
	snprintf(o->repl_partner, sizeof(o->repl_partner), "%s",
		 m->repl_partner ? m->repl_partner : "");
	o->repl_partner_up = m->repl_partner_up;
	o->repl_lag = m->repl_lag;
	o->repl_failovers = m->repl_failovers;
	o->repl_lsn = m->repl_lsn;
	o->repl_batches = m->repl_batches;
	o->repl_bytes = m->repl_bytes;
	o->repl_heartbeats = m->repl_heartbeats;
	o->repl_replica = m->repl_replica;
	o->checkpoint_on = m->checkpoint_on;
	o->checkpoint_age_s = m->checkpoint_age_s;
	o->checkpoint_failures = m->checkpoint_failures;
	o->checkpoint_every_s = m->checkpoint_every_s;
	for (size_t i = 0; i < m->n_push_raw_bytes && i < 8; i++)
		o->push_raw_bytes[i] = m->push_raw_bytes[i];
	for (size_t i = 0; i < m->n_push_wire_bytes && i < 8; i++)
		o->push_wire_bytes[i] = m->push_wire_bytes[i];
	o->pull_raw_bytes = m->pull_raw_bytes;
	o->pull_wire_bytes = m->pull_wire_bytes;
	o->nworkers = (int)m->n_workers;
	for (size_t i = 0; i < m->n_workers && i < 64; i++) {
		o->worker_clock[i] = m->workers[i]->clock;
		o->worker_up[i] = m->workers[i]->connected;
		o->dedup_seq[i] = m->workers[i]->dedup_seq;
		o->dedup_digest[i] = m->workers[i]->dedup_digest;
	}
	for (size_t i = 0; i < m->n_push_latency_log2us && i < PS_HISTO_BUCKETS; i++)
		o->push_lat[i] = m->push_latency_log2us[i];
	for (size_t i = 0; i < m->n_pull_latency_log2us && i < PS_HISTO_BUCKETS; i++)
		o->pull_lat[i] = m->pull_latency_log2us[i];
	o->push_lat_sum_s = m->push_latency_sum_s;
	o->pull_lat_sum_s = m->pull_latency_sum_s;
	for (size_t i = 0; i < m->n_tables && i < PS_STATS_MAX_TABLES; i++) {
		const Ps__TableStats *t = m->tables[i];
		struct ps_table_stats *ts = &o->tables[i];
		snprintf(ts->name, sizeof(ts->name), "%s", t->name ? t->name : "");
		ts->dim = t->dim;
		ts->rows = t->rows;
		ts->bytes = t->bytes;
		ts->admitted = t->admitted;
		ts->evicted = t->evicted;
		ts->cap_rows = t->cap_rows;
		ts->expired = t->expired;
		ts->filter_ids = t->filter_ids;
		ts->filter_bytes = t->filter_bytes;
		ts->filter_lookups = t->filter_lookups;
		ts->filter_hits = t->filter_hits;
		ts->pulled_rows = t->pulled_rows;
		ts->pushed_rows = t->pushed_rows;
		ts->version = t->version;
		ts->checksum = t->checksum;
		ts->epoch_unix = t->epoch_unix;
		o->ntables = (int)i + 1;
	}
	o->checkpoint_status = m->checkpoint_status;
	o->checkpoint_bytes = m->checkpoint_bytes;
	o->checkpoint_seconds = m->checkpoint_seconds;
	snprintf(o->checkpoint_path, sizeof(o->checkpoint_path), "%s",
		 m->checkpoint_path ? m->checkpoint_path : "");
	snprintf(o->checkpoint_error, sizeof(o->checkpoint_error), "%s",
		 m->checkpoint_error ? m->checkpoint_error : "");
	ps__client_part_done(c, r, k, 0, NULL);
}

/* ---- requests (calling thread) ---- */

void ps__client_req_free(struct ps_client *c, struct req *r)
{
	(void)c; /* r->nparts: a re-shard may have changed c's count */
	for (int k = 0; k < r->nparts; k++) {
		free(r->parts[k].meta);
		free(r->parts[k].iov);
		free(r->parts[k].enc);
	}
	free(r->parts);
	free(r->tidx);
	free(r->why);
	ps__client_rows_free(r->rows);
	free(r);
}

struct req *ps__client_req_new(struct ps_client *c, enum req_kind kind)
{
	struct req *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	/* the shard count now: a re-shard before the submit fails the
	 * request there (submit) unless it is a push or pull built under
	 * maplock */
	r->nparts = c->cfg->nshards;
	r->parts = calloc((size_t)r->nparts, sizeof(r->parts[0]));
	if (!r->parts) {
		free(r);
		return NULL;
	}
	r->kind = kind;
	return r;
}

static uint8_t req_msg_type(const struct req *r)
{
	switch (r->kind) {
	case REQ_PUSH: return PS_MSG_PUSH;
	case REQ_PULL: return PS_MSG_PULL;
	case REQ_PULL_ROWS: return PS_MSG_PULL_ROWS;
	case REQ_PUSH_ROWS: return PS_MSG_PUSH_ROWS;
	case REQ_DECLARE: return PS_MSG_DECLARE;
	case REQ_DECLARE_TABLES: return PS_MSG_DECLARE_TABLES;
	default: return PS_MSG_STATS_REQUEST;
	}
}

/* Hands r's part for ready shard k to the transport (I/O thread, c->mu
 * held) and notes the connection it went out on: 0 or the send's code. */
int ps__client_send_part(struct ps_client *c, struct req *r, int k)
{
	struct shard_conn *sh = &c->shards[k];
	struct part *p = &r->parts[k];
	int rc = sh->conn->t->ops->send(sh->conn, req_msg_type(r), p->meta, p->meta_len, p->iov,
					p->niov, PS_SEND_STABLE | PS_SEND_FRAME_FLAGS(p->frame_flags),
					NULL, NULL);

	if (rc == 0)
		p->gen = sh->gen;
	return rc;
}

/* With c->mu held and nothing queued before them: writes the small frames
 * of the nr requests rs (in order) from this thread (transport send_now),
 * saving the wake-up of the I/O thread and a thread hop on the latency
 * path. Each shard's frames of all nr requests go in one call, so a push
 * and the pull behind it reach the shard together and are answered in one
 * write. Parts left unsent (gen 0) are the I/O thread's; a part that broke
 * mid-frame fails its request. */
static void send_direct(struct ps_client *c, struct req *const *rs, int nr)
{
	for (int k = 0; k < c->cfg->nshards; k++) {
		struct shard_conn *sh = &c->shards[k];
		struct ps_out_frame f[PS_SEND_NOW_FRAMES];
		struct req *fr[PS_SEND_NOW_FRAMES];
		int nf = 0, rc = -EAGAIN;

		for (int i = 0; i < nr && nf < PS_SEND_NOW_FRAMES; i++) {
			struct part *p = &rs[i]->parts[k];
			if (!p->waiting)
				continue;
			f[nf] = (struct ps_out_frame){ .type = req_msg_type(rs[i]),
						       .flags = PS_SEND_FRAME_FLAGS(p->frame_flags),
						       .meta = p->meta, .meta_len = p->meta_len,
						       .payload = p->iov, .npayload = p->niov };
			fr[nf++] = rs[i];
		}
		if (!nf)
			continue;
		if (sh->state == SH_READY && sh->conn->t->ops->send_now)
			rc = sh->conn->t->ops->send_now(sh->conn, f, nf);
		for (int j = 0; j < nf; j++) {
			if (rc == 0)
				fr[j]->parts[k].gen = sh->gen;
			else if (rc != -EAGAIN && sh->lost_at == 0 &&
				 c->cfg->limits.reconnect_timeout_ms == 0)
				ps__client_part_done(c, fr[j], k, rc, "send failed");
			/* else the I/O thread sends it, or resends it after a reconnect */
		}
	}
}

/* Whether some part of r still has to be handed to the transport. */
static int unsent(const struct ps_client *c, const struct req *r)
{
	for (int k = 0; k < c->cfg->nshards; k++)
		if (r->parts[k].waiting && !r->parts[k].gen)
			return 1;
	return 0;
}

/* Sends the nr requests rs, in order (or queues them for the I/O thread).
 * Returns 0, or PS_ESTATE (and frees them all) when the client is
 * stopping. */
static int submit(struct ps_client *c, struct req *const *rs, int nr)
{
	int queued = 0;

	int stale = 0;

	for (int i = 0; i < nr; i++)
		for (int k = 0; k < rs[i]->nparts; k++)
			if (rs[i]->parts[k].waiting)
				rs[i]->pending++;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < nr; i++)
		stale |= rs[i]->nparts != c->cfg->nshards;
	if (c->stopping || stale) {
		/* stale: built for the shard count before a re-shard (pushes
		 * and pulls are built under maplock, which a re-shard waits
		 * for: only the other kinds) */
		if (stale)
			ps__client_set_err(c, "the shards were re-sharded (%d now) while this "
					   "request was built: make it again", c->cfg->nshards);
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < nr; i++)
			ps__client_req_free(c, rs[i]);
		return stale ? PS_EMAP : PS_ESTATE;
	}
	if (!c->sendq_head)
		send_direct(c, rs, nr);
	for (int i = 0; i < nr; i++) {
		struct req *r = rs[i];
		r->deadline = ps_now_s() + c->cfg->limits.request_timeout_ms / 1000.0;
		if (r->pending == 0) {
			r->done = 1;
		} else if (!r->done && unsent(c, r)) {
			/* after any queued before it: frames leave in submission order */
			r->queued = 1;
			if (c->sendq_tail)
				c->sendq_tail->send_next = r;
			else
				c->sendq_head = r;
			c->sendq_tail = r;
			queued = 1;
		}
		r->next = c->reqs;
		c->reqs = r;
	}
	pthread_mutex_unlock(&c->mu);
	if (queued)
		uv_async_send(&c->wake);
	return 0;
}

/* Submits r, built with code rc: its id, or the negative code. */
int64_t ps__client_submit_built(struct ps_client *c, int rc, struct req *r)
{
	int64_t id;

	if (rc)
		return rc;
	id = r->id;
	rc = submit(c, &r, 1);
	return rc ? rc : id;
}

int64_t ps_client_push(struct ps_client *c, uint64_t clock, const struct ps_tensor *t, int n,
		       unsigned flags)
{
	struct req *r = NULL;
	int64_t id;
	int rc;

	/* built and submitted under one map: a re-shard waits (maplock) */
	pthread_rwlock_rdlock(&c->maplock);
	rc = ps__client_build_push(c, clock, t, n, flags, &r); /* before r is read */
	id = ps__client_submit_built(c, rc, r);
	pthread_rwlock_unlock(&c->maplock);
	return id;
}

int64_t ps_client_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t, int n)
{
	struct req *r = NULL;
	int64_t id;
	int rc;

	pthread_rwlock_rdlock(&c->maplock);
	rc = ps__client_build_pull(c, min_version, t, n, UINT64_MAX, &r);
	id = ps__client_submit_built(c, rc, r);
	pthread_rwlock_unlock(&c->maplock);
	return id;
}

int ps_client_pushpull(struct ps_client *c, uint64_t clock, const struct ps_tensor *grad,
		       int ngrad, unsigned flags, uint64_t min_version, struct ps_tensor *out,
		       int nout, int64_t ids[2])
{
	struct req *r[2];
	int rc;

	pthread_rwlock_rdlock(&c->maplock);
	/* The pull first: a push built (its clock counted as ended) must be
	 * sent, so nothing may fail after it. */
	rc = ps__client_build_pull(c, min_version, out, nout,
				   flags & (PS_PUSH_END_CLOCK | PS_PULL_AFTER_CLOCK) ? clock
				   : UINT64_MAX, &r[1]);
	if (rc)
		goto out_unlock;
	rc = ps__client_build_push(c, clock, grad, ngrad, flags, &r[0]);
	if (rc) {
		ps__client_req_free(c, r[1]);
		goto out_unlock;
	}
	ids[0] = r[0]->id;
	ids[1] = r[1]->id;
	rc = submit(c, r, 2);
out_unlock:
	pthread_rwlock_unlock(&c->maplock);
	return rc;
}

int ps_client_wait(struct ps_client *c, int64_t id)
{
	struct req **pp, *r;
	int status;

	pthread_mutex_lock(&c->mu);
	for (pp = &c->reqs; (r = *pp) && r->id != id; pp = &r->next)
		;
	if (!r) {
		ps__client_set_err(c, "request %" PRId64 " is not pending on this client", id);
		pthread_mutex_unlock(&c->mu);
		return -EINVAL;
	}
	if (!r->done && c->spin_s > 0) {
		/* Poll briefly before sleeping: this thread reads the reply off
		 * the socket itself (transport recv_now), so a reply that comes
		 * within spin_s costs neither the I/O thread's wake-up and
		 * hand-over nor a futex wake-up. The I/O thread still reads
		 * whatever this thread does not. r stays ours (only this function
		 * frees it). */
		double until = ps_now_s() + c->spin_s;

		while (!r->done && ps_now_s() < until) {
			int polled = 0;
			for (int k = 0; k < c->cfg->nshards && !r->done; k++) {
				struct shard_conn *sh = &c->shards[k];
				/* c->mu held: sh->conn stays alive (on_close takes it) */
				if (r->parts[k].waiting && sh->state == SH_READY && sh->conn &&
				    sh->conn->t->ops->recv_now) {
					sh->conn->t->ops->recv_now(sh->conn, ps__client_take, c);
					polled = 1;
				}
			}
			pthread_mutex_unlock(&c->mu);
			if (!polled)
				PS_CPU_RELAX();
			pthread_mutex_lock(&c->mu);
		}
	}
	c->sleepers++;
	while (!r->done)
		pthread_cond_wait(&c->cv, &c->mu);
	c->sleepers--;
	/* The list may have changed while waiting: unlink by search again. */
	for (pp = &c->reqs; *pp != r; pp = &(*pp)->next)
		;
	*pp = r->next;
	if (r->queued) {
		/* done before it was sent (a shard failed): leave the send queue */
		struct req *prev = NULL;

		for (struct req *q = c->sendq_head; q; prev = q, q = q->send_next) {
			if (q != r)
				continue;
			if (prev)
				prev->send_next = q->send_next;
			else
				c->sendq_head = q->send_next;
			if (c->sendq_tail == q)
				c->sendq_tail = prev;
			break;
		}
	}
	status = r->status;
	if (status)
		ps__client_set_err(c, "%s", r->why ? r->why : ps_strerror(status));
	pthread_mutex_unlock(&c->mu);
	ps__client_req_free(c, r);
	return status;
}

const char *ps_client_shard_error(struct ps_client *c, int shard, char *buf, size_t len)
{
	const char *why = NULL;

	if (shard < 0 || shard >= c->cfg->nshards)
		return NULL;
	pthread_mutex_lock(&c->mu);
	if (c->shards[shard].state != SH_READY) {
		snprintf(buf, len, "%s", c->shards[shard].why[0] ? c->shards[shard].why
				   : "not connected");
		why = buf;
	}
	pthread_mutex_unlock(&c->mu);
	return why;
}

const char *ps_client_error(struct ps_client *c)
{
	return c->err;
}


int ps__client_resume(struct ps_client *c, int k, uint64_t clock)
{
	static __thread struct ps_shard_stats st; /* the answer, not needed */
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r = ps__client_req_new(c, REQ_STATS);
	int64_t id;

	if (!r)
		return -ENOMEM;
	r->stats = &st;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.resume_clock = clock;
	if (ps__client_pack_part(&r->parts[k], &m.base)) {
		ps__client_req_free(c, r);
		return -ENOMEM;
	}
	id = ps__client_submit_built(c, 0, r);
	return id < 0 ? (int)id : ps_client_wait(c, id);
}

/* The stats request into a whole struct of this library's size (brief:
 * without the tables' checksums). Asked again of the new map's shard of
 * that index when a re-shard the client followed ($PS_CONFIG_FOLLOW) cut
 * it off (it failed with PS_EMAP: ps_client_follow.c); a shard index the
 * new map lacks fails with PS_EMAP and the shard count now (ask again). */
static int stats_request(struct ps_client *c, int shard, int write, int brief,
			 struct ps_shard_stats *out)
{
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r;
	int64_t id;
	uint64_t gen;
	double since = 0;
	int rc, nsh;

again:
	/* built and submitted under one map (maplock): a re-shard after the
	 * submission cuts it again, failing it with PS_EMAP */
	pthread_rwlock_rdlock(&c->maplock);
	gen = c->reshards;
	nsh = c->cfg->nshards;
	if (shard < 0 || shard >= nsh) {
		pthread_rwlock_unlock(&c->maplock);
		if (!since)
			return -EINVAL;
		ps__client_set_err(c, "shard %d: the shards were re-sharded (%d now) while its %s "
				   "request was in flight: there is no shard %d now; ask again of "
				   "shards 0 to %d", shard, nsh, write ? "checkpoint" : "stats", shard,
				   nsh - 1);
		return PS_EMAP;
	}
	r = ps__client_req_new(c, REQ_STATS);
	if (!r) {
		pthread_rwlock_unlock(&c->maplock);
		return -ENOMEM;
	}
	memset(out, 0, sizeof(*out));
	r->stats = out;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.checkpoint = write != 0;
	m.no_checksums = brief != 0;
	if (ps__client_pack_part(&r->parts[shard], &m.base)) {
		ps__client_req_free(c, r);
		pthread_rwlock_unlock(&c->maplock);
		return -ENOMEM;
	}
	id = ps__client_submit_built(c, 0, r);
	pthread_rwlock_unlock(&c->maplock);
	rc = id < 0 ? (int)id : ps_client_wait(c, id);
	if (rc == PS_EMAP && ps__client_again_on_new_map(c, write ? "a checkpoint request" :
							 "a stats request", gen, &since))
		goto again;
	return rc;
}

/* struct ps_shard_stats grows at its end from one release to the next: a
 * program passes the size it was built with (ps_client.h's macros do), and
 * gets the fields it knows; fields it was built with that this library
 * lacks are zeroed. */
int ps_client_checkpoint_sized(struct ps_client *c, int shard, int write,
			       struct ps_shard_stats *out, size_t size)
{
	struct ps_shard_stats *full = out;
	int rc;

	if (!out || size < offsetof(struct ps_shard_stats, uptime_s))
		return -EINVAL;
	if (size != sizeof(*out) && !(full = calloc(1, sizeof(*full))))
		return -ENOMEM;
	rc = stats_request(c, shard, write, 0, full);
	if (full != out) {
		memcpy(out, full, size < sizeof(*full) ? size : sizeof(*full));
		if (size > sizeof(*full))
			memset((char *)out + sizeof(*full), 0, size - sizeof(*full));
		free(full);
	}
	return rc;
}

int ps_client_stats_sized(struct ps_client *c, int shard, struct ps_shard_stats *out, size_t size)
{
	return ps_client_checkpoint_sized(c, shard, 0, out, size);
}

/* The entry points of programs built before the sized calls existed: the
 * whole struct as this library knows it (the names in parentheses are not
 * the header's macros). */
int (ps_client_checkpoint)(struct ps_client *c, int shard, int write, struct ps_shard_stats *out)
{
	return stats_request(c, shard, write, 0, out);
}

int (ps_client_stats)(struct ps_client *c, int shard, struct ps_shard_stats *out)
{
	return stats_request(c, shard, 0, 0, out);
}

int ps__client_stats_clocks(struct ps_client *c, int shard, struct ps_shard_stats *out)
{
	return stats_request(c, shard, 0, 1, out);
}
