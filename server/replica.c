/* replica.c - who of a shard's two processes serves (replica.h).
 *
 * A process that has no role (joining), or a backup whose connection to
 * its primary broke, dials its partner's address and says in its Hello
 * what it is (state, epoch, last batch). The partner answers:
 *  - a primary takes the dialer as its new backup (the old one's
 *    connection, if still open, is closed) and sends its state;
 *  - a backup takes over and does the same: the dialer holds the
 *    primary's address, so the process it was following is gone or has
 *    stepped down, and acknowledges nothing more;
 *  - a joining process compares: the one with the newer state (epoch,
 *    then batch number), else replica 0, becomes the primary; the other
 *    is refused and dials again.
 * A refused dialer that finds it is the one to serve (it is a backup and
 * the partner is joining, or it wins the comparison) takes over itself.
 *
 * Silence: the primary sends a batch or an empty one every quarter of
 * replication.timeout_ms and the backup answers each; a primary with no
 * answer for the timeout stops serving and joins again; a backup with
 * nothing from its primary for twice the timeout takes over. A primary
 * whose backup's connection ends (the peer closed it: the process died or
 * exited) goes on alone. docs/reliability.md says why this is safe.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "ps_time.h"
#include "auth.h"
#include "config_agree.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

/* The dialing connection: with security.auth the partner's HelloReply
 * counts only in OUT_AUTH, after the partner proved the replication key
 * in this connection's challenge and the frames became MACed; anything
 * else before it closes the connection. */
enum { OUT_NONE, OUT_CONNECTING, OUT_HELLO, OUT_AUTH, OUT_READY };

const char *ps__repl_state_name(int state)
{
	switch (state) {
	case PS_REPL_JOINING: return "joining";
	case PS_REPL_BACKUP: return "backup";
	case PS_REPL_PRIMARY: return "primary";
	default: return "off";
	}
}

int ps__repl_serving(const struct ps_server *s)
{
	return !s->repl || s->repl->state == PS_REPL_PRIMARY;
}

static double timeout_s(const struct ps_server *s)
{
	return s->cfg->repl_timeout_ms / 1000.0;
}

static void flush_cb(uv_check_t *h)
{
	ps__repl_flush(h->data);
}

/* ---- role changes ---- */

/* This process serves from now on. peer_epoch: the partner's, when known. */
static void take_over(struct ps_server *s, uint64_t peer_epoch, const char *why)
{
	struct ps_repl *r = s->repl;
	double now = ps_now_s();
	int was_backup = r->state == PS_REPL_BACKUP;

	ps__repl_adopt_committed(s);
	ps__repl_staged_free(s, NULL, 0);
	r->epoch = (r->epoch > peer_epoch ? r->epoch : peer_epoch) + 1;
	r->state = PS_REPL_PRIMARY;
	r->acked = r->lsn;
	r->alone_since = now;
	r->caught_up = 0;
	if (was_backup)
		r->failovers++;
	if (r->out)
		r->out->t->ops->close(r->out, 0);
	/* every member must connect again; one that does not is dropped
	 * after limits.drop_timeout_ms like any worker that went away (the
	 * ranks not members, or gone before the membership says, are not
	 * waited for: members.c) */
	ps__members_takeover(s, now);
	for (int k = 0; k < s->cfg->nworkers; k++)
		if (!s->connected[k])
			s->gone_since[k] = now;
	ps_warn("replication: now the primary of shard %d (epoch %" PRIu64 ", batch %" PRIu64
		"): %s", s->shard, r->epoch, r->lsn, why);
}

/* Stops serving: closes the workers' connections (they go to the
 * partner), forgets what was not committed, and dials the partner. */
static void step_down(struct ps_server *s, const char *why)
{
	struct ps_repl *r = s->repl;

	ps_warn("replication: shard %d stops serving (epoch %" PRIu64 "): %s", s->shard, r->epoch,
		why);
	ps__repl_adopt_committed(s);
	ps__repl_drop_pending(s);
	ps_store_drop_pending(&s->store);
	ps__rows_drop_pending(s);
	r->state = PS_REPL_JOINING;
	if (r->link) {
		struct ps_srv_conn *l = r->link;
		r->link = NULL;
		l->conn->t->ops->close(l->conn, 0);
	}
	for (struct ps_srv_conn *sc = s->conns; sc; sc = sc->next)
		if (sc->rank >= 0 && sc->state == CONN_READY)
			sc->conn->t->ops->close(sc->conn, PS_EREFUSED);
	r->next_dial = ps_now_s();
}

