/* ps_client_conn.c - the client's connection to each shard.
 *
 * One connection per shard, driven by the transport's callbacks on the I/O
 * thread: connect, then the handshake (Hello, the auth challenge when
 * security.auth is on, HelloReply), then the frames a ready connection
 * carries, matched to requests in ps_client_req.c. Heartbeats keep a quiet
 * connection alive and close one from which nothing came.
 *
 * A worker's shard whose connection is lost after it was ready is
 * reconnected with backoff for limits.reconnect_timeout_ms (a monitor's
 * is reported down at once); its requests stay waiting and
 * every part not answered is sent again on the new connection, oldest
 * first (a part remembers the connection generation it went out on).
 * Pushes are numbered (Push.seq = request id) and the client keeps its
 * incarnation across reconnects, so the shard applies a resent push at most
 * once (server/dedup.h): exactly once, since it is resent until answered.
 *
 * With cluster.replicas: 1 a shard has two addresses (cluster.servers[k],
 * cluster.backups[k]) and one of the two processes serves; the other
 * refuses a worker's Hello with retry set. A worker then dials the other
 * address, alternating after every failed attempt (from the first one
 * on), so it follows a failover; the pushes the old primary did not
 * acknowledge are resent to the new one, which applies each once (the
 * dedup windows are replicated, server/replica.h).
 *
 * While a worker reconnects, whoever holds a shard's port may answer, and
 * nothing it says before it proves the secret (with security.auth: false
 * nothing is ever proven) ends the attempt for good: a refusal, a wrong
 * proof, an ok without a challenge close that connection and the worker
 * dials again, its requests still waiting, for limits.reconnect_timeout_ms
 * (untrusted_failure). Only ps_client_init's first connection fails at
 * once on them, with the reason, as misconfiguration is its likely cause.
 * Text a shard sends is escaped before it reaches a log or an error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "ps_time.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_log.h"

void ps__client_on_connect(struct ps_conn *pc, int status)
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
	h.role = c->rank >= 0 ? PS__ROLE__ROLE_WORKER : c->rank == PS_RANK_READER ?
		 PS__ROLE__ROLE_READER : PS__ROLE__ROLE_STAT;
	h.rank = c->rank;
	h.shard_map_hash = c->map.hash;
	h.shard = k;
	h.incarnation = c->incarnation;
	h.done_clock = c->shards[k].done_clock;
	if (c->rank >= 0)
		h.settings = c->settings; /* config_agree.h */
	if (c->cfg->security.auth) {
		ps_auth_random(nonce, sizeof(nonce));
		h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		h.auth_mac = c->cfg->security.mac;
		h.auth_cipher = (uint32_t)(ps_auth_cipher(&c->cfg->security) + 1);
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

/* Whether on_close would try shard k again if its connection closed now:
 * a worker's shard that was ready once (with replicas, from the first
 * attempt on), reconnects allowed, the client not stopping. c->mu held. */
static int will_retry(const struct ps_client *c, const struct shard_conn *sh)
{
	return sh->state != SH_FAILED && !c->stopping && c->rank >= 0 &&
	       c->cfg->limits.reconnect_timeout_ms > 0 &&
	       ((sh->gen > 0 && c->started) || c->cfg->replicas);
}

/* Shard k's peer said, before it proved the secret, something that ends
 * the handshake (what: why, printf-style, peer text already escaped).
 * Reconnecting, it may be a stranger on a dead shard's port: the
 * connection closes and on_close dials again, the requests kept waiting;
 * the words are kept for the error if the reconnects time out. Otherwise
 * (ps_client_init's first connection) the handshake fails with them.
 * c->mu held. */
static void untrusted_failure(struct ps_client *c, int k, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void untrusted_failure(struct ps_client *c, int k, int status, const char *fmt, ...)
{
	struct shard_conn *sh = &c->shards[k];
	const struct ps_endpoint *ep = ps_config_replica_addr(c->cfg, k, sh->alt);
	char what[sizeof(sh->untrusted)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (!will_retry(c, sh)) {
		fail_handshake(c, k, status, "%s", what);
		return;
	}
	memcpy(sh->untrusted, what, sizeof(what));
	ps_warn("shard %d (%s:%d): %s; closing the connection and dialing again (the peer has "
		"not proven the secret: it may not be the shard)", k, ep->host, ep->port, what);
	sh->conn->t->ops->close(sh->conn, status);
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
		untrusted_failure(c, k, PS_EPROTO, "unexpected auth-challenge");
		return;
	}
	if (!c->cfg->security.auth) {
		untrusted_failure(c, k, PS_EAUTH, "the shard requires authentication and this "
				  "process has security.auth: false; the two configs must agree");
		return;
	}
	if (m->nonce.len != PS_AUTH_NONCE_LEN) {
		untrusted_failure(c, k, PS_EPROTO, "auth-challenge with a %zu-byte nonce",
				  m->nonce.len);
		return;
	}
	ps_auth_transcript(sh->hello, sh->hello_len, m->nonce.data, t);
	if (c->rank == PS_RANK_READER
	    ? !ps_auth_reader_proof_ok(c->secret, t, 1, m->proof.data, m->proof.len)
	    : !ps_auth_proof_ok(c->secret, t, 1, m->proof.data, m->proof.len)) {
		untrusted_failure(c, k, PS_EAUTH, c->rank == PS_RANK_READER ?
				  "authentication failed: the shard's proof does not match this "
				  "reader's key (the reader key files differ)" :
				  "authentication failed: the shard's proof does "
				  "not match this process's secret (the secret files differ)");
		return;
	}
	sh->authed = 1;
	if (c->rank == PS_RANK_READER)
		ps_auth_reader_proof(c->secret, t, 0, proof);
	else
		ps_auth_proof(c->secret, t, 0, proof);
	a.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	if (ps_msg_send(sh->conn, PS_MSG_AUTH, &a.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL)) {
		fail_handshake(c, k, PS_ECLOSED, "connection lost during authentication");
		return;
	}
	if (c->cfg->security.mac) {
		if (c->rank == PS_RANK_READER)
			ps_auth_reader_session_keys(c->secret, t, 0, &keys);
		else
			ps_auth_session_keys(c->secret, t, 0, &keys);
		keys.cipher = ps_auth_cipher(&c->cfg->security);
		sh->conn->t->ops->set_keys(sh->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	}
	sodium_memzero(t, sizeof(t));
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
		if (ps__client_send_part(c, v[i], k))
			break; /* the connection broke again: on_close takes over */
	free(v);
	return n;
}

static void on_hello_reply(struct ps_client *c, int k, const Ps__HelloReply *m)
{
	struct shard_conn *sh = &c->shards[k];
	char said[200];

	if (sh->state != SH_HELLO)
		return;
	/* the shard's words, whoever it is: no terminal escapes into the log */
	ps_log_escape(said, sizeof(said), m->error, m->error ? strlen(m->error) : 0);
	if (m->ok && c->cfg->security.auth && !sh->authed) {
		untrusted_failure(c, k, PS_EAUTH, "the shard accepted this process without "
				  "authentication (security.auth: false there, true here); refusing "
				  "it, the two configs must agree");
		return;
	}
	if (!m->ok && m->retry && c->cfg->replicas && c->rank >= 0) {
		/* the backup, or a process joining: try the shard's other address */
		const struct ps_endpoint *ep = ps_config_replica_addr(c->cfg, k, sh->alt);
		snprintf(sh->why, sizeof(sh->why), "shard %d: %s:%d is not serving (%.80s)", k,
			 ep->host, ep->port, said);
		sh->conn->t->ops->close(sh->conn, PS_EREFUSED);
		return;
	}
	if (!m->ok && c->follow_path && c->started && m->shard_map_hash &&
	    m->shard_map_hash != c->map.hash) {
		/* following re-shards: a shard of another map answers at this
		 * address; dial again until the pointer file names its config
		 * (ps_client_follow.c) or the reconnects time out */
		snprintf(sh->untrusted, sizeof(sh->untrusted), "%s", said);
		sh->conn->t->ops->close(sh->conn, PS_EMAP);
		return;
	}
	if (!m->ok && !sh->authed) {
		untrusted_failure(c, k, PS_EREFUSED, "refused the handshake%s: %s",
				  c->cfg->security.auth ? " before proving the secret" : "", said);
		return;
	}
	if (!m->ok) {
		char own[120];

		/* a setting that differs: the shard names its value, this
		 * process adds its own (config_agree.h) */
		ps_config_agreement_own(c->settings_plain, said, "worker", own, sizeof(own));
		sh->state = SH_FAILED;
		sh->status = PS_EREFUSED;
		snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d) refused the handshake: %s%s", k,
			 c->cfg->shards[k].host, c->cfg->shards[k].port, said, own);
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
		sh->hello_clock = m->clock;
		sh->fresh = m->fresh;
		sh->from_ckpt = m->from_checkpoint;
		c->nready++;
		if (sh->lost_at > 0) {
			/* after a re-shard: a push cut again for a clock this new
			 * shard's checkpoint holds (its acks were lost with the old
			 * shards) is complete here */
			for (struct req *r = c->reqs; r; r = r->next)
				if (r->recut && (r->kind == REQ_PUSH || r->kind == REQ_PUSH_ROWS) &&
				    r->parts[k].waiting && r->clock < m->clock)
					ps__client_part_done(c, r, k, 0, NULL);
			int n = resend(c, k);
			const struct ps_endpoint *ep = ps_config_replica_addr(c->cfg, k, sh->alt);
			if (c->started)
				ps_warn("shard %d (%s:%d): reconnected after %.1f s%s; %d request(s) "
					"sent again", k, ep->host, ep->port, ps_now_s() - sh->lost_at,
					!sh->boot_id || m->boot_id == sh->boot_id ? ""
					: c->cfg->replicas ? " to another process of the shard"
					: " to a restarted shard", n);
			sh->lost_at = 0;
			sh->why[0] = 0;
			sh->status = 0;
		}
		sh->untrusted[0] = 0;
		if (c->cfg->replicas && sh->epoch && m->epoch != sh->epoch && c->started)
			ps_info("shard %d: served by %s:%d now (epoch %llu)", k,
				ps_config_replica_addr(c->cfg, k, sh->alt)->host,
				ps_config_replica_addr(c->cfg, k, sh->alt)->port,
				(unsigned long long)m->epoch);
		sh->epoch = m->epoch;
		sh->boot_id = m->boot_id;
	}
	pthread_cond_broadcast(&c->cv);
}

/* Replies: the frames only a ready connection may carry. */
static int is_reply(unsigned type)
{
	return type == PS_MSG_HEARTBEAT || type == PS_MSG_PUSH_ACK || type == PS_MSG_PULL_REPLY ||
	       type == PS_MSG_PULL_ROWS_REPLY ||
	       type == PS_MSG_STATS || type == PS_MSG_ERROR;
}

/* The frames a ready connection carries: handled with c->mu held, on the
 * I/O thread (on_frame) or on a waiting thread that read them itself
 * (ps__client_take). 0 when type is not one of them, or when the
 * connection is not ready: before the handshake completed (and, with
 * security.auth, before the shard proved the secret and the frames carry
 * MACs) a reply could come from whoever holds the shard's port after a
 * crash, and acting on it would hand a pull its weights or acknowledge a
 * push the real shard never saw. on_frame closes such a connection. */
static int reply_frame(struct ps_client *c, int k, const struct ps_frame *f, ProtobufCMessage *m)
{
	if (c->shards[k].state != SH_READY)
		return 0;
	c->shards[k].last_rx = ps_now_s(); /* handshake frames count too: on_frame */
	switch (f->hdr.type) {
	case PS_MSG_HEARTBEAT: {
		/* last_rx, and what the shard holds a pull for (named when the
		 * pull times out) */
		const char *held = ((Ps__Heartbeat *)m)->held;
		snprintf(c->shards[k].held, sizeof(c->shards[k].held), "%s", held ? held : "");
		c->shards[k].held_at = c->shards[k].last_rx;
		return 1;
	}
	case PS_MSG_PUSH_ACK: {
		struct req *r = ps__client_find_req(c, (int64_t)((Ps__PushAck *)m)->req_id);
		if (r && r->kind == REQ_PUSH && r->end_clock && r->parts[k].waiting &&
		    r->clock + 1 > c->shards[k].done_clock)
			c->shards[k].done_clock = r->clock + 1;
		c->shards[k].stop_retry_gap = 0; /* it takes pushes */
		if (r)
			ps__client_part_done(c, r, k, 0, NULL);
		return 1;
	}
	case PS_MSG_PULL_REPLY:
		ps__client_on_pull_reply(c, k, (Ps__PullReply *)m, f);
		return 1;
	case PS_MSG_PULL_ROWS_REPLY:
		ps__client_on_rows_reply(c, k, (Ps__PullRowsReply *)m, f);
		return 1;
	case PS_MSG_STATS:
		ps__client_on_stats_reply(c, k, (Ps__Stats *)m);
		return 1;
	case PS_MSG_ERROR: {
		Ps__Error *e = (Ps__Error *)m;
		struct req *r = ps__client_find_req(c, (int64_t)e->req_id);
		char text[600];
		if (r && e->code == PS_ERESHARD && (r->kind == REQ_PUSH || r->kind == REQ_PUSH_ROWS) &&
		    r->parts[k].waiting) {
			/* the shard stops for a re-shard (server/stop.c): the part
			 * stays unacknowledged, sent again on the next connection
			 * (resend) or, if the shard takes pushes again (a later
			 * stop clock: ps-stat raises a stop that a shard had to
			 * refuse), by the tick in a while: 0.1 s at first, so a
			 * raised stop costs the pushes it refused little, doubled
			 * at each refusal up to 1 s, so a long stop does not have
			 * a large push sent again and again */
			struct shard_conn *sh = &c->shards[k];
			r->parts[k].gen = 0;
			if (!sh->stop_retry_at) {
				sh->stop_retry_gap = sh->stop_retry_gap > 0
							     ? (sh->stop_retry_gap * 2 < 1.0
									? sh->stop_retry_gap * 2
									: 1.0)
							     : 0.1;
				sh->stop_retry_at = ps_now_s() + sh->stop_retry_gap;
			}
			return 1;
		}
		snprintf(text, sizeof(text), "shard %d: %s", k, e->message);
		if (r)
			ps__client_part_done(c, r, k, e->code < 0 ? e->code : PS_EPROTO, text);
		return 1;
	}
	default:
		return 0;
	}
}

void ps__client_on_frame(struct ps_conn *pc, struct ps_frame *f)
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
	c->shards[k].last_rx = ps_now_s();
	if (!reply_frame(c, k, f, m)) {
		switch (is_reply(f->hdr.type) ? 0 : f->hdr.type) {
		case 0:
			ps_warn("closing connection to shard %d (%s:%d): it sent a %s frame before "
				"the handshake%s completed", k, c->cfg->shards[k].host,
				c->cfg->shards[k].port, ps_wire_type_name(f->hdr.type),
				c->cfg->security.auth ? " and authentication" : "");
			pc->t->ops->close(pc, PS_EPROTO);
			break;
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
void ps__client_take(struct ps_conn *pc, struct ps_frame *f, void *arg)
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

void ps__client_on_close(struct ps_conn *pc, int status)
{
	struct ps_client *c = pc->t->data;
	int k = (int)(intptr_t)pc->data;
	struct shard_conn *sh = &c->shards[k];

	pthread_mutex_lock(&c->mu);
	if (sh->state == SH_READY)
		c->nready--;
	if (will_retry(c, sh)) {
		/* a worker's shard that was ready once: try again, keeping its
		 * requests waiting (a monitor reports the shard down instead);
		 * with replicas, from the first attempt on and at the other
		 * address */
		double now = ps_now_s();
		double cap = c->cfg->replicas ? 0.4 : 2.0;
		if (c->cfg->replicas)
			sh->alt ^= 1;
		if (sh->lost_at == 0) {
			sh->lost_at = now;
			sh->backoff = 0.1;
			if (c->started)
				ps_warn("shard %d (%s:%d): connection lost (%s); reconnecting for up to %d ms",
				k, c->cfg->shards[k].host, c->cfg->shards[k].port,
				sh->why[0] ? sh->why : ps_strerror(status ? status : PS_ECLOSED),
				c->cfg->limits.reconnect_timeout_ms);
		}
		if (now - sh->lost_at < c->cfg->limits.reconnect_timeout_ms / 1000.0) {
			sh->state = SH_RETRY;
			sh->retry_at = now + sh->backoff;
			sh->backoff = sh->backoff * 2 < cap ? sh->backoff * 2 : cap;
			sh->conn = NULL;
			sh->authed = 0;
			sh->why[0] = 0;
			pthread_mutex_unlock(&c->mu);
			return;
		}
		sh->status = PS_ETIMEDOUT;
		sh->lost_at = 0; /* given up: new requests fail at once */
		int n = snprintf(sh->why, sizeof(sh->why), "shard %d (%s:%d): unreachable for %d ms "
				 "(limits.reconnect_timeout_ms)", k, c->cfg->shards[k].host,
				 c->cfg->shards[k].port, c->cfg->limits.reconnect_timeout_ms);
		if (c->follow_refused[0] && n > 0 && (size_t)n < sizeof(sh->why))
			/* a re-shard's config this client would not take
			 * (ps_client_follow.c; this thread wrote it): the reason,
			 * before a refusal of the old map would say less */
			snprintf(sh->why + n, sizeof(sh->why) - (size_t)n, "; a re-shard was not "
				 "followed: %.400s", c->follow_refused);
		else if (sh->untrusted[0] && n > 0 && (size_t)n < sizeof(sh->why))
			/* what kept it out, if a peer without the secret answered */
			snprintf(sh->why + n, sizeof(sh->why) - (size_t)n, "; the last answer, from "
				 "a peer that had not proven the secret: %s", sh->untrusted);
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
	ps__client_fail_shard_reqs(c, k, sh->status, sh->why);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

/* Heartbeats: every third of limits.idle_timeout_ms each ready shard gets
 * one (it answers), so the shard does not take this quiet client for dead,
 * and a shard from which nothing came for the whole timeout (hung, or the
 * network lost) is closed, failing its requests with that reason. Called
 * with c->mu held. */
void ps__client_heartbeats(struct ps_client *c, double now)
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

/* Starts the reconnects that are due (SH_RETRY past retry_at; on_close
 * set the backoff), and gives up an attempt that hangs. Called by the
 * I/O thread's tick with c->mu held. */
void ps__client_reconnect_due(struct ps_client *c, double now)
{
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
		if (sh->stop_retry_at && now >= sh->stop_retry_at) {
			sh->stop_retry_at = 0;
			if (sh->state == SH_READY && sh->conn)
				resend(c, k); /* pushes refused by a stopping shard */
		}
		if (sh->state != SH_RETRY || now < sh->retry_at)
			continue;
		sh->state = SH_CONNECTING;
		sh->attempt_at = now;
		const struct ps_endpoint *ep = ps_config_replica_addr(c->cfg, k, sh->alt);
		rc = c->transport->ops->connect(c->transport, ep->host, ep->port,
						(void *)(intptr_t)k, &sh->conn);
		if (rc) {
			sh->conn = NULL;
			sh->state = SH_RETRY;
			sh->retry_at = now + sh->backoff;
		}
	}
}
