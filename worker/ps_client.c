/* ps_client.c - requests, slicing and the client's I/O thread.
 *
 * The calling thread builds each request completely (slices grouped per
 * shard, metadata packed, payload pieces pointing into the caller's tensors)
 * and queues it; the I/O thread, woken by a uv_async_t, only hands frames to
 * the transport and matches replies to requests by id. One mutex guards the
 * request list and the client's state; completions broadcast one condvar.
 *
 * A worker's shard whose connection is lost after it was ready is
 * reconnected with backoff for limits.reconnect_timeout_ms (a monitor's
 * is reported down at once); its requests stay waiting and
 * every part not answered is sent again on the new connection, oldest
 * first (a part remembers the connection generation it went out on).
 * Pushes are numbered (Push.seq = request id) and the client keeps its
 * incarnation across reconnects, so the shard applies a resent push at most
 * once (server/dedup.h): exactly once, since it is resent until answered.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sodium.h>
#include "ps_time.h"
#include "auth.h"
#include "codec.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_log.h"
#include "shardmap.h"

#if defined(__x86_64__) || defined(__i386__)
#define PS_CPU_RELAX() __builtin_ia32_pause()
#else
#define PS_CPU_RELAX() ((void)0)
#endif

enum req_kind { REQ_PUSH, REQ_PULL, REQ_STATS };
enum shard_state { SH_CONNECTING, SH_HELLO, SH_READY, SH_FAILED, SH_RETRY };

struct part {               /* what one request sends to one shard */
	uint8_t *meta;
	uint32_t meta_len;
	int niov;
	struct ps_iov *iov;
	uint8_t *enc;           /* push: encoded slices (codecs), then LZ4 output */
	unsigned frame_flags;   /* PS_FRAME_F_* of the frame */
	int waiting;            /* reply still expected from this shard */
	unsigned gen;           /* connection generation it was sent on; 0 = not yet */
};

struct req {
	int64_t id;
	enum req_kind kind;
	int pending;            /* shards still to answer */
	int status;
	int done;
	int queued;             /* not yet handed to the I/O thread */
	double deadline;
	struct ps_tensor *t;    /* pull: the caller's tensors */
	int n;
	int *tidx;              /* pull: config tensor index of t[i] */
	struct ps_shard_stats *stats;
	uint64_t clock;         /* push: its clock, and whether it ends it */
	int end_clock;
	struct req *next;
	struct req *send_next;  /* queue of requests for the I/O thread to send */
	struct part parts[];    /* one per shard */
};

struct shard_conn {
	struct ps_conn *conn;
	double last_rx, last_hb;  /* I/O thread: last frame from the shard, last heartbeat sent */
	enum shard_state state;
	int status;
	int authed;               /* the shard proved it holds the secret */
	unsigned gen;             /* connections that reached ready so far */
	double lost_at;           /* reconnecting since (0 = not) */
	double retry_at, backoff; /* SH_RETRY: next attempt, and the delay after it */
	double attempt_at;        /* when the current reconnect attempt started */
	uint64_t boot_id;         /* the shard process's, from its HelloReply */
	uint64_t done_clock;      /* clocks whose ending push this shard acknowledged */
	uint8_t *hello;           /* the Hello as sent (the transcript covers it) */
	size_t hello_len;
	char why[400];
};

struct deferred {           /* a frame take() leaves to the I/O thread */
	struct deferred *next;
	struct ps_frame *f;
	int k;
	unsigned gen;           /* the connection it came on (shard_conn.gen) */
};

struct ps_client {
	const struct ps_config *cfg;
	struct ps_shardmap map;
	int rank;
	uint64_t clock;
	uv_loop_t loop;
	uv_async_t wake;
	uv_timer_t tick;
	pthread_t thread;
	struct ps_transport *transport;
	struct shard_conn *shards;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct req *reqs;       /* every request not yet waited for */
	/* Requests submitted and not yet sent, oldest first: frames must leave
	 * in submission order (a sync shard expects clock c before c + 1, and a
	 * worker's last push of a clock ends it). */
	struct req *sendq_head, *sendq_tail;
	/* Frames read by a waiting thread that only the I/O thread may handle,
	 * oldest first. */
	struct deferred *deferred, **deferred_tail;
	/* Push compression: per tensor, the error-feedback residual (NULL until
	 * first used, only for codecs with error feedback); bytes pushed as
	 * float32 and as sent. Touched by the pushing thread only. */
	float **resid;
	uint64_t push_raw, push_wire;
	int64_t next_id;
	double spin_s;          /* ps_client_wait spins this long before sleeping */
	int sleepers;           /* threads blocked in pthread_cond_wait on cv */
	int stopping;
	int started;            /* init succeeded: losses are worth a log line */
	int nready, nfailed;
	uint8_t secret[PS_AUTH_KEY_LEN]; /* hashed cluster secret (security.auth) */
	uint64_t incarnation;   /* random per client, the same across reconnects */
	char err[512];
};