/* Of two processes without a role, whether this one (replica me, at
 * my_epoch and batch my_lsn) serves. */
static int wins_of(int me, uint64_t my_epoch, uint64_t my_lsn, uint64_t epoch, uint64_t lsn)
{
	if (my_epoch != epoch)
		return my_epoch > epoch;
	if (my_lsn != lsn)
		return my_lsn > lsn;
	return me == 0;
}

int ps__repl_partner_verdict(int state, int me, uint64_t epoch, uint64_t lsn, int peer_state,
			     uint64_t peer_epoch, uint64_t peer_lsn)
{
	if (state == PS_REPL_BACKUP && peer_state != PS_REPL_PRIMARY)
		return PS_REPL_V_TAKE_OVER;
	if (state == PS_REPL_JOINING && peer_state == PS_REPL_JOINING &&
	    wins_of(me, epoch, lsn, peer_epoch, peer_lsn))
		return PS_REPL_V_TAKE_OVER;
	if (state == PS_REPL_PRIMARY && peer_state == PS_REPL_PRIMARY && peer_epoch > epoch)
		return PS_REPL_V_STEP_DOWN;
	return state == PS_REPL_PRIMARY ? PS_REPL_V_ACCEPT : PS_REPL_V_REFUSE;
}

int ps__repl_reply_verdict(int state, int me, uint64_t epoch, uint64_t lsn, int ok,
			   int peer_state, uint64_t peer_epoch, uint64_t peer_lsn)
{
	if (ok)
		return peer_state == PS_REPL_PRIMARY && state != PS_REPL_PRIMARY
		       ? PS_REPL_V_ACCEPT : PS_REPL_V_REFUSE;
	if (state == PS_REPL_BACKUP && peer_state == PS_REPL_JOINING)
		return PS_REPL_V_TAKE_OVER;
	if (state == PS_REPL_JOINING && peer_state == PS_REPL_JOINING &&
	    wins_of(me, epoch, lsn, peer_epoch, peer_lsn))
		return PS_REPL_V_TAKE_OVER;
	return PS_REPL_V_REFUSE;
}

/* Why wins_of() chose this process, for the log. */
static void why_wins(const struct ps_repl *r, uint64_t epoch, uint64_t lsn, char *buf, size_t len)
{
	if (r->epoch == epoch && r->lsn == lsn)
		snprintf(buf, len, "neither process has a role and both hold the same state (epoch %"
			 PRIu64 ", batch %" PRIu64 "): replica 0 serves", epoch, lsn);
	else
		snprintf(buf, len, "neither process has a role and this one holds the newer state "
			 "(epoch %" PRIu64 ", batch %" PRIu64 " against the partner's epoch %" PRIu64
			 ", batch %" PRIu64 ")", r->epoch, r->lsn, epoch, lsn);
}

/* ---- the primary's side: a partner dialed in ---- */

static void reply(struct ps_srv_conn *sc, int ok)
{
	struct ps_server *s = sc->srv;
	Ps__HelloReply m = PS__HELLO_REPLY__INIT;

	m.ok = ok;
	m.retry = !ok;
	m.error = ok ? "" : "not serving";
	m.protocol_version = PS_PROTOCOL_VERSION;
	m.shard = s->shard;
	m.shard_map_hash = s->map.hash;
	m.boot_id = s->boot_id;
	m.repl_state = (uint32_t)s->repl->state;
	m.epoch = s->repl->epoch;
	m.lsn = s->repl->lsn;
	ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &m.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
}

