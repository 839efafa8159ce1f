/* conn.c - a shard's connections: the transport's callbacks and the
 * handshake.
 *
 * Each connection starts in the hello state with frames limited to
 * PS_WIRE_HANDSHAKE_MAX bytes and a deadline. A valid Hello (handshake.c
 * decides what is valid) leads, with security.auth, to the
 * challenge-response of auth.h (state auth), then to the ready state, which
 * raises the limits to the configured ones. A frame that does not decode
 * closes its connection; a request frame is handed to its handler (push.c,
 * pull.c, admin.c). The periodic tick closes connections that stall the
 * handshake or go idle, and drops workers gone for longer than
 * limits.drop_timeout_ms from the live set.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "ps_time.h"
#include "auth.h"
#include "config_agree.h"
#include "frame_aead.h"
#include "handshake.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "replica.h"
#include "rows.h"
#include "members.h"
#include "server_int.h"

/* A refusal went out (or failed to: the peer reset the connection, and
 * ps__srv_on_close then logs that close with its reason). */
static void close_after_send(struct ps_conn *c, int status, void *arg)
{
	(void)arg;
	c->t->ops->close(c, status ? status : PS_EREFUSED);
}

/* ---- room for handshakes ---- */

/* The address part of a peer name ("host:port"): connections are counted
 * per source address. */
static size_t source_len(const char *peer)
{
	const char *p = strrchr(peer, ':');

	return p ? (size_t)(p - peer) : strlen(peer);
}

static int same_source(const char *a, const char *b)
{
	size_t n = source_len(a);

	return n == source_len(b) && memcmp(a, b, n) == 0;
}

static int in_handshake(const struct ps_srv_conn *sc)
{
	return sc->state != CONN_READY && !sc->evicted;
}

/* Handshakes open from peer's address, and the oldest of them. */
static int count_source(struct ps_server *s, const char *peer, struct ps_srv_conn **oldest)
{
	int n = 0;

	*oldest = NULL;
	for (struct ps_srv_conn *sc = s->conns; sc; sc = sc->next)
		if (in_handshake(sc) && same_source(sc->conn->peer, peer)) {
			n++;
			if (!*oldest || sc->accepted < (*oldest)->accepted)
				*oldest = sc;
		}
	return n;
}

/* Makes room for one more handshake from peer: past
 * limits.max_handshakes_per_source closes that address's oldest, past
 * limits.max_handshakes the oldest of the address holding the most. An
 * honest client finishes its handshake within a round trip or two, so a
 * flood from other addresses, however fast, closes the flood's own
 * connections and not the honest one. */
static void make_room(struct ps_server *s, const char *peer)
{
	struct ps_srv_conn *victim = NULL, *o;
	int total = 0, most = 0;
	const char *why = "limits.max_handshakes_per_source";

	if (count_source(s, peer, &o) >= s->cfg->limits.max_handshakes_per_source) {
		victim = o;
	} else {
		for (struct ps_srv_conn *sc = s->conns; sc; sc = sc->next)
			total += in_handshake(sc);
		why = "limits.max_handshakes";
		for (struct ps_srv_conn *sc = s->conns; total >= s->cfg->limits.max_handshakes && sc;
		     sc = sc->next) {
			int n;
			if (!in_handshake(sc))
				continue;
			n = count_source(s, sc->conn->peer, &o);
			if (n > most || (n == most && o->accepted < victim->accepted)) {
				most = n;
				victim = o;
			}
		}
	}
	if (!victim)
		return;
	victim->evicted = 1;
	s->nevicted++;
	if (s->evictions++ % 1000 == 0)
		ps_warn("closing %s, still in the handshake, to make room for %s (%s; %" PRIu64
			" closed so far: a flood of connections?)", victim->conn->peer, peer, why,
			s->evictions);
	victim->conn->t->ops->close(victim->conn, PS_EREFUSED);
}

/* ---- failed authentications: logged, at most PS_AUTH_LOG_BURST lines a
 * window, so that a flood of wrong proofs cannot fill the disk; the rest
 * are counted (auth_failures) and summed up once the window ends. */

#define PS_AUTH_LOG_BURST 5
#define PS_AUTH_LOG_WINDOW_S 60.0

/* The window ended: one line for the failures it did not log. */
static void auth_log_flush(struct ps_server *s, double now)
{
	if (now - s->authlog_since < PS_AUTH_LOG_WINDOW_S)
		return;
	if (s->authlog_quiet)
		ps_warn("%" PRIu64 " more failed authentications in the last %.0f s were not logged "
			"(the last from %s; ps_auth_failures_total counts them all)",
			s->authlog_quiet, now - s->authlog_since, s->authlog_last);
	s->authlog_since = now;
	s->authlog_lines = 0;
	s->authlog_quiet = 0;
}