static void set_err(struct ps_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void set_err(struct ps_client *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

/* ---- request completion (I/O thread, c->mu held) ---- */

static struct req *find_req(struct ps_client *c, int64_t id)
{
	for (struct req *r = c->reqs; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

/* Records one shard's answer; completes the request when it was the last. */
static void part_done(struct ps_client *c, struct req *r, int shard, int status,
		      const char *why)
{
	if (!r->parts[shard].waiting)
		return;
	r->parts[shard].waiting = 0;
	if (status && !r->status) {
		r->status = status;
		if (why)
			set_err(c, "%s", why);
	}
	if (--r->pending == 0) {
		r->done = 1; /* read under c->mu, like everything of r */
		if (c->sleepers)
			pthread_cond_broadcast(&c->cv);
	}
}

/* Fails every request waiting on shard k. */
static void fail_shard_reqs(struct ps_client *c, int k, int status, const char *why)
{
	for (struct req *r = c->reqs; r; r = r->next)
		if (!r->queued)
			part_done(c, r, k, status, why);
}

/* ---- replies ---- */

static void on_pull_reply(struct ps_client *c, int k, const Ps__PullReply *m,
			  const struct ps_frame *f)
{
	struct req *r = find_req(c, (int64_t)m->req_id);
	int status = 0;
	char why[300] = "";

	if (!r || r->kind != REQ_PULL || !r->parts[k].waiting)
		return; /* timed out or unknown: nothing to write */
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *s = m->slices[i];
		const struct ps_slice *sl = s->slice < c->map.nslices ? &c->map.slices[s->slice] : NULL;
		int j;
		if (!sl || sl->shard != k || (s->codec != 0 && s->codec != PS_CODEC_FP16) ||
		    (s->codec == 0 && s->length != (uint64_t)sl->count * sizeof(float)) ||
		    s->offset > f->hdr.payload_len || s->length > f->hdr.payload_len - s->offset) {
			status = PS_EPROTO;
			snprintf(why, sizeof(why), "shard %d sent a malformed pull reply (slice %u)", k,
				 s->slice);
			break;
		}
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
	part_done(c, r, k, status, why[0] ? why : NULL);
}

static void on_stats_reply(struct ps_client *c, int k, const Ps__Stats *m)
{
	struct req *r = find_req(c, (int64_t)m->req_id);
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
	o->connections = m->connections;
	o->max_clock_gap = m->max_clock_gap;
	o->param_checksum = m->param_checksum;
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
	}
	for (size_t i = 0; i < m->n_push_latency_log2us && i < PS_HISTO_BUCKETS; i++)
		o->push_lat[i] = m->push_latency_log2us[i];
	for (size_t i = 0; i < m->n_pull_latency_log2us && i < PS_HISTO_BUCKETS; i++)
		o->pull_lat[i] = m->pull_latency_log2us[i];
	o->push_lat_sum_s = m->push_latency_sum_s;
	o->pull_lat_sum_s = m->pull_latency_sum_s;
	o->checkpoint_status = m->checkpoint_status;
	o->checkpoint_bytes = m->checkpoint_bytes;
	o->checkpoint_seconds = m->checkpoint_seconds;
	snprintf(o->checkpoint_path, sizeof(o->checkpoint_path), "%s",
		 m->checkpoint_path ? m->checkpoint_path : "");
	snprintf(o->checkpoint_error, sizeof(o->checkpoint_error), "%s",
		 m->checkpoint_error ? m->checkpoint_error : "");
	part_done(c, r, k, 0, NULL);
}

/* The handshake with shard k failed on this side: the connection closes
 * and init (woken here) reports why. c->mu held. */
static void fail_handshake(struct ps_client *c, int k, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void fail_handshake(struct ps_client *c, int k, int status, const char *fmt, ...)
{
	struct shard_conn *sh = &c->shards[k];
	int n;
	va_list ap;

	n = snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d): ", k, c->cfg->shards[k].host,
		     c->cfg->shards[k].port);
	va_start(ap, fmt);
	vsnprintf(sh->why + n, sizeof(sh->why) - (size_t)n, fmt, ap);
	va_end(ap);
	sh->state = SH_FAILED;
	sh->status = status;
	c->nfailed++;
	sh->conn->t->ops->close(sh->conn, status);
	pthread_cond_broadcast(&c->cv);
}

/* The shard's nonce and proof: check the proof, answer with ours, and
 * switch to the session keys. c->mu held. */
static void on_auth_challenge(struct ps_client *c, int k, const Ps__AuthChallenge *m)
{
	struct shard_conn *sh = &c->shards[k];
	Ps__Auth a = PS__AUTH__INIT;
	uint8_t t[32], proof[PS_AUTH_PROOF_LEN];
	struct ps_frame_keys keys;

	if (sh->state != SH_HELLO || sh->authed || !sh->hello) {
		fail_handshake(c, k, PS_EPROTO, "unexpected auth-challenge");
		return;
	}
	if (!c->cfg->security.auth) {
		fail_handshake(c, k, PS_EAUTH, "the shard requires authentication and this process "
			       "has security.auth: false; the two configs must agree");
		return;
	}
	if (m->nonce.len != PS_AUTH_NONCE_LEN) {
		fail_handshake(c, k, PS_EPROTO, "auth-challenge with a %zu-byte nonce",
			       m->nonce.len);
		return;
	}
	ps_auth_transcript(sh->hello, sh->hello_len, m->nonce.data, t);
	if (!ps_auth_proof_ok(c->secret, t, 1, m->proof.data, m->proof.len)) {
		fail_handshake(c, k, PS_EAUTH, "authentication failed: the shard's proof does not "
			       "match this process's secret (the secret files differ)");
		return;
	}
	sh->authed = 1;
	ps_auth_proof(c->secret, t, 0, proof);
	a.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	if (ps_msg_send(sh->conn, PS_MSG_AUTH, &a.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL)) {
		fail_handshake(c, k, PS_ECLOSED, "connection lost during authentication");
		return;
	}
	if (c->cfg->security.mac) {
		ps_auth_session_keys(c->secret, t, 0, &keys);
		sh->conn->t->ops->set_keys(sh->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	}
	sodium_memzero(t, sizeof(t));
}

static uint8_t req_msg_type(const struct req *r)
{
	return r->kind == REQ_PUSH ? PS_MSG_PUSH
	     : r->kind == REQ_PULL ? PS_MSG_PULL : PS_MSG_STATS_REQUEST;
}

/* Hands r's part for ready shard k to the transport (I/O thread, c->mu
 * held) and notes the connection it went out on: 0 or the send's code. */
static int send_part(struct ps_client *c, struct req *r, int k)
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

static int by_id(const void *a, const void *b)
{
	int64_t x = (*(struct req *const *)a)->id, y = (*(struct req *const *)b)->id;
	return x < y ? -1 : x > y;
}

/* After a reconnect: sends every part for shard k not answered and not yet
 * sent on this connection, oldest request first. c->mu held, I/O thread.
 * Returns how many. */
static int resend(struct ps_client *c, int k)
{
	struct shard_conn *sh = &c->shards[k];
	struct req **v;
	int n = 0, i = 0;

	for (struct req *r = c->reqs; r; r = r->next)
		n += r->parts[k].waiting && r->parts[k].gen != sh->gen;
	if (!n)
		return 0;
	v = malloc(sizeof(*v) * (size_t)n);
	if (!v) {
		sh->conn->t->ops->close(sh->conn, -ENOMEM);
		return 0;
	}
	for (struct req *r = c->reqs; r; r = r->next)
		if (r->parts[k].waiting && r->parts[k].gen != sh->gen)
			v[i++] = r;
	qsort(v, (size_t)n, sizeof(*v), by_id);
	for (i = 0; i < n; i++)
		if (send_part(c, v[i], k))
			break; /* the connection broke again: on_close takes over */
	free(v);
	return n;
}

static void on_hello_reply(struct ps_client *c, int k, const Ps__HelloReply *m)
{
	struct shard_conn *sh = &c->shards[k];

	if (sh->state != SH_HELLO)
		return;
	if (m->ok && c->cfg->security.auth && !sh->authed) {
		fail_handshake(c, k, PS_EAUTH, "the shard accepted this process without "
			       "authentication (security.auth: false there, true here); refusing it, "
			       "the two configs must agree");
		return;
	}
	if (!m->ok) {
		sh->state = SH_FAILED;
		sh->status = PS_EREFUSED;
		snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d) refused the handshake: %s", k,
			 c->cfg->shards[k].host, c->cfg->shards[k].port, m->error);
		c->nfailed++;
	} else {
		struct ps_wire_limits lim = {
			.max_frame = c->cfg->limits.max_frame_bytes,
			.max_meta = c->cfg->limits.max_meta_bytes,
		};
		sh->conn->t->ops->set_limits(sh->conn, &lim);
		sh->state = SH_READY;
		sh->last_hb = ps_now_s();
		sh->gen++;
		if (m->clock > c->clock)
			c->clock = m->clock; /* a shard resumed from a checkpoint */
		c->nready++;
		if (sh->lost_at > 0) {
			int n = resend(c, k);
			ps_warn("shard %d (%s:%d): reconnected after %.1f s%s; %d request(s) sent again",
				k, c->cfg->shards[k].host, c->cfg->shards[k].port,
				ps_now_s() - sh->lost_at,
				sh->boot_id && m->boot_id != sh->boot_id ? " to a restarted shard" : "",
				n);
			sh->lost_at = 0;
			sh->why[0] = 0;
			sh->status = 0;
		}
		sh->boot_id = m->boot_id;
	}
	pthread_cond_broadcast(&c->cv);
}

/* The frames a ready connection carries: handled with c->mu held, on the
 * I/O thread (on_frame) or on a waiting thread that read them itself
 * (take). 0 when type is not one of them. */
static int reply_frame(struct ps_client *c, int k, const struct ps_frame *f, ProtobufCMessage *m)
{
	c->shards[k].last_rx = ps_now_s();
	switch (f->hdr.type) {
	case PS_MSG_HEARTBEAT:
		return 1; /* last_rx is all it is for */
	case PS_MSG_PUSH_ACK: {
		struct req *r = find_req(c, (int64_t)((Ps__PushAck *)m)->req_id);
		if (r && r->kind == REQ_PUSH && r->end_clock && r->parts[k].waiting &&
		    r->clock + 1 > c->shards[k].done_clock)
			c->shards[k].done_clock = r->clock + 1;
		if (r)
			part_done(c, r, k, 0, NULL);
		return 1;
	}
	case PS_MSG_PULL_REPLY:
		on_pull_reply(c, k, (Ps__PullReply *)m, f);
		return 1;
	case PS_MSG_STATS:
		on_stats_reply(c, k, (Ps__Stats *)m);
		return 1;
	case PS_MSG_ERROR: {
		Ps__Error *e = (Ps__Error *)m;
		struct req *r = find_req(c, (int64_t)e->req_id);
		char text[600];
		snprintf(text, sizeof(text), "shard %d: %s", k, e->message);
		if (r)
			part_done(c, r, k, e->code < 0 ? e->code : PS_EPROTO, text);
		return 1;
	}
	default:
		return 0;
	}
}

static void on_frame(struct ps_conn *pc, struct ps_frame *f)
{
	struct ps_client *c = pc->t->data;
	int k = (int)(intptr_t)pc->data;
	ProtobufCMessage *m;
	char why[200];

	m = ps_msg_unpack(f, why, sizeof(why));
	if (!m) {
		ps_warn("closing connection to shard %d: %s", k, why);
		ps_frame_release(f);
		pc->t->ops->close(pc, PS_EPROTO);
		return;
	}
	pthread_mutex_lock(&c->mu);
	if (!reply_frame(c, k, f, m)) {
		switch (f->hdr.type) {
		case PS_MSG_HELLO_REPLY:
			on_hello_reply(c, k, (Ps__HelloReply *)m);
			break;
		case PS_MSG_AUTH_CHALLENGE:
			on_auth_challenge(c, k, (Ps__AuthChallenge *)m);
			break;
		default:
			ps_warn("shard %d sent an unexpected %s frame", k,
				ps_wire_type_name(f->hdr.type));
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	protobuf_c_message_free_unpacked(m, NULL);
	ps_frame_release(f);
}

/* A frame a waiting thread read itself (transport recv_now), c->mu held.
 * Replies are handled here; anything else (a handshake frame out of turn,
 * metadata that does not unpack) may need the connection closed, which
 * only the I/O thread can do: it goes there, and on_frame deals with it. */
static void take(struct ps_conn *pc, struct ps_frame *f, void *arg)
{
	struct ps_client *c = arg;
	int k = (int)(intptr_t)pc->data;
	ProtobufCMessage *m = ps_msg_unpack(f, NULL, 0);
	struct deferred *d;

	if (m && reply_frame(c, k, f, m)) {
		protobuf_c_message_free_unpacked(m, NULL);
		ps_frame_release(f);
		return;
	}
	if (m)
		protobuf_c_message_free_unpacked(m, NULL);
	d = malloc(sizeof(*d));
	if (!d) {
		ps_frame_release(f); /* unexpected anyway: on_frame would only warn or close */
		return;
	}
	*d = (struct deferred){ .f = f, .k = k, .gen = c->shards[k].gen };
	*c->deferred_tail = d;
	c->deferred_tail = &d->next;
	uv_async_send(&c->wake);
}

static void on_connect(struct ps_conn *pc, int status)
{
	struct ps_client *c = pc->t->data;
	int k = (int)(intptr_t)pc->data;
	Ps__Hello h = PS__HELLO__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN], *hello;
	size_t len;

	if (status < 0) {
		pthread_mutex_lock(&c->mu);
		snprintf(c->shards[k].why, sizeof(c->shards[k].why), "shard %d (%s:%d): connect: %s",
			 k, c->cfg->shards[k].host, c->cfg->shards[k].port, uv_strerror(status));
		pthread_mutex_unlock(&c->mu);
		return; /* on_close follows */
	}
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = c->rank >= 0 ? PS__ROLE__ROLE_WORKER : PS__ROLE__ROLE_STAT;
	h.rank = c->rank;
	h.shard_map_hash = c->map.hash;
	h.shard = k;
	h.incarnation = c->incarnation;
	h.done_clock = c->shards[k].done_clock;
	if (c->cfg->security.auth) {
		ps_auth_random(nonce, sizeof(nonce));
		h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		h.auth_mac = c->cfg->security.mac;
	}
	/* Packed here, not by ps_msg_send: the transcript covers these bytes. */
	len = protobuf_c_message_get_packed_size(&h.base);
	hello = malloc(len ? len : 1);
	if (!hello) {
		pc->t->ops->close(pc, -ENOMEM);
		return;
	}
	protobuf_c_message_pack(&h.base, hello);
	pthread_mutex_lock(&c->mu);
	c->shards[k].state = SH_HELLO;
	free(c->shards[k].hello);
	c->shards[k].hello = hello;
	c->shards[k].hello_len = len;
	pthread_mutex_unlock(&c->mu);
	pc->t->ops->send(pc, PS_MSG_HELLO, hello, (uint32_t)len, NULL, 0, PS_SEND_VOLATILE, NULL,
			 NULL);
}

static void on_close(struct ps_conn *pc, int status)
{
	struct ps_client *c = pc->t->data;
	int k = (int)(intptr_t)pc->data;
	struct shard_conn *sh = &c->shards[k];

	pthread_mutex_lock(&c->mu);
	if (sh->state == SH_READY)
		c->nready--;
	if (sh->state != SH_FAILED && sh->gen > 0 && c->started && !c->stopping &&
	    c->rank >= 0 && c->cfg->limits.reconnect_timeout_ms > 0) {
		/* a worker's shard that was ready once: try again, keeping its
		 * requests waiting (a monitor reports the shard down instead) */
		double now = ps_now_s();
		if (sh->lost_at == 0) {
			sh->lost_at = now;
			sh->backoff = 0.1;
			ps_warn("shard %d (%s:%d): connection lost (%s); reconnecting for up to %d ms",
				k, c->cfg->shards[k].host, c->cfg->shards[k].port,
				sh->why[0] ? sh->why : ps_strerror(status ? status : PS_ECLOSED),
				c->cfg->limits.reconnect_timeout_ms);
		}
		if (now - sh->lost_at < c->cfg->limits.reconnect_timeout_ms / 1000.0) {
			sh->state = SH_RETRY;
			sh->retry_at = now + sh->backoff;
			sh->backoff = sh->backoff * 2 < 2.0 ? sh->backoff * 2 : 2.0;
			sh->conn = NULL;
			sh->authed = 0;
			sh->why[0] = 0;
			pthread_mutex_unlock(&c->mu);
			return;
		}
		sh->status = PS_ETIMEDOUT;
		sh->lost_at = 0; /* given up: new requests fail at once */
		snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d): unreachable for %d ms "
			 "(limits.reconnect_timeout_ms)", k, c->cfg->shards[k].host,
			 c->cfg->shards[k].port, c->cfg->limits.reconnect_timeout_ms);
	}
	if (sh->state != SH_FAILED) {
		sh->state = SH_FAILED;
		c->nfailed++;
		if (!sh->status)
			sh->status = status ? status : PS_ECLOSED;
		if (!sh->why[0])
			snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d): connection lost: %s", k,
				 c->cfg->shards[k].host, c->cfg->shards[k].port,
				 ps_strerror(sh->status));
		if (c->started && !c->stopping)
			ps_warn("%s", sh->why);
	}
	sh->conn = NULL;
	fail_shard_reqs(c, k, sh->status, sh->why);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

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
					part_done(c, r, k, sh->status ? sh->status : PS_ECLOSED, sh->why);
				continue; /* reconnecting: resent once ready */
			}
			rc = send_part(c, r, k);
			if (rc && sh->lost_at == 0 && c->cfg->limits.reconnect_timeout_ms == 0)
				part_done(c, r, k, rc, "send failed");
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
			on_frame(conn, d->f);
		else
			ps_frame_release(d->f); /* its connection is gone */
		free(d);
		d = next;
	}
	if (stopping)
		close_all(c);
}