void ps__repl_on_partner(struct ps_server *s, struct ps_srv_conn *sc)
{
	struct ps_repl *r = s->repl;
	char why[200];
	int v = ps__repl_partner_verdict(r->state, r->me, r->epoch, r->lsn, sc->peer_state,
					 sc->peer_epoch, sc->peer_lsn);

	if (v == PS_REPL_V_TAKE_OVER && r->state == PS_REPL_BACKUP) {
		snprintf(why, sizeof(why), "the process at the primary's address %s has restarted "
			 "or stepped down (it says it is %s)", sc->conn->peer,
			 ps__repl_state_name(sc->peer_state));
		take_over(s, sc->peer_epoch, why);
	} else if (v == PS_REPL_V_TAKE_OVER) {
		why_wins(r, sc->peer_epoch, sc->peer_lsn, why, sizeof(why));
		take_over(s, sc->peer_epoch, why);
	} else if (v == PS_REPL_V_STEP_DOWN) {
		step_down(s, "the partner is the primary of a later epoch");
	}
	if (r->state != PS_REPL_PRIMARY) {
		reply(sc, 0);
		sc->state = CONN_REFUSED;
		sc->conn->t->ops->close(sc->conn, PS_EREFUSED);
		return;
	}
	if (r->link) {
		struct ps_srv_conn *old = r->link;
		ps_info("replication: %s replaces the backup connection from %s", sc->conn->peer,
			old->conn->peer);
		r->link = NULL;
		old->conn->t->ops->close(old->conn, 0);
	}
	reply(sc, 1);
	sc->is_link = 1;
	r->link = sc;
	r->caught_up = 0;
	r->link_rx = ps_now_s();
	if (ps__repl_send_snapshot(s, sc)) {
		r->link = NULL;
		sc->conn->t->ops->close(sc->conn, -ENOMEM);
	}
}

void ps__repl_on_link_frame(struct ps_server *s, struct ps_srv_conn *sc, unsigned type,
			    ProtobufCMessage *m)
{
	struct ps_repl *r = s->repl;
	const Ps__ReplAck *a = (const Ps__ReplAck *)m;

	if (sc != r->link || type != PS_MSG_REPL_ACK) {
		if (type != PS_MSG_HEARTBEAT)
			sc->conn->t->ops->close(sc->conn, PS_EPROTO);
		return;
	}
	r->link_rx = ps_now_s();
	if (a->lsn > r->lsn) {
		ps_warn("replication: the backup confirms batch %" PRIu64 ", past the last sent (%"
			PRIu64 ")", a->lsn, r->lsn);
		sc->conn->t->ops->close(sc->conn, PS_EPROTO);
		return;
	}
	if (a->lsn > r->acked)
		r->acked = a->lsn;
	if (!r->caught_up && r->acked >= r->snap_lsn) {
		r->caught_up = 1;
		r->alone_since = 0;
		ps_info("replication: backup %s has the state (batch %" PRIu64 "); pushes are "
			"acknowledged once it has them", sc->conn->peer, r->acked);
	}
	ps__repl_release(s);
}

void ps__repl_link_closed(struct ps_server *s, struct ps_srv_conn *sc, int status)
{
	struct ps_repl *r = s->repl;

	if (sc != r->link)
		return; /* replaced, or closed by step_down */
	r->link = NULL;
	r->caught_up = 0;
	if (r->state != PS_REPL_PRIMARY || s->stopping)
		return;
	if (status == PS_ECLOSED || status == -ECONNRESET || status == -EPIPE) {
		/* the peer closed it: the backup process is gone (a live backup
		 * closes its connection only when it takes over, which it does
		 * only after the silence that made this primary step down first) */
		r->alone_since = ps_now_s();
		ps_warn("replication: backup %s gone (%s): shard %d goes on alone, without a copy, "
			"until a backup joins", sc->conn->peer, ps_strerror(status), s->shard);
		ps__repl_release(s);
	} else {
		step_down(s, "the connection to the backup failed");
	}
}

/* ---- the dialing side ---- */

static void out_close(struct ps_repl *r, int status)
{
	if (r->out)
		r->out->t->ops->close(r->out, status);
}

static void send_ack(struct ps_repl *r)
{
	Ps__ReplAck a = PS__REPL_ACK__INIT;

	a.lsn = r->lsn;
	a.epoch = r->epoch;
	if (r->out && ps_msg_send(r->out, PS_MSG_REPL_ACK, &a.base, NULL, 0, PS_SEND_VOLATILE,
				  NULL, NULL))
		out_close(r, PS_ECLOSED);
}