static void auth_log(struct ps_server *s, const char *peer, const char *why)
{
	double now = ps_now_s();

	auth_log_flush(s, now);
	snprintf(s->authlog_last, sizeof(s->authlog_last), "%s", peer);
	if (s->authlog_lines < PS_AUTH_LOG_BURST) {
		s->authlog_lines++;
		ps_warn("authentication failed for %s: %s%s", peer, why,
			s->authlog_lines == PS_AUTH_LOG_BURST ? "; more failures within the next "
			"minute are counted but not logged one by one" : "");
		return;
	}
	s->authlog_quiet++;
}

static void refuse(struct ps_srv_conn *sc, const char *err)
{
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;
	struct ps_server *s = sc->srv;

	if (!sc->hello_replica || (s->cfg->security.auth && !sc->authed)) {
		/* (a peer that proved nothing changes nothing, not even what the
		 * log said last) */
		ps_warn("refusing %s: %s", sc->conn->peer, err);
	} else if (strcmp(err, s->replica_refused)) {
		/* the partner dials again every 0.2 s: said once */
		ps_error("refusing the shard's other process at %s: %s (said once; it dials "
			 "again until their configs agree)", sc->conn->peer, err);
		snprintf(s->replica_refused, sizeof(s->replica_refused), "%s", err);
	}
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard = sc->srv->shard;
	/* the map hash only to a peer that proved the secret */
	r.shard_map_hash = sc->authed || !sc->srv->cfg->security.auth ? sc->srv->map.hash : 0;
	r.ok = 0;
	r.error = (char *)err;
	sc->state = CONN_REFUSED;
	if (ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &r.base, NULL, 0, PS_SEND_STABLE,
			close_after_send, NULL))
		sc->conn->t->ops->close(sc->conn, PS_EREFUSED);
}

/* Another ready connection holds sc's rank. The same process reconnecting
 * (same incarnation: its old connection broke on its side) is accepted
 * beside it, as before (the old one closes at the idle timeout). A new
 * process of the rank whose old connection has been silent for two of its
 * heartbeat periods (2/3 of limits.idle_timeout_ms: its host died without
 * closing it) takes over: the old connection is closed. A second process
 * whose rank-mate still talks is refused naming the rank: both would train
 * the same share of the data (async) or push one clock twice (sync).
 * Returns 1 when sc was refused. */
static int duplicate_rank(struct ps_server *s, struct ps_srv_conn *sc)
{
	double now = ps_now_s(), idle = s->cfg->limits.idle_timeout_ms / 1000.0;
	char err[400];

	for (struct ps_srv_conn *o = s->conns, *next; o; o = next) {
		next = o->next; /* o may be gone once closed */
		if (o == sc || o->rank != sc->rank || o->state != CONN_READY || o->is_replica ||
		    o->evicted || o->incarnation == sc->incarnation)
			continue;
		if (idle <= 0 || now - o->last_rx <= idle * 2 / 3) {
			snprintf(err, sizeof(err), "worker %d is connected already (from %s, heard "
				 "from %.1f s ago): two processes with the same rank? A restarted "
				 "worker takes over once the old one's connection closes or stays "
				 "silent for %.0f ms (2/3 of limits.idle_timeout_ms)", sc->rank,
				 o->conn->peer, now - o->last_rx, idle * 2000 / 3);
			refuse(sc, err);
			return 1;
		}
		ps_warn("worker %d restarted (from %s): closing its old connection from %s, "
			"silent for %.1f s (its process is presumed dead)", sc->rank, sc->conn->peer,
			o->conn->peer, now - o->last_rx);
		o->evicted = 1; /* not counted again while it closes */
		s->nevicted++;
		o->conn->t->ops->close(o->conn, PS_ECLOSED);
	}
	return 0;
}