/* Heartbeats: every third of limits.idle_timeout_ms each ready shard gets
 * one (it answers), so the shard does not take this quiet client for dead,
 * and a shard from which nothing came for the whole timeout (hung, or the
 * network lost) is closed, failing its requests with that reason. Called
 * with c->mu held. */
static void heartbeats(struct ps_client *c, double now)
{
	double idle = c->cfg->limits.idle_timeout_ms / 1000.0;

	if (idle <= 0)
		return;
	for (int k = 0; k < c->cfg->nshards; k++) {
		struct shard_conn *sh = &c->shards[k];
		Ps__Heartbeat hb = PS__HEARTBEAT__INIT;

		if (sh->state != SH_READY || !sh->conn)
			continue;
		if (now - sh->last_rx > idle) {
			sh->status = PS_ETIMEDOUT;
			snprintf(sh->why, sizeof(sh->why),
				 "shard %d (%s:%d): nothing received for %d ms (limits.idle_timeout_ms)",
				 k, c->cfg->shards[k].host, c->cfg->shards[k].port,
				 c->cfg->limits.idle_timeout_ms);
			sh->conn->t->ops->close(sh->conn, PS_ETIMEDOUT);
			continue;
		}
		if (now - sh->last_hb >= idle / 3) {
			sh->last_hb = now;
			hb.seq = (uint64_t)(now * 1000);
			ps_msg_send(sh->conn, PS_MSG_HEARTBEAT, &hb.base, NULL, 0, PS_SEND_VOLATILE,
				    NULL, NULL);
		}
	}
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
	char why[sizeof(c->shards[0].why)];

	pthread_mutex_lock(&c->mu);
	heartbeats(c, now);
	for (struct req *r = c->reqs; r; r = r->next) {
		if (r->queued || r->done || now < r->deadline)
			continue;
		for (int k = 0; k < c->cfg->nshards; k++) {
			struct shard_conn *sh = &c->shards[k];
			if (!r->parts[k].waiting)
				continue;
			snprintf(why, sizeof(why), "shard %d (%s:%d): no answer within %d ms "
				 "(limits.request_timeout_ms)%s", k, c->cfg->shards[k].host,
				 c->cfg->shards[k].port, c->cfg->limits.request_timeout_ms,
				 sh->lost_at > 0 ? "; the connection is lost and being retried" : "");
			if (sh->conn && sh->state == SH_READY && r->parts[k].gen == sh->gen) {
				snprintf(sh->why, sizeof(sh->why), "%s", why);
				sh->status = PS_ETIMEDOUT;
				sh->conn->t->ops->close(sh->conn, PS_ETIMEDOUT);
			}
			part_done(c, r, k, PS_ETIMEDOUT, why);
		}
	}
	for (int k = 0; k < c->cfg->nshards; k++) {
		struct shard_conn *sh = &c->shards[k];
		int rc;
		if (sh->lost_at > 0 && sh->conn && sh->state != SH_READY &&
		    now - sh->attempt_at > c->cfg->limits.connect_timeout_ms / 1000.0) {
			/* this attempt hangs (a partition drops the SYN, or the shard
			 * does not answer the handshake): give it up, on_close retries */
			sh->conn->t->ops->close(sh->conn, PS_ETIMEDOUT);
			continue;
		}
		if (sh->state != SH_RETRY || now < sh->retry_at)
			continue;
		sh->state = SH_CONNECTING;
		sh->attempt_at = now;
		rc = c->transport->ops->connect(c->transport, c->cfg->shards[k].host,
						c->cfg->shards[k].port, (void *)(intptr_t)k, &sh->conn);
		if (rc) {
			sh->conn = NULL;
			sh->state = SH_RETRY;
			sh->retry_at = now + sh->backoff;
		}
	}
	pthread_mutex_unlock(&c->mu);
}