static void on_connect(struct ps_conn *c, int status)
{
	struct ps_repl *r = c->t->data;
	struct ps_server *s = r->srv;
	Ps__Hello h = PS__HELLO__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN];
	char plain[PS_AGREE_MAX], wire[PS_AGREE_MAX];

	if (status < 0 || c != r->out)
		return; /* on_close follows */
	/* the settings both processes apply pushes and make rows with: a
	 * partner that would apply them otherwise is refused */
	ps_config_agreement_partner(s->cfg, plain, sizeof(plain));
	ps_config_agreement_wire(plain, s->cfg->security.auth ? s->secret : NULL, wire,
				 sizeof(wire));
	h.settings = wire;
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = PS__ROLE__ROLE_REPLICA;
	h.rank = -1;
	h.shard_map_hash = s->map.hash;
	h.shard = s->shard;
	h.incarnation = s->boot_id;
	h.replica = r->me;
	h.repl_state = (uint32_t)r->state;
	h.epoch = r->epoch;
	h.lsn = r->lsn;
	if (s->cfg->security.auth) {
		ps_auth_random(nonce, sizeof(nonce));
		h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		h.auth_mac = s->cfg->security.mac;
		h.auth_cipher = (uint32_t)(ps_auth_cipher(&s->cfg->security) + 1);
	}
	free(r->hello);
	r->hello_len = protobuf_c_message_get_packed_size(&h.base);
	r->hello = malloc(r->hello_len ? r->hello_len : 1);
	if (!r->hello) {
		out_close(r, -ENOMEM);
		return;
	}
	protobuf_c_message_pack(&h.base, r->hello);
	r->out_state = OUT_HELLO;
	c->t->ops->send(c, PS_MSG_HELLO, r->hello, (uint32_t)r->hello_len, NULL, 0,
			PS_SEND_VOLATILE, NULL, NULL);
}

static int on_challenge(struct ps_server *s, struct ps_conn *c, const Ps__AuthChallenge *m)
{
	struct ps_repl *r = s->repl;
	Ps__Auth a = PS__AUTH__INIT;
	uint8_t t[32], proof[PS_AUTH_PROOF_LEN];
	struct ps_frame_keys keys;

	if (!s->cfg->security.auth || m->nonce.len != PS_AUTH_NONCE_LEN || !r->hello)
		return PS_EPROTO;
	ps_auth_transcript(r->hello, r->hello_len, m->nonce.data, t);
	if (!ps_auth_repl_proof_ok(s->repl_key, t, 1, m->proof.data, m->proof.len)) {
		ps_warn("replication: the partner at %s does not hold the replication key "
			"(security.repl_key_file): nothing it sends is believed", c->peer);
		sodium_memzero(t, sizeof(t));
		return PS_EAUTH;
	}
	ps_auth_repl_proof(s->repl_key, t, 0, proof);
	a.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	if (ps_msg_send(c, PS_MSG_AUTH, &a.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL)) {
		sodium_memzero(t, sizeof(t));
		return PS_ECLOSED;
	}
	/* MACed even without security.mac (conn.c does the same on its end):
	 * every frame from here on must carry a valid tag */
	ps_auth_repl_session_keys(s->repl_key, t, 0, &keys);
	keys.cipher = ps_auth_cipher(&s->cfg->security);
	c->t->ops->set_keys(c, &keys);
	sodium_memzero(&keys, sizeof(keys));
	sodium_memzero(t, sizeof(t));
	r->out_state = OUT_AUTH;
	return 0;
}

/* A HelloReply before the partner proved the key (security.auth): nothing
 * of it is believed. Its text, printable characters only, goes to the log,
 * since an honest partner refuses a Hello whose settings disagree with its
 * own this way. */
static int early_reply(struct ps_conn *c, const Ps__HelloReply *m)
{
	char text[160];
	size_t n = 0;

	for (const char *p = m->error ? m->error : ""; *p && n + 1 < sizeof(text); p++)
		text[n++] = *p >= 0x20 && *p < 0x7f ? *p : '?';
	text[n] = 0;
	ps_warn("replication: %s answered before proving the replication key (%s%s%s); closing: "
		"a partner must prove security.repl_key_file before anything it says counts",
		c->peer, m->ok ? "ok" : "refused", n ? ": " : "", text);
	return PS_EAUTH;
}