/* The handshake succeeded (and authenticated when required). */
static void accept_client(struct ps_server *s, struct ps_srv_conn *sc)
{
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;
	char err[200];

	if (s->nready >= s->cfg->limits.max_connections) {
		snprintf(err, sizeof(err), "the shard has %d connections already "
			 "(limits.max_connections)", s->nready);
		refuse(sc, err);
		return;
	}
	if (sc->is_replica) {
		/* the shard's other process: replica.c decides who serves; with
		 * security.auth only a peer that proved the replication key gets
		 * here (handle_auth), never one that proved the cluster secret */
		if (s->cfg->security.auth && !sc->repl_auth) {
			refuse(sc, "the replica role needs the replication key");
			return;
		}
		sc->state = CONN_READY;
		s->nready++;
		ps__repl_on_partner(s, sc);
		return;
	}
	if (sc->rank >= 0 && s->connected[sc->rank] && duplicate_rank(s, sc))
		return;
	if (sc->rank >= 0 && !ps__repl_serving(s)) {
		/* a backup or joining process: the worker tries the other address */
		Ps__HelloReply no = PS__HELLO_REPLY__INIT;
		no.protocol_version = PS_PROTOCOL_VERSION;
		no.shard = s->shard;
		no.shard_map_hash = s->map.hash;
		no.retry = 1;
		no.repl_state = (uint32_t)s->repl->state;
		no.epoch = s->repl->epoch;
		no.error = (char *)ps__repl_state_name(s->repl->state);
		sc->state = CONN_REFUSED;
		if (ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &no.base, NULL, 0, PS_SEND_STABLE,
				close_after_send, NULL))
			sc->conn->t->ops->close(sc->conn, PS_EREFUSED);
		return;
	}
	sc->state = CONN_READY;
	s->nready++;
	if (sc->rank >= 0) {
		s->connected[sc->rank]++;
		s->gone_since[sc->rank] = 0;
		/* a leave the rank's last process began (it died before its
		 * last clock) holds the others' pulls back: a new process of the
		 * rank trains on as a member */
		if (s->dedup[sc->rank].incarnation &&
		    s->dedup[sc->rank].incarnation != sc->incarnation)
			ps__members_unfreeze(s, sc->rank, "another process of its rank connected");
		if (!s->live[sc->rank] && ps__members_current(s, sc->rank)) {
			s->live[sc->rank] = 1;
			ps_warn("worker %d rejoined (incarnation %016" PRIx64 ") at clock %" PRIu64,
				sc->rank, sc->incarnation, ps__srv_resume_clock(s));
		}
		if (sc->done_clock > s->finished[sc->rank]) {
			/* this shard acknowledged more than it remembers: it restarted
			 * from an older checkpoint, and the worker will not send those
			 * clocks again (docs/reliability.md) */
			ps_warn("worker %d ended clock %" PRIu64 " here before this shard restarted; "
				"it had resumed at %" PRIu64 ": that worker's updates of the clocks "
				"between are lost", sc->rank, sc->done_clock - 1,
				s->finished[sc->rank]);
			s->finished[sc->rank] = sc->done_clock;
			ps__repl_note_finished(s, sc->rank);
			ps_store_advance(&s->store);
			ps__rows_advance(s);
			if (s->waiting)
				ps__srv_answer_pulls(s);
		}
	}
	struct ps_wire_limits lim = {
		.max_frame = s->cfg->limits.max_frame_bytes,
		.max_meta = s->cfg->limits.max_meta_bytes,
		.max_queue = s->cfg->limits.max_write_queue,
	};
	sc->conn->t->ops->set_limits(sc->conn, &lim);
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard = s->shard;
	r.shard_map_hash = s->map.hash;
	r.ok = 1;
	r.error = "";
	r.clock = ps__srv_resume_clock(s);
	r.boot_id = s->boot_id;
	r.fresh = s->c.pushes == 0 && (!s->repl || s->repl->lsn == 0);
	r.from_checkpoint = s->ckpt_loaded;
	if (s->repl) {
		r.repl_state = (uint32_t)s->repl->state;
		r.epoch = s->repl->epoch;
		r.lsn = s->repl->lsn;
	}
	ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &r.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
	char how[80];
	if (!s->cfg->security.auth)
		snprintf(how, sizeof(how), " (not authenticated: security.auth is off)");
	else if (s->cfg->security.encrypt)
		snprintf(how, sizeof(how), " (authenticated, frames encrypted with %s)",
			 ps_cipher_name(s->cfg->security.cipher));
	else
		snprintf(how, sizeof(how), " (authenticated, frames %s)", s->cfg->security.mac
			 ? "MACed" : "not MACed: security.mac is off");
	ps_info("%s %d connected from %s%s", sc->rank >= 0 ? "worker" : "monitor",
		sc->rank >= 0 ? sc->rank : 0, sc->conn->peer, how);
}