static void *io_main(void *arg)
{
	struct ps_client *c = arg;

	uv_run(&c->loop, UV_RUN_DEFAULT);
	return NULL;
}

/* ---- requests (calling thread) ---- */

static void req_free(struct ps_client *c, struct req *r)
{
	for (int k = 0; k < c->cfg->nshards; k++) {
		free(r->parts[k].meta);
		free(r->parts[k].iov);
		free(r->parts[k].enc);
	}
	free(r->tidx);
	free(r);
}

static struct req *req_new(struct ps_client *c, enum req_kind kind)
{
	struct req *r = calloc(1, sizeof(*r) + (size_t)c->cfg->nshards * sizeof(r->parts[0]));

	if (r)
		r->kind = kind;
	return r;
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
				part_done(c, fr[j], k, rc, "send failed");
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

	for (int i = 0; i < nr; i++)
		for (int k = 0; k < c->cfg->nshards; k++)
			if (rs[i]->parts[k].waiting)
				rs[i]->pending++;
	pthread_mutex_lock(&c->mu);
	if (c->stopping) {
		pthread_mutex_unlock(&c->mu);
		for (int i = 0; i < nr; i++)
			req_free(c, rs[i]);
		return PS_ESTATE;
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

/* Packs msg into part p (of the shard it goes to). */
static int pack_part(struct part *p, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);

	p->meta = malloc(len ? len : 1);
	if (!p->meta)
		return -ENOMEM;
	p->meta_len = (uint32_t)protobuf_c_message_pack(msg, p->meta);
	p->waiting = 1;
	return 0;
}

/* Checks the caller's tensors against the config; fills tidx. */
static int resolve_tensors(struct ps_client *c, const struct ps_tensor *t, int n, int *tidx)
{
	for (int i = 0; i < n; i++) {
		int ti = t[i].name ? ps_config_find_tensor(c->cfg, t[i].name) : PS_ENOTENSOR;
		if (ti < 0) {
			set_err(c, "unknown tensor '%s'", t[i].name ? t[i].name : "(null)");
			return PS_ENOTENSOR;
		}
		if (t[i].count != c->cfg->tensors[ti].count || !t[i].data) {
			set_err(c, "tensor '%s' has %" PRId64 " elements, the config says %" PRId64,
				t[i].name, t[i].count, c->cfg->tensors[ti].count);
			return PS_ESHAPE;
		}
		tidx[i] = ti;
	}
	return 0;
}

/* Slices per shard of the tensors tidx[0..n). */
static void count_slices(struct ps_client *c, const int *tidx, int n, uint32_t *per_shard)
{
	memset(per_shard, 0, sizeof(*per_shard) * (size_t)c->cfg->nshards);
	for (int i = 0; i < n; i++)
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++)
			per_shard[c->map.slices[s].shard]++;
}