/* The partner's answer to this process's Hello. */
static int on_reply(struct ps_server *s, struct ps_conn *c, const Ps__HelloReply *m)
{
	struct ps_repl *r = s->repl;
	char why[200];

	if (m->epoch >= PS_MAX_CLOCK || m->lsn >= PS_MAX_CLOCK) {
		ps_warn("replication: the partner at %s says epoch %" PRIu64 ", batch %" PRIu64
			": out of range (at most 2^53 - 1)", c->peer, m->epoch, m->lsn);
		return PS_EPROTO;
	}
	int v = ps__repl_reply_verdict(r->state, r->me, r->epoch, r->lsn, m->ok,
				       (int)m->repl_state, m->epoch, m->lsn);

	if (m->ok && v != PS_REPL_V_ACCEPT)
		return PS_EPROTO; /* an ok from no primary, or to a primary (which does not dial) */
	if (!m->ok && m->error && strcmp(m->error, "not serving")) {
		/* refused by the handshake (settings that differ, another map...):
		 * said once, however often it is dialed again */
		char plain[PS_AGREE_MAX], own[120], text[sizeof(r->refused)];

		ps_log_escape(text, sizeof(text), m->error, strlen(m->error));
		if (strcmp(text, r->refused)) {
			ps_config_agreement_partner(s->cfg, plain, sizeof(plain));
			own[0] = 0;
			if (s->cfg->security.auth) /* digests: the partner named only its own */
				ps_config_agreement_own(plain, text, "process", own, sizeof(own));
			ps_error("replication: the partner at %s refused this process: %s%s (said "
				 "once; dialing it again)", c->peer, text, own);
			snprintf(r->refused, sizeof(r->refused), "%s", text);
		}
	}
	if (v == PS_REPL_V_ACCEPT) {
		r->refused[0] = 0;
		struct ps_wire_limits lim = {
			.max_frame = s->cfg->limits.max_frame_bytes,
			.max_meta = s->cfg->limits.max_meta_bytes,
			.max_queue = s->cfg->limits.max_write_queue,
		};
		c->t->ops->set_limits(c, &lim);
		r->out_state = OUT_READY;
		r->snap_frames = 0;
		r->snap_started = ps_now_s();
		r->link_rx = r->snap_started;
		ps_info("replication: joining primary %s (epoch %" PRIu64 ") as its backup; "
			"receiving its state", c->peer, m->epoch);
		return 0;
	}
	if (v == PS_REPL_V_TAKE_OVER && r->state == PS_REPL_BACKUP) {
		snprintf(why, sizeof(why), "the process at the primary's address %s has restarted "
			 "or stepped down (it is joining)", c->peer);
		take_over(s, m->epoch, why);
	} else if (v == PS_REPL_V_TAKE_OVER) {
		why_wins(r, m->epoch, m->lsn, why, sizeof(why));
		take_over(s, m->epoch, why);
	}
	return PS_EREFUSED;
}

static void on_frame(struct ps_conn *c, struct ps_frame *f)
{
	struct ps_repl *r = c->t->data;
	struct ps_server *s = r->srv;
	ProtobufCMessage *m;
	char why[200];
	int rc = PS_EPROTO, done = 0;

	m = ps_msg_unpack(f, why, sizeof(why));
	if (!m || c != r->out) {
		if (m)
			protobuf_c_message_free_unpacked(m, NULL);
		ps_frame_release(f);
		c->t->ops->close(c, PS_EPROTO);
		return;
	}
	r->link_rx = ps_now_s();
	switch (f->hdr.type) {
	case PS_MSG_AUTH_CHALLENGE:
		rc = r->out_state == OUT_HELLO ? on_challenge(s, c, (Ps__AuthChallenge *)m) : PS_EPROTO;
		break;
	case PS_MSG_HELLO_REPLY:
		if (r->out_state == (s->cfg->security.auth ? OUT_AUTH : OUT_HELLO))
			rc = on_reply(s, c, (Ps__HelloReply *)m);
		else if (r->out_state == OUT_HELLO)
			rc = early_reply(c, (Ps__HelloReply *)m);
		break;
	case PS_MSG_REPL_SNAPSHOT:
		if (r->out_state != OUT_READY || r->state == PS_REPL_PRIMARY)
			break;
		rc = ps__repl_on_snapshot(s, (Ps__ReplSnapshot *)m, f, &done);
		r->snap_frames++;
		if (!rc && done) {
			r->state = PS_REPL_BACKUP;
			ps_info("replication: backup of shard %d: state received (%d frames, %.2f s), "
				"at batch %" PRIu64 " of epoch %" PRIu64, s->shard, r->snap_frames,
				ps_now_s() - r->snap_started, r->lsn, r->epoch);
			send_ack(r);
		}
		break;
	case PS_MSG_REPL_BATCH:
		if (r->out_state != OUT_READY || r->state != PS_REPL_BACKUP)
			break;
		rc = ps__repl_on_batch(s, (Ps__ReplBatch *)m, f);
		if (!rc)
			send_ack(r);
		break;
	default:
		break;
	}
	protobuf_c_message_free_unpacked(m, NULL);
	ps_frame_release(f);
	if (rc)
		c->t->ops->close(c, rc);
}