/* A worker whose cluster.workers, consistency or optimizer differs from
 * the shard's would train on another data split or update rule without a
 * word, and the shard's other process (cluster.replicas: 1) would apply
 * the batches it is sent with another rule, or make other rows, so that a
 * takeover changes the weights: a Hello's settings must match
 * (config_agree.h; a partner's also seed and the tables' rules), compared
 * as digests keyed with the secret under security.auth. */
static int settings_differ(const struct ps_server *s, const Ps__Hello *h, char *err,
			   size_t errlen)
{
	char mine[PS_AGREE_MAX];

	if (h->role == PS__ROLE__ROLE_REPLICA)
		ps_config_agreement_partner(s->cfg, mine, sizeof(mine));
	else
		ps_config_agreement(s->cfg, mine, sizeof(mine));
	return ps_config_agreement_diff(mine, s->cfg->security.auth ? s->secret : NULL,
					h->settings ? h->settings : "",
					h->settings ? strlen(h->settings) : 0, s->shard,
					h->role == PS__ROLE__ROLE_REPLICA ? "the partner" : "the worker",
					err, errlen);
}

/* hello is the Hello's metadata as received: the transcript covers it. */
static void handle_hello(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Hello *h,
			 const uint8_t *hello, size_t hello_len)
{
	const struct ps_security_cfg *sec = &s->cfg->security;
	Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN], proof[PS_AUTH_PROOF_LEN];
	char err[400] = "";

	int bad = ps_hello_check(s->cfg, s->map.hash, s->shard, h, err, sizeof(err));

	sc->hello_replica = h->role == PS__ROLE__ROLE_REPLICA;

	if (bad && h->protocol_version == PS_PROTOCOL_VERSION && h->shard_map_hash != s->map.hash &&
	    h->shard_map_hash == s->old_place_hash)
		snprintf(err, sizeof(err), "shard map mismatch: the client places rows and slices as "
			 "builds before re-sharding did (placement 0, map %016" PRIx64 "), shard %d "
			 "by jump and rendezvous hashing (map %016" PRIx64 "): run a client of this "
			 "build", h->shard_map_hash, s->shard, s->map.hash);

	if (!bad && (h->role == PS__ROLE__ROLE_WORKER || h->role == PS__ROLE__ROLE_REPLICA))
		bad = settings_differ(s, h, err, sizeof(err));

	if (bad && (h->protocol_version != PS_PROTOCOL_VERSION || !sec->auth)) {
		/* another protocol version (public, and the handshake may differ),
		 * or no secret to protect the details with */
		refuse(sc, err);
		return;
	}
	if (bad) {
		/* the map hash, rank range and worker count it would reveal are
		 * told only once the peer has proven the secret (handle_auth): an
		 * honest but misconfigured worker still reads why */
		sc->refusal = strdup(err);
		if (!sc->refusal) {
			sc->conn->t->ops->close(sc->conn, -ENOMEM);
			return;
		}
	} else {
		sc->rank = h->role == PS__ROLE__ROLE_WORKER ? h->rank : -1;
		sc->is_reader = h->role == PS__ROLE__ROLE_READER;
		sc->incarnation = h->incarnation;
		sc->done_clock = h->done_clock;
		if (h->role == PS__ROLE__ROLE_REPLICA) {
			s->replica_refused[0] = 0; /* a refusal after this one is said again */
			if (h->replica == s->replica) {
				refuse(sc, "a process with the same replica index dialed: two "
				       "processes were started for one address?");
				return;
			}
			sc->is_replica = 1;
			sc->peer_state = (int)h->repl_state;
			sc->peer_epoch = h->epoch;
			sc->peer_lsn = h->lsn;
		}
	}
	if (sc->is_reader && sec->auth && !s->have_reader_key) {
		refuse(sc, "this shard has no reader key: readers are refused until the shards "
		       "get one (security.reader_key_file, PS_READER_KEY_FILE or --reader-key-file)");
		return;
	}
	if (!sec->auth) {
		sc->authed = 1;
		if (h->auth_nonce.len) {
			refuse(sc, "the client authenticates but this shard has security.auth: false; "
			       "the two configs must agree");
			return;
		}
		accept_client(s, sc);
		return;
	}
	if (h->auth_nonce.len != PS_AUTH_NONCE_LEN) {
		snprintf(err, sizeof(err), "this shard requires authentication (security.auth: "
			 "true) and the client sent %s", h->auth_nonce.len ? "a malformed nonce"
			 : "none (security.auth: false on its side?)");
		refuse(sc, err);
		return;
	}
	if (h->auth_mac != sec->mac) {
		snprintf(err, sizeof(err), "frame MACs: the client has security.mac: %s, this shard "
			 "%s; the two configs must agree", h->auth_mac ? "true" : "false",
			 sec->mac ? "true" : "false");
		refuse(sc, err);
		return;
	}
	if (h->auth_cipher != (uint32_t)(ps_auth_cipher(sec) + 1)) {
		/* before any proof: the client's own setting, not the shard's
		 * (docs/security.md; the shard's log names both) */
		snprintf(err, sizeof(err), "encryption: the client has security.encrypt: %s%s and "
			 "this shard's setting differs; the two configs must agree "
			 "(security.encrypt, security.cipher)",
			 h->auth_cipher ? "true with " : "false",
			 h->auth_cipher ? ps_cipher_name((int)h->auth_cipher - 1) : "");
		ps_warn("refusing %s: it has security.encrypt: %s%s, this shard %s%s", sc->conn->peer,
			h->auth_cipher ? "true with " : "false",
			h->auth_cipher ? ps_cipher_name((int)h->auth_cipher - 1) : "",
			sec->encrypt ? "true with " : "false",
			sec->encrypt ? ps_cipher_name(sec->cipher) : "");
		refuse(sc, err);
		return;
	}
	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(hello, hello_len, nonce, sc->transcript);
	/* the replica role is proven with the replication key, which workers
	 * and monitors do not hold; every other role with the secret */
	sc->repl_auth = h->role == PS__ROLE__ROLE_REPLICA && s->cfg->replicas;
	if (sc->repl_auth)
		ps_auth_repl_proof(s->repl_key, sc->transcript, 1, proof);
	else if (sc->is_reader)
		ps_auth_reader_proof(s->reader_key, sc->transcript, 1, proof);
	else
		ps_auth_proof(s->secret, sc->transcript, 1, proof);
	ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
	ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	sc->state = CONN_AUTH;
	ps_msg_send(sc->conn, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0, PS_SEND_VOLATILE, NULL,
		    NULL);
}