/* Fills part p (shard k) with this shard's slices of t, in tensor then
 * slice order: raw slices point at the caller's data (no copy), encoded ones
 * at p->enc. refs/ptrs receive the slice refs; *off the payload length. */
static int encode_part(struct ps_client *c, struct part *p, int k, const struct ps_tensor *t,
		       const int *tidx, int n, uint64_t clock, Ps__SliceRef *refs,
		       Ps__SliceRef **ptrs, uint64_t *off)
{
	const struct ps_config *cfg = c->cfg;
	size_t cap = 0, used = 0;

	for (int i = 0; i < n; i++) {
		const struct ps_tensor_cfg *tc = &cfg->tensors[tidx[i]];
		const struct ps_codec_ops *co = ps_codec_get(tc->codec);
		struct ps_codec_params prm = { tc->ratio, cfg->seed };

		if (tc->codec == PS_CODEC_NONE)
			continue;
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++)
			if (c->map.slices[s].shard == k)
				cap += (co->max_bytes((size_t)c->map.slices[s].count, &prm) + 7) & ~(size_t)7;
	}
	if (cap && !(p->enc = malloc(cap)))
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		const struct ps_tensor_cfg *tc = &cfg->tensors[tidx[i]];
		const struct ps_codec_ops *co = ps_codec_get(tc->codec);
		struct ps_codec_params prm = { tc->ratio, cfg->seed };
		float *resid = NULL;

		if (tc->codec != PS_CODEC_NONE && co->lossy_ef && cfg->compress.error_feedback) {
			if (!c->resid[tidx[i]] &&
			    !(c->resid[tidx[i]] = calloc((size_t)tc->count, sizeof(float))))
				return -ENOMEM;
			resid = c->resid[tidx[i]];
		}
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++) {
			const struct ps_slice *sl = &c->map.slices[s];
			Ps__SliceRef *ref = &refs[p->niov];
			size_t raw = (size_t)sl->count * sizeof(float);
			if (sl->shard != k)
				continue;
			ps__slice_ref__init(ref);
			ref->slice = sl->id;
			ref->offset = *off;
			ref->codec = (uint32_t)tc->codec;
			if (tc->codec == PS_CODEC_NONE) {
				ref->length = raw;
				p->iov[p->niov].base = t[i].data + sl->offset;
			} else {
				size_t room = (co->max_bytes((size_t)sl->count, &prm) + 7) & ~(size_t)7;
				ssize_t e = co->encode(t[i].data + sl->offset,
						       resid ? resid + sl->offset : NULL, (size_t)sl->count,
						       &prm, clock * 1000003u + sl->id, p->enc + used, room);
				if (e < 0)
					return (int)e;
				ref->length = (uint64_t)e;
				p->iov[p->niov].base = p->enc + used;
				/* padded to 4 bytes so the next slice's offset stays aligned */
				memset(p->enc + used + e, 0, (size_t)(-e & 3));
				used += ((size_t)e + 7) & ~(size_t)7;
			}
			p->iov[p->niov].len = (ref->length + 3) & ~(uint64_t)3;
			ptrs[p->niov] = ref;
			*off += p->iov[p->niov].len;
			p->niov++;
			c->push_raw += raw;
		}
	}
	return 0;
}