static void on_close(struct ps_conn *c, int status)
{
	struct ps_repl *r = c->t->data;

	if (c != r->out)
		return;
	r->out = NULL;
	r->out_state = OUT_NONE;
	r->next_dial = ps_now_s() + 0.1;
	if (r->state == PS_REPL_BACKUP && status != PS_EREFUSED && status != 0)
		ps_warn("replication: connection to the primary lost (%s); dialing again, taking "
			"over after %d ms without it", ps_strerror(status), 2 * r->srv->cfg->repl_timeout_ms);
}

static void dial(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	const struct ps_endpoint *ep = ps_config_replica_addr(s->cfg, s->shard, !r->me);
	double now = ps_now_s();
	int rc;

	r->dial_at = now;
	r->next_dial = now + 0.2;
	r->out_state = OUT_CONNECTING;
	rc = r->t->ops->connect(r->t, ep->host, ep->port, NULL, &r->out);
	if (rc) {
		r->out = NULL;
		r->out_state = OUT_NONE;
	}
	/* A partner named by a DNS name that exists only once its process
	 * does (a Kubernetes pod behind a headless Service): dialed again
	 * every 0.2 s as long as it takes, which this says at once and every
	 * 10 s. */
	if (rc == PS_ERESOLVE) {
		if (!r->unresolved_since)
			r->unresolved_since = now;
		if (now - r->unresolved_said >= 10) {
			ps_warn("replication: partner %s: the name does not resolve yet (for %.0f s); "
				"dialing again every 0.2 s until it does", r->partner,
				now - r->unresolved_since);
			r->unresolved_said = now;
		}
	} else if (r->unresolved_since) {
		ps_info("replication: partner %s resolves now, after %.1f s", r->partner,
			now - r->unresolved_since);
		r->unresolved_since = r->unresolved_said = 0;
	}
}

/* ---- life cycle ---- */

void ps__repl_tick(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	double now = ps_now_s(), t = timeout_s(s);
	char why[200];

	if (!r || s->stopping)
		return;
	switch (r->state) {
	case PS_REPL_PRIMARY:
		if (r->link && now - r->link_rx > t) {
			snprintf(why, sizeof(why), "no answer from its backup %s for %d ms "
				 "(replication.timeout_ms): it may be cut off, or about to take over",
				 r->link->conn->peer, s->cfg->repl_timeout_ms);
			step_down(s, why);
			break;
		}
		if (r->link && now - r->last_sent >= t / 4) {
			Ps__ReplBatch hb = PS__REPL_BATCH__INIT;
			hb.lsn = r->lsn;
			hb.epoch = r->epoch;
			r->last_sent = now;
			r->heartbeats++;
			ps_msg_send(r->link->conn, PS_MSG_REPL_BATCH, &hb.base, NULL, 0,
				    PS_SEND_VOLATILE, NULL, NULL);
		}
		break;
	case PS_REPL_BACKUP:
		if (now - r->link_rx > 2 * t) {
			snprintf(why, sizeof(why), "nothing from the primary for %.1f s (twice "
				 "replication.timeout_ms)", now - r->link_rx);
			take_over(s, 0, why);
			break;
		}
		/* dial again when the connection broke */
		__attribute__((fallthrough));
	case PS_REPL_JOINING:
		if (r->out && r->out_state != OUT_READY &&
		    now - r->dial_at > s->cfg->limits.connect_timeout_ms / 1000.0)
			out_close(r, PS_ETIMEDOUT);
		else if (!r->out && now >= r->next_dial)
			dial(s);
		break;
	}
}