/* The client's proof; returns nonzero when the connection must close. */
static int handle_auth(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Auth *a)
{
	struct ps_frame_keys keys;

	if (sc->repl_auth ? !ps_auth_repl_proof_ok(s->repl_key, sc->transcript, 0, a->proof.data,
						   a->proof.len)
	    : sc->is_reader ? !ps_auth_reader_proof_ok(s->reader_key, sc->transcript, 0,
						       a->proof.data, a->proof.len)
			  : !ps_auth_proof_ok(s->secret, sc->transcript, 0, a->proof.data,
					      a->proof.len)) {
		return 1; /* counted and logged by ps__srv_on_close */
	}
	if (sc->repl_auth) {
		/* the replication link is MACed even without security.mac: the
		 * backup applies every byte its primary sends */
		ps_auth_repl_session_keys(s->repl_key, sc->transcript, 1, &keys);
		keys.cipher = ps_auth_cipher(&s->cfg->security);
		sc->conn->t->ops->set_keys(sc->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	} else if (s->cfg->security.mac && sc->is_reader) {
		ps_auth_reader_session_keys(s->reader_key, sc->transcript, 1, &keys);
		keys.cipher = ps_auth_cipher(&s->cfg->security);
		sc->conn->t->ops->set_keys(sc->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	} else if (s->cfg->security.mac) {
		ps_auth_session_keys(s->secret, sc->transcript, 1, &keys);
		keys.cipher = ps_auth_cipher(&s->cfg->security);
		sc->conn->t->ops->set_keys(sc->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	}
	sodium_memzero(sc->transcript, sizeof(sc->transcript));
	sc->authed = 1;
	if (sc->refusal) {
		refuse(sc, sc->refusal); /* now that it proved the secret, with the details */
		return 0;
	}
	accept_client(s, sc);
	return 0;
}

/* ---- transport callbacks ---- */

void ps__srv_on_accept(struct ps_transport *t, struct ps_conn *c)
{
	struct ps_server *s = t->data;
	struct ps_srv_conn *sc;

	make_room(s, c->peer);
	if (s->nconns - s->nevicted >=
	    s->cfg->limits.max_connections + s->cfg->limits.max_handshakes) {
		/* cannot happen while make_room keeps the handshakes bounded */
		ps_warn("refusing %s: %d connections already (limits.max_connections plus "
			"limits.max_handshakes)", c->peer, s->nconns);
		t->ops->close(c, PS_EREFUSED);
		return;
	}
	sc = calloc(1, sizeof(*sc));
	if (!sc) {
		t->ops->close(c, -ENOMEM);
		return;
	}
	sc->srv = s;
	sc->conn = c;
	sc->rank = -1;
	sc->accepted = ps_now_s();
	sc->last_rx = sc->accepted;
	c->data = sc;
	sc->next = s->conns;
	if (s->conns)
		s->conns->prev = sc;
	s->conns = sc;
	s->nconns++;
	ps_debug("connection from %s", c->peer);
}

/* A push (or row push) from a worker that is not a member of its clock
 * (it left, has not joined, or joined at a later clock): refused with an
 * Error naming why (members.h); nothing of it is applied. 1 when refused. */
static int refused_push(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			uint64_t clock, int end, int leave)
{
	char why[200];
	int rc = ps__members_check_push(s, sc->rank, clock, end, leave, why, sizeof(why));

	if (!rc)
		return 0;
	s->c.errors++;
	ps_warn("worker %d: push for clock %" PRIu64 " refused: %s", sc->rank, clock, why);
	ps_msg_send_error(sc->conn, req_id, rc, "%s", why);
	return 1;
}

void ps__srv_on_frame(struct ps_conn *c, struct ps_frame *f)
{
	struct ps_srv_conn *sc = c->data;
	struct ps_server *s;
	ProtobufCMessage *m;
	char why[200];
	int keep = 0;

	if (!sc) {
		ps_frame_release(f);
		return;
	}
	s = sc->srv;
	sc->last_rx = ps_now_s();
	m = ps_msg_unpack(f, why, sizeof(why));
	if (!m) {
		ps_warn("closing connection from %s: %s", c->peer, why);
		goto err_close;
	}
	if (sc->state != CONN_READY &&
	    f->hdr.type != (sc->state == CONN_AUTH ? PS_MSG_AUTH : PS_MSG_HELLO)) {
		ps_warn("closing connection from %s: %s frame before the handshake finished",
			c->peer, ps_wire_type_name(f->hdr.type));
		goto err_free_msg;
	}
	if ((f->hdr.flags & PS_FRAME_F_LZ4) && f->hdr.type != PS_MSG_PUSH) {
		ps_warn("closing connection from %s: LZ4 flag on a %s frame", c->peer,
			ps_wire_type_name(f->hdr.type));
		goto err_free_msg;
	}
	if (sc->is_replica && sc->state == CONN_READY) {
		ps__repl_on_link_frame(s, sc, f->hdr.type, m);
		protobuf_c_message_free_unpacked(m, NULL);
		ps_frame_release(f);
		return;
	}
	if (sc->is_reader && sc->state == CONN_READY && ps__srv_reader_refuses(s, sc, f->hdr.type, m)) {
		protobuf_c_message_free_unpacked(m, NULL);
		ps_frame_release(f);
		return;
	}
	switch (f->hdr.type) {
	case PS_MSG_HELLO:
		if (sc->state != CONN_HELLO) {
			ps_warn("closing connection from %s: second hello", c->peer);
			goto err_free_msg;
		}
		handle_hello(s, sc, (Ps__Hello *)m, f->meta, f->hdr.meta_len);
		break;
	case PS_MSG_AUTH:
		if (handle_auth(s, sc, (Ps__Auth *)m)) {
			protobuf_c_message_free_unpacked(m, NULL);
			ps_frame_release(f);
			c->t->ops->close(c, PS_EAUTH);
			return;
		}
		break;
	case PS_MSG_PUSH:
		if (sc->rank < 0) {
			ps_warn("closing connection from %s: push from a non-worker", c->peer);
			goto err_free_msg;
		}
		if (refused_push(s, sc, ((Ps__Push *)m)->req_id, ((Ps__Push *)m)->clock,
				 ((Ps__Push *)m)->end_clock, ((Ps__Push *)m)->leave))
			break;
		ps__srv_handle_push(s, sc, (Ps__Push *)m, f);
		keep = 1;
		break;
	case PS_MSG_PULL:
		ps__srv_handle_pull(s, sc, (Ps__Pull *)m);
		break;
	case PS_MSG_PULL_ROWS:
		ps__rows_handle_pull(s, sc, (Ps__PullRows *)m, f);
		break;
	case PS_MSG_PUSH_ROWS:
		if (sc->rank < 0) {
			ps_warn("closing connection from %s: row push from a non-worker", c->peer);
			goto err_free_msg;
		}
		if (refused_push(s, sc, ((Ps__PushRows *)m)->req_id, ((Ps__PushRows *)m)->clock,
				 0, 0))
			break;
		ps__rows_handle_push(s, sc, (Ps__PushRows *)m, f);
		break;
	case PS_MSG_DECLARE:
		ps__srv_handle_declare(s, sc, (Ps__Declare *)m, f);
		break;
	case PS_MSG_DECLARE_TABLES:
		ps__srv_handle_declare_tables(s, sc, (Ps__DeclareTables *)m);
		break;
	case PS_MSG_STATS_REQUEST:
		ps__srv_handle_stats(s, sc, (Ps__StatsRequest *)m);
		break;
	case PS_MSG_HEARTBEAT: {
		/* answered, so the client can tell that this shard is alive; with
		 * why a pull of this connection is held, if one is */
		Ps__Heartbeat hb = PS__HEARTBEAT__INIT;
		char held[300];

		hb.seq = ((Ps__Heartbeat *)m)->seq;
		for (struct ps_waiting_pull *p = s->waiting; sc->nwaiting && p; p = p->next)
			if (p->sc == sc) {
				ps__srv_pull_held_why(s, p, held, sizeof(held));
				hb.held = held;
				break;
			}
		ps_msg_send(sc->conn, PS_MSG_HEARTBEAT, &hb.base, NULL, 0, PS_SEND_VOLATILE, NULL,
			    NULL);
		break;
	}
	default:
		ps_warn("closing connection from %s: unexpected %s frame", c->peer,
			ps_wire_type_name(f->hdr.type));
		goto err_free_msg;
	}
	protobuf_c_message_free_unpacked(m, NULL);
	if (!keep)
		ps_frame_release(f);
	return;

err_free_msg:
	protobuf_c_message_free_unpacked(m, NULL);
err_close:
	/* Counted in rejected_frames by ps__srv_on_close, which sees PS_EPROTO. */
	ps_frame_release(f);
	c->t->ops->close(c, PS_EPROTO);
}

/* limits.drop_timeout_ms 0: the idle timeout, at most this (seconds). */
#define PS_DROP_DEFAULT_S 5.0

/* A worker has had no connection for limits.drop_timeout_ms: the barrier
 * and the slowest-clock rule stop waiting for it (docs/consistency.md), so the
 * others go on. What it pushed before it went still counts. It rejoins by
 * connecting again (and continues at the shard's clock, HelloReply.clock). */
static void drop_worker(struct ps_server *s, int rank)
{
	int nlive = 0;

	s->live[rank] = 0;
	ps__members_cancel(s, rank);
	for (int r = 0; r < s->cfg->nworkers; r++)
		nlive += s->live[r];
	ps_warn("worker %d left the live set; %d of %d workers remain", rank, nlive,
		s->cfg->nworkers);
	ps_store_advance(&s->store);
	ps__rows_advance(s);
	if (s->waiting)
		ps__srv_answer_pulls(s);
}

void ps__srv_on_close(struct ps_conn *c, int status)
{
	struct ps_srv_conn *sc = c->data;
	struct ps_server *s;
	struct ps_waiting_pull **pp, *p;

	if (!sc)
		return;
	s = sc->srv;
	ps__srv_ckpt_forget(s, sc);
	ps__repl_conn_gone(s, sc);
	if (sc->is_link)
		ps__repl_link_closed(s, sc, status);
	if (status == PS_EPROTO || status == PS_ETOOBIG || status == PS_EVERSION)
		s->c.rejected_frames++;
	if (status == PS_EAUTH) { /* a wrong proof, or a frame failing its MAC or number */
		s->c.auth_failures++;
		s->c.rejected_frames++;
		auth_log(s, c->peer, sc->state == CONN_AUTH ? sc->repl_auth ?
			 "its proof does not match (another replication key: a replica Hello must "
			 "prove security.repl_key_file, not the cluster secret)" : "its proof does "
			 "not match (another secret, or a replayed handshake)" : "a frame failed its "
			 "MAC or sequence number (another secret, or frames altered on the way)");
	} else if (sc->state == CONN_AUTH && !sc->evicted && status == PS_ECLOSED) {
		/* the peer hung up between the shard's proof and its own: an
		 * honest client checks the shard's proof first, so it holds
		 * another secret (or another replication key) */
		s->c.auth_failures++;
		auth_log(s, c->peer, sc->repl_auth ? "it closed the connection instead of proving "
			 "the replication key (its security.repl_key_file differs from this "
			 "shard's?)" : "it closed the connection instead of proving the secret (it "
			 "holds another one: its security.secret_file or PS_SECRET_FILE differs "
			 "from this shard's?)");
	}
	for (pp = &s->waiting; (p = *pp);) {
		if (p->sc == sc) {
			*pp = p->next;
			free(p);
		} else {
			pp = &p->next;
		}
	}
	ps__rows_forget(s, sc);
	if (sc->state == CONN_READY)
		s->nready--;
	if (sc->rank >= 0 && sc->state == CONN_READY) {
		s->connected[sc->rank]--;
		ps_info("worker %d disconnected (%s), connection from %s", sc->rank,
			status == PS_ECLOSED || status == 0 ? "closed" : ps_strerror(status), c->peer);
		if (s->connected[sc->rank] == 0)
			s->gone_since[sc->rank] = ps_now_s(); /* dropped by ps__srv_on_tick if it stays away */
	} else if (status == PS_ECLOSED || (status < 0 && status > -4096)) {
		/* closed by the peer, or reset under a write: the other closes
		 * (refusals, timeouts, protocol errors) were logged by whoever
		 * closed, a ready worker's just above */
		ps_info("%sconnection from %s closed%s (%s)",
			sc->is_replica ? "replication " : sc->state == CONN_READY ? "monitor " : "",
			c->peer, sc->is_replica || sc->state == CONN_READY ? ""
			: sc->state == CONN_REFUSED ? " after its refusal" : " during the handshake",
			ps_strerror(status));
	}
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->conns = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	s->nconns--;
	s->nevicted -= sc->evicted;
	free(sc->refusal);
	free(sc);
}

/* Drops connections that did not finish the handshake in time. */
void ps__srv_on_tick(uv_timer_t *t)
{
	struct ps_server *s = t->data;
	double now = ps_now_s(), limit = s->cfg->limits.handshake_timeout_ms / 1000.0;
	double idle = s->cfg->limits.idle_timeout_ms / 1000.0;

	ps__rows_tick(s, now);
	ps__members_tick(s, now);
	ps__srv_ckpt_poll(s);
	ps__srv_stop_poll(s);
	auth_log_flush(s, now);
	for (struct ps_srv_conn *sc = s->conns; sc; sc = sc->next) {
		if ((sc->state == CONN_HELLO || sc->state == CONN_AUTH) &&
		    now - sc->accepted > limit) {
			ps_warn("closing connection from %s: handshake not finished within %d ms "
				"(limits.handshake_timeout_ms)", sc->conn->peer,
				s->cfg->limits.handshake_timeout_ms);
			sc->conn->t->ops->close(sc->conn, PS_ETIMEDOUT);
		} else if (sc->is_replica) {
			continue; /* its silence is replica.c's to judge */
		} else if (sc->state == CONN_READY && idle > 0 && now - sc->last_rx > idle) {
			ps_warn("closing connection from %s: nothing received for %d ms "
				"(limits.idle_timeout_ms)", sc->conn->peer, s->cfg->limits.idle_timeout_ms);
			sc->conn->t->ops->close(sc->conn, PS_ETIMEDOUT);
		} else {
			ps__srv_check_backlog(s, sc);
		}
	}
	/* a pull held for half the clients' request timeout: the log says
	 * which workers it waits for, once */
	for (struct ps_waiting_pull *p = s->waiting; p; p = p->next) {
		char why[300];

		if (p->warned || now - p->arrived < s->cfg->limits.request_timeout_ms / 2000.0)
			continue;
		p->warned = 1;
		ps__srv_pull_held_why(s, p, why, sizeof(why));
		ps_warn("a pull from %s (rank %d) is held for %.0f s: %s", p->sc->conn->peer,
			p->sc->rank, now - p->arrived, why);
	}
	ps__repl_tick(s);
	if (!ps__repl_serving(s))
		return; /* a backup's barriers are its primary's */
	/* a closed connection is known at once: a killed worker stops the
	 * others for the drop timeout, by default the idle one but at most
	 * PS_DROP_DEFAULT_S (a worker restarted later rejoins all the same) */
	double drop = s->cfg->limits.drop_timeout_ms ? s->cfg->limits.drop_timeout_ms / 1000.0
			: idle > 0 && idle < PS_DROP_DEFAULT_S ? idle : PS_DROP_DEFAULT_S;
	for (int r = 0; drop > 0 && r < s->cfg->nworkers; r++)
		if (s->live[r] && !s->connected[r] && s->gone_since[r] > 0 &&
		    now - s->gone_since[r] > drop)
			drop_worker(s, r);
}