/* The LZ4 stage over part p's whole payload (len bytes): on success the
 * part sends one packed piece, flagged PS_FRAME_F_LZ4, with the expanded
 * length in *raw_length; kept as it is when LZ4 would not shrink it. auto
 * tries only payloads of topk, sign and q8 slices of at least 1 KiB (their
 * indices and bit patterns compress; float32 and fp16 values rarely do). */
static int lz4_part(struct ps_client *c, struct part *p, uint64_t len, uint64_t *raw_length,
		    const Ps__SliceRef *const *refs)
{
	uint8_t *src, *dst, *tmp = NULL;
	size_t packed, bound;
	int try = c->cfg->compress.lz4 == PS_LZ4_ON ? len >= 64 : 0;

	if (c->cfg->compress.lz4 == PS_LZ4_AUTO && len >= 1024)
		for (int i = 0; i < p->niov && !try; i++)
			try = refs[i]->codec == PS_CODEC_TOPK || refs[i]->codec == PS_CODEC_SIGN ||
			      refs[i]->codec == PS_CODEC_Q8;
	if (!try || len > UINT32_MAX / 2)
		return 0;
	if (p->niov == 1) {
		src = (uint8_t *)p->iov[0].base;
	} else {
		size_t at = 0;
		if (!(src = tmp = malloc(len)))
			return -ENOMEM;
		for (int i = 0; i < p->niov; i++) {
			memcpy(tmp + at, p->iov[i].base, p->iov[i].len);
			at += p->iov[i].len;
		}
	}
	bound = ps_lz4_bound(len);
	dst = malloc(bound);
	if (!dst) {
		free(tmp);
		return -ENOMEM;
	}
	packed = ps_lz4_pack(src, len, dst, bound);
	free(tmp);
	if (!packed) {
		free(dst);
		return 0;
	}
	free(p->enc);
	p->enc = dst;
	p->iov[0].base = dst;
	p->iov[0].len = packed;
	p->niov = 1;
	p->frame_flags |= PS_FRAME_F_LZ4;
	*raw_length = len;
	return 0;
}

/* Ids are reserved before packing so the metadata is final when queued. */
static int64_t reserve_id(struct ps_client *c)
{
	int64_t id;

	pthread_mutex_lock(&c->mu);
	id = ++c->next_id;
	pthread_mutex_unlock(&c->mu);
	return id;
}

/* Builds a push request (every frame packed, nothing sent): *out, or a
 * negative code. */