int ps__repl_init(struct ps_server *s, int me)
{
	struct ps_repl *r;
	const struct ps_transport_ops *ops = s->transport->ops;
	struct ps_transport_cbs cbs = {
		.on_connect = on_connect,
		.on_frame = on_frame,
		.on_close = on_close,
	};
	struct ps_wire_limits hs = {
		.max_frame = PS_WIRE_HANDSHAKE_MAX, .max_meta = PS_WIRE_HANDSHAKE_MAX,
		.max_queue = s->cfg->limits.max_write_queue,
		.max_queue_total = s->cfg->limits.max_queued_bytes,
	};
	const struct ps_endpoint *ep = ps_config_replica_addr(s->cfg, s->shard, !me);
	size_t nw = (size_t)s->cfg->nworkers;
	int rc;

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->srv = s;
	r->me = me;
	r->state = PS_REPL_JOINING;
	r->pending_tail = &r->pending;
	r->link_rx = ps_now_s();
	snprintf(r->partner, sizeof(r->partner), "%s:%d", ep->host, ep->port);
	r->cfinished = calloc(nw, sizeof(*r->cfinished));
	r->cdedup = calloc(nw, sizeof(*r->cdedup));
	if (!r->cfinished || !r->cdedup) {
		rc = -ENOMEM;
		goto err_free_repl;
	}
	memcpy(r->cfinished, s->finished, nw * sizeof(*s->finished));
	rc = ops->create(s->loop, &cbs, &hs, r, &r->t);
	if (rc)
		goto err_free_repl;
	uv_check_init(s->loop, &r->check);
	r->check.data = s;
	uv_check_start(&r->check, flush_cb);
	r->handles = 1;
	s->repl = r;
	ps__repl_log_init_hooks(s);
	ps_info("replication: replica %d of shard %d, partner %s; joining", me, s->shard,
		r->partner);
	return 0;

err_free_repl:
	free(r->cfinished);
	free(r->cdedup);
	free(r);
	return rc;
}

void ps__repl_stop(struct ps_server *s)
{
	struct ps_repl *r = s->repl;

	if (!r || !r->handles)
		return;
	r->handles = 0;
	uv_close((uv_handle_t *)&r->check, NULL);
	r->t->ops->destroy(r->t);
}

void ps__repl_free(struct ps_server *s)
{
	struct ps_repl *r = s->repl;

	if (!r)
		return;
	ps__repl_drop_pending(s);
	ps__repl_staged_free(s, NULL, 0);
	free(r->b.slots);
	free(r->b.payload);
	free(r->b.marks);
	free(r->b.rows);
	free(r->b.rpayload);
	ps__repl_decl_clear(&r->b);
	free(r->snap_tables);
	free(r->hello);
	free(r->cfinished);
	free(r->cdedup);
	free(r);
	s->repl = NULL;
}

void ps__repl_stats(const struct ps_server *s, Ps__Stats *st, char *partner, size_t len)
{
	const struct ps_repl *r = s->repl;

	if (!r)
		return;
	st->repl_state = (uint32_t)r->state;
	st->repl_epoch = r->epoch;
	st->repl_replica = r->me;
	snprintf(partner, len, "%s", r->partner);
	st->repl_partner = partner;
	st->repl_partner_up = r->state == PS_REPL_PRIMARY ? r->link && r->caught_up
			      : r->out_state == OUT_READY && r->state == PS_REPL_BACKUP;
	st->repl_lag = r->state == PS_REPL_PRIMARY && r->link ? r->lsn - r->acked : 0;
	st->repl_failovers = r->failovers;
	st->repl_lsn = r->lsn;
	st->repl_batches = r->batches;
	st->repl_bytes = r->bytes;
	st->repl_heartbeats = r->heartbeats;
}