static int build_push(struct ps_client *c, uint64_t clock, const struct ps_tensor *t, int n,
		      unsigned flags, struct req **out)
{
	int nsh = c->cfg->nshards, rc = -ENOMEM;
	int *tidx = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	uint32_t *cnt = malloc(sizeof(uint32_t) * (size_t)nsh);
	Ps__SliceRef *refs = NULL, **ptrs = NULL;
	struct req *r = req_new(c, REQ_PUSH);
	uint32_t total = 0, base = 0;

	if (!tidx || !cnt || !r)
		goto err_free;
	rc = resolve_tensors(c, t, n, tidx);
	if (rc)
		goto err_free;
	rc = -ENOMEM;
	count_slices(c, tidx, n, cnt);
	for (int k = 0; k < nsh; k++)
		total += cnt[k];
	refs = calloc(total ? total : 1, sizeof(*refs));
	ptrs = calloc(total ? total : 1, sizeof(*ptrs));
	if (!refs || !ptrs)
		goto err_free;
	r->id = reserve_id(c);
	r->clock = clock;
	r->end_clock = (flags & PS_PUSH_END_CLOCK) != 0;
	for (int k = 0; k < nsh; k++) {
		struct part *p = &r->parts[k];
		Ps__Push m = PS__PUSH__INIT;
		uint64_t off = 0;
		if (!cnt[k] && !(flags & PS_PUSH_END_CLOCK))
			continue;
		p->iov = malloc(sizeof(*p->iov) * (cnt[k] ? cnt[k] : 1));
		if (!p->iov)
			goto err_free;
		rc = encode_part(c, p, k, t, tidx, n, clock, refs + base, ptrs + base, &off);
		if (rc)
			goto err_free;
		rc = -ENOMEM;
		m.req_id = (uint64_t)r->id;
		m.seq = (uint64_t)r->id; /* increasing: the shard's duplicate check */
		m.clock = clock;
		m.end_clock = (flags & PS_PUSH_END_CLOCK) != 0;
		m.n_slices = (size_t)p->niov;
		m.slices = ptrs + base;
		base += (uint32_t)p->niov;
		if (off && c->cfg->compress.lz4 != PS_LZ4_OFF) {
			rc = lz4_part(c, p, off, &m.raw_length,
				      (const Ps__SliceRef *const *)m.slices);
			if (rc)
				goto err_free;
			rc = -ENOMEM;
		}
		if (pack_part(p, &m.base))
			goto err_free;
		for (int i = 0; i < p->niov; i++)
			c->push_wire += p->iov[i].len;
	}
	if (flags & PS_PUSH_END_CLOCK) {
		pthread_mutex_lock(&c->mu);
		if (clock + 1 > c->clock)
			c->clock = clock + 1;
		pthread_mutex_unlock(&c->mu);
	}
	free(refs);
	free(ptrs);
	free(tidx);
	free(cnt);
	*out = r;
	return 0;

err_free:
	free(refs);
	free(ptrs);
	free(tidx);
	free(cnt);
	if (r)
		req_free(c, r);
	return rc;
}

/* Builds a pull request (see build_push). The shard is told the worker
 * is at clock after_push + 1 when that is ahead of c->clock (the pull of
 * ps_client_pushpull is built before the push that ends after_push);
 * UINT64_MAX = c->clock as it is. */
static int build_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t, int n,
		      uint64_t after_push, struct req **out)
{
	int nsh = c->cfg->nshards, rc = -ENOMEM;
	uint32_t *cnt = malloc(sizeof(uint32_t) * (size_t)nsh);
	uint32_t *ids = NULL;
	struct req *r = req_new(c, REQ_PULL);
	uint64_t clock;

	if (!cnt || !r)
		goto err_free;
	r->tidx = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (!r->tidx)
		goto err_free;
	rc = resolve_tensors(c, t, n, r->tidx);
	if (rc)
		goto err_free;
	rc = -ENOMEM;
	r->t = t;
	r->n = n;
	for (int i = 0; i < n; i++)
		t[i].version = UINT64_MAX;
	count_slices(c, r->tidx, n, cnt);
	pthread_mutex_lock(&c->mu);
	clock = c->clock;
	pthread_mutex_unlock(&c->mu);
	if (after_push != UINT64_MAX && after_push + 1 > clock)
		clock = after_push + 1;
	r->id = reserve_id(c);
	for (int k = 0; k < nsh; k++) {
		Ps__Pull m = PS__PULL__INIT;
		uint32_t j = 0;
		if (!cnt[k])
			continue;
		free(ids);
		ids = malloc(sizeof(*ids) * cnt[k]);
		if (!ids)
			goto err_free;
		for (int i = 0; i < n; i++)
			for (uint32_t s = c->map.tensor_first[r->tidx[i]];
			     s < c->map.tensor_first[r->tidx[i] + 1]; s++)
				if (c->map.slices[s].shard == k)
					ids[j++] = s;
		m.req_id = (uint64_t)r->id;
		m.min_version = min_version;
		m.codec = (uint32_t)c->cfg->compress.pull;
		m.clock = clock;
		m.n_slices = j;
		m.slices = ids;
		if (pack_part(&r->parts[k], &m.base))
			goto err_free;
	}
	free(ids);
	free(cnt);
	*out = r;
	return 0;

err_free:
	free(ids);
	free(cnt);
	if (r)
		req_free(c, r);
	return rc;
}

/* Submits r, built with code rc: its id, or the negative code. */
static int64_t submit_built(struct ps_client *c, int rc, struct req *r)
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
	int rc = build_push(c, clock, t, n, flags, &r); /* before r is read */

	return submit_built(c, rc, r);
}

int64_t ps_client_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t, int n)
{
	struct req *r = NULL;
	int rc = build_pull(c, min_version, t, n, UINT64_MAX, &r);

	return submit_built(c, rc, r);
}

int ps_client_pushpull(struct ps_client *c, uint64_t clock, const struct ps_tensor *grad,
		       int ngrad, unsigned flags, uint64_t min_version, struct ps_tensor *out,
		       int nout, int64_t ids[2])
{
	struct req *r[2];
	/* The pull first: a push built (its clock counted as ended) must be
	 * sent, so nothing may fail after it. */
	int rc = build_pull(c, min_version, out, nout,
			    flags & PS_PUSH_END_CLOCK ? clock : UINT64_MAX, &r[1]);

	if (rc)
		return rc;
	rc = build_push(c, clock, grad, ngrad, flags, &r[0]);
	if (rc) {
		req_free(c, r[1]);
		return rc;
	}
	ids[0] = r[0]->id;
	ids[1] = r[1]->id;
	return submit(c, r, 2);
}

int ps_client_wait(struct ps_client *c, int64_t id)
{
	struct req **pp, *r;
	int status;

	pthread_mutex_lock(&c->mu);
	for (pp = &c->reqs; (r = *pp) && r->id != id; pp = &r->next)
		;
	if (!r) {
		set_err(c, "request %" PRId64 " is not pending on this client", id);
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
					sh->conn->t->ops->recv_now(sh->conn, take, c);
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
	pthread_mutex_unlock(&c->mu);
	req_free(c, r);
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

uint64_t ps_client_clock(struct ps_client *c)
{
	uint64_t v;

	pthread_mutex_lock(&c->mu);
	v = c->clock;
	pthread_mutex_unlock(&c->mu);
	return v;
}

int ps_client_stats(struct ps_client *c, int shard, struct ps_shard_stats *out)
{
	return ps_client_checkpoint(c, shard, 0, out);
}

int ps_client_checkpoint(struct ps_client *c, int shard, int write, struct ps_shard_stats *out)
{
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r;
	int64_t id;

	if (shard < 0 || shard >= c->cfg->nshards)
		return -EINVAL;
	r = req_new(c, REQ_STATS);
	if (!r)
		return -ENOMEM;
	r->stats = out;
	r->id = reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.checkpoint = write != 0;
	if (pack_part(&r->parts[shard], &m.base)) {
		req_free(c, r);
		return -ENOMEM;
	}
	id = submit_built(c, 0, r);
	return id < 0 ? (int)id : ps_client_wait(c, id);
}

/* ---- life cycle ---- */

int ps_client_init(struct ps_client **out, const struct ps_config *cfg, int rank, char *err,
		   size_t errlen)
{
	struct ps_transport_cbs cbs = { .on_connect = on_connect, .on_frame = on_frame,
					.on_close = on_close };
	struct ps_wire_limits hs = { .max_frame = PS_WIRE_HANDSHAKE_MAX,
				     .max_meta = PS_WIRE_HANDSHAKE_MAX };
	const struct ps_transport_ops *ops;
	struct ps_client *c;
	struct timespec until;
	int rc;

	*out = NULL;
	if (rank >= cfg->nworkers) {
		snprintf(err, errlen, "rank %d outside 0..%d (cluster.workers is %d)", rank,
			 cfg->nworkers - 1, cfg->nworkers);
		return -EINVAL;
	}
	ops = ps_transport_for(cfg, err, errlen, &rc);
	if (!ops)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->cfg = cfg;
	c->rank = rank;
	c->spin_s = cfg->limits.wait_spin_us / 1e6;
	ps_auth_random((uint8_t *)&c->incarnation, sizeof(c->incarnation));
	if (cfg->security.auth && (rc = ps_auth_load_secret(cfg, c->secret, err, errlen))) {
		free(c);
		return rc;
	}
	c->shards = calloc((size_t)cfg->nshards, sizeof(*c->shards));
	c->resid = calloc((size_t)(cfg->ntensors > 0 ? cfg->ntensors : 1), sizeof(*c->resid));
	if (!c->shards || !c->resid) {
		free(c->resid);
		free(c->shards);
		free(c);
		return -ENOMEM;
	}
	rc = ps_shardmap_init(&c->map, cfg);
	if (rc) {
		snprintf(err, errlen, "cannot build the shard map: %s", ps_strerror(rc));
		goto err_free_client;
	}
	pthread_mutex_init(&c->mu, NULL);
	c->deferred_tail = &c->deferred;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	uv_loop_init(&c->loop);
	uv_async_init(&c->loop, &c->wake, on_wake);
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
		rc = ops->connect(c->transport, cfg->shards[k].host, cfg->shards[k].port,
				  (void *)(intptr_t)k, &c->shards[k].conn);
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
	/* A worker needs every shard: it stops at the first failure. A
	 * monitor (rank < 0) waits for every answer and starts with whatever
	 * it reached; the others report their reason through
	 * ps_client_shard_error and fail their requests. */
	while ((rank < 0 || c->nfailed == 0) && c->nready + c->nfailed < cfg->nshards)
		if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT)
			break;
	rc = 0;
	if (rank < 0) {
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
					 "shard %d (%s:%d): no handshake within %d ms (limits.connect_timeout_ms)",
					 k, cfg->shards[k].host, cfg->shards[k].port,
					 cfg->limits.connect_timeout_ms);
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
	*out = c;
	return 0;

err_close_loop:
	uv_loop_close(&c->loop);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	ps_shardmap_free(&c->map);
err_free_client:
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
		req_free(c, r);
	}
	while (c->deferred) {
		struct deferred *d = c->deferred;
		c->deferred = d->next;
		ps_frame_release(d->f);
		free(d);
	}
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	ps_shardmap_free(&c->map);
	for (int i = 0; c->resid && i < c->cfg->ntensors; i++)
		free(c->resid[i]);
	free(c->resid);
	for (int k = 0; k < c->cfg->nshards; k++)
		free(c->shards[k].hello);
	sodium_memzero(c->secret, sizeof(c->secret));
	free(c->shards);
	free(c);
}

void ps_client_push_bytes(struct ps_client *c, uint64_t *raw, uint64_t *wire)
{
	*raw = c->push_raw;
	*wire = c->push_wire;
}
