/* server.c - a shard's connection and request handling.
 *
 * Each connection starts in the hello state with frames limited to
 * PS_WIRE_HANDSHAKE_MAX bytes and a deadline. A valid Hello leads, with
 * security.auth, to the challenge-response of auth.h (state auth), then to
 * the ready state, which raises the limits to the configured ones. A frame
 * that does not decode closes its connection; a request that decodes but
 * cannot be served (unknown slice, clock outside the window) gets an Error
 * reply and nothing of it is applied.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sodium.h>
#include "ps_time.h"
#include "auth.h"
#include "checkpoint.h"
#include "handshake.h"
#include "metrics_http.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "server.h"

enum { CONN_HELLO, CONN_AUTH, CONN_READY, CONN_REFUSED };

struct ps_srv_conn {
	struct ps_server *srv;
	struct ps_conn *conn;
	int state;
	int rank;                  /* worker rank; -1 for a monitor */
	uint64_t incarnation;
	uint64_t done_clock;       /* Hello.done_clock */
	uint8_t transcript[32];    /* CONN_AUTH: T of auth.h */
	double accepted;
	double last_rx;            /* ps_now_s() of the last frame received */
	struct ps_srv_conn *prev, *next;
};

struct ps_waiting_pull {
	struct ps_srv_conn *sc;
	uint64_t req_id, min_version, clock;
	double arrived;            /* ps_now_s() when the pull came in */
	int codec;                 /* reply encoding: PS_CODEC_NONE or PS_CODEC_FP16 */
	uint32_t n;
	struct ps_waiting_pull *next;
	struct ps_slot *slots[];
};

static uint64_t min_finished(const struct ps_server *s)
{
	uint64_t m = UINT64_MAX;

	for (int r = 0; r < s->cfg->nworkers; r++)
		if (s->live[r] && s->finished[r] < m)
			m = s->finished[r];
	if (m == UINT64_MAX) { /* nobody live: the fastest clock */
		m = 0;
		for (int r = 0; r < s->cfg->nworkers; r++)
			if (s->finished[r] > m)
				m = s->finished[r];
	}
	return m;
}

/* Starts a request's check for slices named twice (each may appear once
 * in a push or a pull: a repeated one would multiply the work and, in a
 * pull, the reply). */
static void seen_reset(struct ps_server *s)
{
	if (++s->seen_gen == 0) {
		memset(s->seen, 0, sizeof(*s->seen) * (size_t)s->store.nslots);
		s->seen_gen = 1;
	}
}

/* 1 when slot sl was already named by the current request. */
static int seen_twice(struct ps_server *s, const struct ps_slot *sl)
{
	size_t i = (size_t)(sl - s->store.slots);

	if (s->seen[i] == s->seen_gen)
		return 1;
	s->seen[i] = s->seen_gen;
	return 0;
}

/* ---- pulls ---- */

static int pull_ready(const struct ps_server *s, const struct ps_waiting_pull *p)
{
	for (uint32_t i = 0; i < p->n; i++)
		if (p->slots[i]->version < p->min_version)
			return 0;
	if (s->cfg->consistency == PS_ASYNC && p->clock > (uint64_t)s->cfg->staleness &&
	    min_finished(s) < p->clock - (uint64_t)s->cfg->staleness)
		return 0;
	return 1;
}

static void send_pull_reply(struct ps_server *s, struct ps_waiting_pull *p)
{
	Ps__SliceRef refs_small[16], *refs = refs_small;
	Ps__SliceRef *ptrs_small[16], **ptrs = ptrs_small;
	struct ps_iov iov_small[16], *iov = iov_small;
	Ps__PullReply r = PS__PULL_REPLY__INIT;
	uint64_t off = 0, fin = min_finished(s);
	const struct ps_codec_ops *co = p->codec ? ps_codec_get(p->codec) : NULL;
	uint64_t raw = 0;
	uint8_t *enc = NULL;
	int rc;

	if (p->n > 16) {
		refs = malloc(sizeof(*refs) * p->n);
		ptrs = malloc(sizeof(*ptrs) * p->n);
		iov = malloc(sizeof(*iov) * p->n);
		if (!refs || !ptrs || !iov) {
			ps_msg_send_error(p->sc->conn, p->req_id, -ENOMEM, "out of memory");
			goto out_free;
		}
	}
	if (co) {
		size_t total = 0;
		for (uint32_t i = 0; i < p->n; i++)
			total += (co->max_bytes((size_t)p->slots[i]->slice->count, NULL) + 3) & ~(size_t)3;
		enc = malloc(total ? total : 1);
		if (!enc) {
			ps_msg_send_error(p->sc->conn, p->req_id, -ENOMEM, "out of memory");
			goto out_free;
		}
	}
	for (uint32_t i = 0; i < p->n; i++) {
		struct ps_slot *sl = p->slots[i];
		uint64_t len = (uint64_t)sl->slice->count * sizeof(float);
		ps__slice_ref__init(&refs[i]);
		refs[i].slice = sl->slice->id;
		refs[i].offset = off;
		refs[i].version = sl->version;
		iov[i].base = sl->w;
		raw += len;
		if (co) {
			/* fp16 weights: encoded here, copied by the volatile send */
			struct ps_codec_params prm = { 1.0f, 0 };
			ssize_t e = co->encode(sl->w, NULL, (size_t)sl->slice->count, &prm, 0,
					       enc + off, co->max_bytes((size_t)sl->slice->count, &prm));
			if (e < 0) {
				ps_msg_send_error(p->sc->conn, p->req_id, (int)e, "encoding failed");
				goto out_free;
			}
			len = (uint64_t)e;
			iov[i].base = enc + off;
			refs[i].codec = (uint32_t)p->codec;
			memset(enc + off + len, 0, (size_t)(-len & 3)); /* next offset 4-aligned */
		}
		refs[i].length = len;
		ptrs[i] = &refs[i];
		iov[i].len = (len + 3) & ~(uint64_t)3;
		off += iov[i].len;
	}
	s->c.pull_raw += raw;
	s->c.pull_wire += off;
	r.req_id = p->req_id;
	r.n_slices = p->n;
	r.slices = ptrs;
	/* The weights change with the next apply: volatile send. */
	rc = ps_msg_send(p->sc->conn, PS_MSG_PULL_REPLY, &r.base, iov, (int)p->n, PS_SEND_VOLATILE,
			 NULL, NULL);
	if (rc)
		ps_debug("pull reply to %s not sent: %s", p->sc->conn->peer, ps_strerror(rc));
	ps_histo_add(&s->c.pull_lat, ps_now_s() - p->arrived);
	if (p->clock > fin && p->clock - fin > s->c.max_clock_gap)
		s->c.max_clock_gap = p->clock - fin;
	s->c.bytes_out += off;
out_free:
	free(enc);
	if (refs != refs_small) {
		free(refs);
		free(ptrs);
		free(iov);
	}
}

/* Drops a peer that does not read what it asks for: replies queued past
 * limits.max_write_queue_bytes would otherwise grow without bound. */
static int check_backlog(struct ps_server *s, struct ps_srv_conn *sc)
{
	size_t q = sc->conn->t->ops->queued_bytes(sc->conn);

	if (q <= s->cfg->limits.max_write_queue)
		return 0;
	ps_warn("closing connection from %s: %zu reply bytes queued and not read "
		"(limits.max_write_queue_bytes is %" PRIu64 ")", sc->conn->peer, q,
		s->cfg->limits.max_write_queue);
	sc->conn->t->ops->close(sc->conn, PS_ETOOBIG);
	return 1;
}

/* Answers every waiting pull whose condition now holds. */
static void answer_pulls(struct ps_server *s)
{
	struct ps_waiting_pull **pp = &s->waiting, *p;

	while ((p = *pp)) {
		if (pull_ready(s, p)) {
			*pp = p->next;
			send_pull_reply(s, p);
			check_backlog(s, p->sc);
			free(p);
		} else {
			pp = &p->next;
		}
	}
}

static void handle_pull(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Pull *m)
{
	struct ps_waiting_pull *p;

	s->c.pulls++;
	p = malloc(sizeof(*p) + m->n_slices * sizeof(p->slots[0]));
	if (!p) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		return;
	}
	p->sc = sc;
	p->req_id = m->req_id;
	p->min_version = m->min_version;
	p->clock = m->clock;
	p->arrived = ps_now_s();
	p->codec = (int)m->codec;
	if (m->codec != PS_CODEC_NONE && m->codec != PS_CODEC_FP16) {
		s->c.errors++;
		ps_msg_send_error(sc->conn, m->req_id, PS_EPROTO,
				  "pull replies can be raw (0) or fp16 (1), not codec %u", m->codec);
		free(p);
		return;
	}
	p->n = (uint32_t)m->n_slices;
	seen_reset(s);
	for (size_t i = 0; i < m->n_slices; i++) {
		p->slots[i] = ps_store_slot(&s->store, m->slices[i]);
		if (!p->slots[i]) {
			s->c.errors++;
			ps_msg_send_error(sc->conn, m->req_id, PS_ENOTENSOR,
					  "slice %u is not owned by shard %d", m->slices[i], s->shard);
			free(p);
			return;
		}
		if (seen_twice(s, p->slots[i])) {
			s->c.errors++;
			ps_msg_send_error(sc->conn, m->req_id, PS_EPROTO,
					  "slice %u is asked for twice in one pull", m->slices[i]);
			free(p);
			return;
		}
	}
	if (pull_ready(s, p)) {
		send_pull_reply(s, p);
		free(p);
		return;
	}
	p->next = s->waiting;
	s->waiting = p;
}

/* ---- pushes ---- */

static void send_ack(struct ps_srv_conn *sc, uint64_t req_id)
{
	Ps__PushAck ack = PS__PUSH_ACK__INIT;

	ack.req_id = req_id;
	ps_msg_send(sc->conn, PS_MSG_PUSH_ACK, &ack.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
}

/* Expands an LZ4 push payload (frame flag PS_FRAME_F_LZ4) into a new
 * buffer of exactly m->raw_length bytes, within the frame size limit. */
static int expand_payload(struct ps_server *s, const Ps__Push *m, const struct ps_frame *f,
			  uint8_t **out, char *why, size_t whylen)
{
	uint8_t *buf;
	int rc;

	if (m->raw_length == 0 || m->raw_length > s->cfg->limits.max_frame_bytes) {
		snprintf(why, whylen, "LZ4 payload claims %" PRIu64 " bytes expanded (limit %" PRIu64
			 ")", m->raw_length, s->cfg->limits.max_frame_bytes);
		return PS_ETOOBIG;
	}
	buf = aligned_alloc(64, (m->raw_length + 63) & ~(uint64_t)63);
	if (!buf) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	rc = ps_lz4_unpack(f->payload, f->hdr.payload_len, buf, m->raw_length, why, whylen);
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	return 0;
}

static void handle_push(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Push *m,
			struct ps_frame *f)
{
	const struct ps_config *cfg = s->cfg;
	struct ps_frame_ref *fr;
	uint8_t *payload = f->payload, *expanded = NULL;
	uint64_t plen = f->hdr.payload_len;
	char why[256];
	int changed = 0, rc;
	double arrived = ps_now_s();

	s->c.pushes++;
	if (m->seq && sc->rank >= 0) {
		/* resent after a reconnect? then answer as the first time */
		int code;
		/* numbers count per worker process: another incarnation of the
		 * rank starts afresh */
		ps_dedup_incarnation(&s->dedup[sc->rank], sc->incarnation);
		switch (ps_dedup_check(&s->dedup[sc->rank], m->seq, &code)) {
		case PS_DEDUP_NEW:
			break;
		case PS_DEDUP_SEEN:
			s->c.duplicate_pushes++;
			if (code)
				ps_msg_send_error(sc->conn, m->req_id, code, "push %" PRIu64 " was "
						  "refused when it first came: %s", m->seq,
						  ps_strerror(code));
			else
				send_ack(sc, m->req_id);
			ps_frame_release(f);
			return;
		case PS_DEDUP_TOO_OLD:
			ps_msg_send_error(sc->conn, m->req_id, PS_EDUP, "push %" PRIu64 " is older than "
					  "the %d pushes this shard remembers: cannot tell whether it "
					  "was applied", m->seq, PS_DEDUP_WINDOW);
			rc = PS_EDUP;
			goto err_reject;
		}
	}
	if (f->hdr.flags & PS_FRAME_F_LZ4) {
		rc = expand_payload(s, m, f, &expanded, why, sizeof(why));
		if (rc) {
			ps_msg_send_error(sc->conn, m->req_id, rc, "push: %s", why);
			goto err_reject;
		}
		payload = expanded;
		plen = m->raw_length;
	}
	/* Check everything first: a push is applied whole or not at all. */
	seen_reset(s);
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *r = m->slices[i];
		struct ps_slot *sl = ps_store_slot(&s->store, r->slice);
		struct ps_grad g;
		if (!sl) {
			rc = PS_ENOTENSOR;
			ps_msg_send_error(sc->conn, m->req_id, rc, "slice %u is not owned by shard %d",
					  r->slice, s->shard);
			goto err_reject;
		}
		if (seen_twice(s, sl)) {
			rc = PS_EPROTO;
			ps_msg_send_error(sc->conn, m->req_id, rc, "slice %u appears twice in one push",
					  r->slice);
			goto err_reject;
		}
		if (r->offset % 4 || r->offset > plen || r->length > plen - r->offset) {
			rc = PS_ESHAPE;
			ps_msg_send_error(sc->conn, m->req_id, rc,
					  "slice %u: %" PRIu64 " bytes at offset %" PRIu64
					  " do not match its %" PRId64 " elements in a %" PRIu64
					  "-byte payload",
					  r->slice, r->length, r->offset, sl->slice->count, plen);
			goto err_reject;
		}
		if (cfg->consistency == PS_SYNC &&
		    (m->clock < sl->version ||
		     m->clock >= sl->version + (uint64_t)cfg->limits.max_clock_ahead)) {
			rc = PS_ECLOCK;
			ps_msg_send_error(sc->conn, m->req_id, rc,
					  "push for clock %" PRIu64 " but slice %u is at version %" PRIu64
					  " (accepting clocks %" PRIu64 "..%" PRIu64 ")",
					  m->clock, r->slice, sl->version, sl->version,
					  sl->version + (uint64_t)cfg->limits.max_clock_ahead - 1);
			goto err_reject;
		}
		/* length, encoding, codec id and finiteness: the store's one check */
		g = (struct ps_grad){ payload + r->offset, r->length, (int)r->codec,
				      !expanded && f->payload_finite };
		rc = ps_store_check(&s->store, sl, &g, why, sizeof(why));
		if (rc) {
			const struct ps_codec_ops *co = ps_codec_get(g.codec);
			ps_msg_send_error(sc->conn, m->req_id, rc,
					  "slice %u (%s): %s; nothing of this push was applied",
					  r->slice, co ? co->name : "?", why);
			goto err_reject;
		}
	}
	/* A worker may end clocks only within the window the shard accepts. */
	if (m->end_clock &&
	    m->clock >= s->finished[sc->rank] + (uint64_t)cfg->limits.max_clock_ahead) {
		rc = PS_ECLOCK;
		ps_msg_send_error(sc->conn, m->req_id, rc,
				  "worker %d ends clock %" PRIu64 " but has finished only %" PRIu64
				  " (limits.max_clock_ahead %d)", sc->rank, m->clock,
				  s->finished[sc->rank], cfg->limits.max_clock_ahead);
		goto err_reject;
	}
	fr = malloc(sizeof(*fr));
	if (!fr) {
		rc = -ENOMEM;
		ps_msg_send_error(sc->conn, m->req_id, rc, "out of memory");
		goto err_reject;
	}
	fr->frame = f;
	fr->expanded = expanded;
	fr->refs = 1;
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *r = m->slices[i];
		struct ps_slot *sl = ps_store_slot(&s->store, r->slice);
		struct ps_grad g = { payload + r->offset, r->length, (int)r->codec, 0 };

		s->c.push_raw[r->codec] += (uint64_t)sl->slice->count * sizeof(float);
		s->c.push_wire[r->codec] += plen ? r->length * f->hdr.payload_len / plen : 0;
		rc = ps_store_offer_grad(&s->store, sl, sc->rank, m->clock, &g, fr);
		if (rc < 0) {
			/* Only a duplicate of an earlier push can get here. */
			s->c.errors++;
			ps_warn("worker %d: slice %u clock %" PRIu64 ": %s", sc->rank, r->slice,
				m->clock, ps_strerror(rc));
		} else if (rc > 0) {
			changed = 1;
		}
	}
	s->c.bytes_in += f->hdr.payload_len;
	ps_frame_ref_put(fr); /* f may be gone after this */
	if (m->end_clock && m->clock + 1 > s->finished[sc->rank]) {
		s->finished[sc->rank] = m->clock + 1;
		ps_store_advance(&s->store); /* a clock ended with no push for some slice */
		changed = 1;
	}
	if (m->seq)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, 0);
	send_ack(sc, m->req_id);
	ps_histo_add(&s->c.push_lat, ps_now_s() - arrived);
	s->c.acks++;
	if (changed && s->waiting)
		answer_pulls(s);
	return;

err_reject:
	s->c.errors++;
	if (m->seq && rc != PS_EDUP)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, rc < 0 ? rc : PS_EPROTO);
	free(expanded);
	ps_frame_release(f);
}

/* ---- checkpoints ---- */

/* Writes the checkpoint now and logs the outcome; 0 or a negative code. */
static int write_checkpoint(struct ps_server *s, const char *why, uint64_t *bytes, double *secs,
			    char *err, size_t errlen)
{
	double t0 = ps_now_s();
	int rc = ps_checkpoint_write(s, s->ckpt_path, bytes, err, errlen);

	*secs = ps_now_s() - t0;
	if (rc)
		ps_error("checkpoint (%s) failed: %s", why, err);
	else
		ps_info("checkpoint (%s): %s, %.1f MiB in %.3f s", why, s->ckpt_path,
			(double)*bytes / 1048576.0, *secs);
	return rc;
}

static void on_ckpt_timer(uv_timer_t *t)
{
	struct ps_server *s = t->data;
	char err[512];
	uint64_t bytes;
	double secs;

	write_checkpoint(s, "periodic", &bytes, &secs, err, sizeof(err));
}

/* The clock a (re)connecting worker continues from (HelloReply.clock). */
static uint64_t resume_clock(const struct ps_server *s)
{
	uint64_t v = UINT64_MAX;

	if (s->cfg->consistency == PS_SYNC)
		for (int k = 0; k < s->store.nslots; k++)
			v = s->store.slots[k].version < v ? s->store.slots[k].version : v;
	if (v == UINT64_MAX)
		v = min_finished(s);
	return v;
}

/* ---- stats ---- */

static void handle_stats(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *m)
{
	Ps__Stats st = PS__STATS__INIT;
	char ckerr[600] = "";   /* referenced by st until it is sent */
	int nw = s->cfg->nworkers;
	Ps__WorkerClock *wc = calloc((size_t)nw, sizeof(*wc));
	Ps__WorkerClock **wp = calloc((size_t)nw, sizeof(*wp));

	if (!wc || !wp) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		goto out_free;
	}
	for (int r = 0; r < nw; r++) {
		ps__worker_clock__init(&wc[r]);
		wc[r].rank = r;
		wc[r].clock = s->finished[r];
		wc[r].connected = s->connected[r] > 0;
		wp[r] = &wc[r];
	}
	if (m->checkpoint) {
		if (!s->ckpt_path[0]) {
			st.checkpoint_status = PS_ESTATE;
			snprintf(ckerr, sizeof(ckerr), "checkpoints are off (no checkpoint.dir)");
		} else {
			st.checkpoint_status = write_checkpoint(s, "on request", &st.checkpoint_bytes,
								&st.checkpoint_seconds, ckerr,
								sizeof(ckerr));
		}
		st.checkpoint_path = s->ckpt_path;
		st.checkpoint_error = ckerr;
	}
	st.req_id = m->req_id;
	st.shard = s->shard;
	st.uptime_s = ps_now_s() - s->started;
	st.pushes = s->c.pushes;
	st.pulls = s->c.pulls;
	st.bytes_in = s->c.bytes_in;
	st.bytes_out = s->c.bytes_out;
	st.applies = s->store.applies;
	st.apply_seconds = s->store.apply_seconds;
	st.apply_bytes = s->store.bytes_applied;
	st.n_push_raw_bytes = PS_CODEC_COUNT;
	st.push_raw_bytes = s->c.push_raw;
	st.n_push_wire_bytes = PS_CODEC_COUNT;
	st.push_wire_bytes = s->c.push_wire;
	st.pull_raw_bytes = s->c.pull_raw;
	st.pull_wire_bytes = s->c.pull_wire;
	st.errors = s->c.errors;
	st.rejected_frames = s->c.rejected_frames;
	st.auth_failures = s->c.auth_failures;
	st.duplicate_pushes = s->c.duplicate_pushes;
	st.connections = (uint32_t)s->nconns;
	st.n_workers = (size_t)nw;
	st.workers = wp;
	st.max_clock_gap = s->c.max_clock_gap;
	st.param_checksum = ps_store_checksum(&s->store);
	st.n_push_latency_log2us = PS_HISTO_BUCKETS;
	st.push_latency_log2us = s->c.push_lat.count;
	st.push_latency_sum_s = s->c.push_lat.sum_s;
	st.n_pull_latency_log2us = PS_HISTO_BUCKETS;
	st.pull_latency_log2us = s->c.pull_lat.count;
	st.pull_latency_sum_s = s->c.pull_lat.sum_s;
	ps_msg_send(sc->conn, PS_MSG_STATS, &st.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
out_free:
	free(wc);
	free(wp);
}

/* ---- handshake ---- */

static void close_after_send(struct ps_conn *c, int status, void *arg)
{
	(void)status;
	(void)arg;
	c->t->ops->close(c, PS_EREFUSED);
}

static void refuse(struct ps_srv_conn *sc, const char *err)
{
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;

	ps_warn("refusing %s: %s", sc->conn->peer, err);
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard = sc->srv->shard;
	r.shard_map_hash = sc->srv->map.hash;
	r.ok = 0;
	r.error = (char *)err;
	sc->state = CONN_REFUSED;
	if (ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &r.base, NULL, 0, PS_SEND_STABLE,
			close_after_send, NULL))
		sc->conn->t->ops->close(sc->conn, PS_EREFUSED);
}

/* The handshake succeeded (and authenticated when required). */
static void accept_client(struct ps_server *s, struct ps_srv_conn *sc)
{
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;

	sc->state = CONN_READY;
	if (sc->rank >= 0) {
		s->connected[sc->rank]++;
		s->gone_since[sc->rank] = 0;
		if (!s->live[sc->rank]) {
			s->live[sc->rank] = 1;
			ps_warn("worker %d rejoined (incarnation %016" PRIx64 ") at clock %" PRIu64,
				sc->rank, sc->incarnation, resume_clock(s));
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
			ps_store_advance(&s->store);
			if (s->waiting)
				answer_pulls(s);
		}
	}
	struct ps_wire_limits lim = {
		.max_frame = s->cfg->limits.max_frame_bytes,
		.max_meta = s->cfg->limits.max_meta_bytes,
	};
	sc->conn->t->ops->set_limits(sc->conn, &lim);
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard = s->shard;
	r.shard_map_hash = s->map.hash;
	r.ok = 1;
	r.error = "";
	r.clock = resume_clock(s);
	r.boot_id = s->boot_id;
	ps_msg_send(sc->conn, PS_MSG_HELLO_REPLY, &r.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
	ps_info("%s %d connected from %s%s", sc->rank >= 0 ? "worker" : "monitor",
		sc->rank >= 0 ? sc->rank : 0, sc->conn->peer,
		!s->cfg->security.auth ? " (not authenticated: security.auth is off)"
		: s->cfg->security.mac ? " (authenticated, frames MACed)"
		: " (authenticated, frames not MACed: security.mac is off)");
}

/* hello is the Hello's metadata as received: the transcript covers it. */
static void handle_hello(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Hello *h,
			 const uint8_t *hello, size_t hello_len)
{
	const struct ps_security_cfg *sec = &s->cfg->security;
	Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN], proof[PS_AUTH_PROOF_LEN];
	char err[400] = "";

	if (ps_hello_check(s->cfg, s->map.hash, s->shard, h, err, sizeof(err))) {
		refuse(sc, err);
		return;
	}
	sc->rank = h->role == PS__ROLE__ROLE_WORKER ? h->rank : -1;
	sc->incarnation = h->incarnation;
	sc->done_clock = h->done_clock;
	if (!sec->auth) {
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
	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(hello, hello_len, nonce, sc->transcript);
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

	if (!ps_auth_proof_ok(s->secret, sc->transcript, 0, a->proof.data, a->proof.len)) {
		ps_warn("refusing %s: authentication failed: its proof does not match (another "
			"secret, or a replayed handshake)", sc->conn->peer);
		return 1; /* counted by on_close */
	}
	if (s->cfg->security.mac) {
		ps_auth_session_keys(s->secret, sc->transcript, 1, &keys);
		sc->conn->t->ops->set_keys(sc->conn, &keys);
		sodium_memzero(&keys, sizeof(keys));
	}
	sodium_memzero(sc->transcript, sizeof(sc->transcript));
	accept_client(s, sc);
	return 0;
}

/* ---- transport callbacks ---- */

static void on_accept(struct ps_transport *t, struct ps_conn *c)
{
	struct ps_server *s = t->data;
	struct ps_srv_conn *sc;

	if (s->nconns >= s->cfg->limits.max_connections) {
		ps_warn("refusing %s: %d connections already (limits.max_connections)", c->peer,
			s->nconns);
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

static void on_frame(struct ps_conn *c, struct ps_frame *f)
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
		handle_push(s, sc, (Ps__Push *)m, f);
		keep = 1;
		break;
	case PS_MSG_PULL:
		handle_pull(s, sc, (Ps__Pull *)m);
		break;
	case PS_MSG_STATS_REQUEST:
		handle_stats(s, sc, (Ps__StatsRequest *)m);
		break;
	case PS_MSG_HEARTBEAT:
		/* answered, so the client can tell that this shard is alive */
		ps_msg_send(sc->conn, PS_MSG_HEARTBEAT, m, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
		break;
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
	/* Counted in rejected_frames by on_close, which sees PS_EPROTO. */
	ps_frame_release(f);
	c->t->ops->close(c, PS_EPROTO);
}

/* A worker has had no connection for limits.drop_timeout_ms: the barrier
 * and the slowest-clock rule stop waiting for it (DESIGN.md §6), so the
 * others go on. What it pushed before it went still counts. It rejoins by
 * connecting again (and continues at the shard's clock, HelloReply.clock). */
static void drop_worker(struct ps_server *s, int rank)
{
	int nlive = 0;

	s->live[rank] = 0;
	for (int r = 0; r < s->cfg->nworkers; r++)
		nlive += s->live[r];
	ps_warn("worker %d left the live set; %d of %d workers remain", rank, nlive,
		s->cfg->nworkers);
	ps_store_advance(&s->store);
	if (s->waiting)
		answer_pulls(s);
}

static void on_close(struct ps_conn *c, int status)
{
	struct ps_srv_conn *sc = c->data;
	struct ps_server *s;
	struct ps_waiting_pull **pp, *p;

	if (!sc)
		return;
	s = sc->srv;
	if (status == PS_EPROTO || status == PS_ETOOBIG || status == PS_EVERSION)
		s->c.rejected_frames++;
	if (status == PS_EAUTH) { /* a wrong proof, or a frame failing its MAC or number */
		s->c.auth_failures++;
		s->c.rejected_frames++;
	}
	for (pp = &s->waiting; (p = *pp);) {
		if (p->sc == sc) {
			*pp = p->next;
			free(p);
		} else {
			pp = &p->next;
		}
	}
	if (sc->rank >= 0 && sc->state == CONN_READY) {
		s->connected[sc->rank]--;
		ps_info("worker %d disconnected (%s)", sc->rank,
			status == PS_ECLOSED || status == 0 ? "closed" : ps_strerror(status));
		if (s->connected[sc->rank] == 0)
			s->gone_since[sc->rank] = ps_now_s(); /* dropped by on_tick if it stays away */
	}
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->conns = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	s->nconns--;
	free(sc);
}

/* Drops connections that did not finish the handshake in time. */
static void on_tick(uv_timer_t *t)
{
	struct ps_server *s = t->data;
	double now = ps_now_s(), limit = s->cfg->limits.handshake_timeout_ms / 1000.0;
	double idle = s->cfg->limits.idle_timeout_ms / 1000.0;

	for (struct ps_srv_conn *sc = s->conns; sc; sc = sc->next) {
		if ((sc->state == CONN_HELLO || sc->state == CONN_AUTH) &&
		    now - sc->accepted > limit) {
			ps_warn("closing connection from %s: handshake not finished within %d ms "
				"(limits.handshake_timeout_ms)", sc->conn->peer,
				s->cfg->limits.handshake_timeout_ms);
			sc->conn->t->ops->close(sc->conn, PS_ETIMEDOUT);
		} else if (sc->state == CONN_READY && idle > 0 && now - sc->last_rx > idle) {
			ps_warn("closing connection from %s: nothing received for %d ms "
				"(limits.idle_timeout_ms)", sc->conn->peer, s->cfg->limits.idle_timeout_ms);
			sc->conn->t->ops->close(sc->conn, PS_ETIMEDOUT);
		} else {
			check_backlog(s, sc);
		}
	}
	double drop = s->cfg->limits.drop_timeout_ms ? s->cfg->limits.drop_timeout_ms / 1000.0 : idle;
	for (int r = 0; drop > 0 && r < s->cfg->nworkers; r++)
		if (s->live[r] && !s->connected[r] && s->gone_since[r] > 0 &&
		    now - s->gone_since[r] > drop)
			drop_worker(s, r);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct ps_server *s = h->data;

	ps_info("received %s, stopping", signum == SIGINT ? "SIGINT" : "SIGTERM");
	if (s->ckpt_path[0] && !s->stopping) {
		char err[512];
		uint64_t bytes;
		double secs;

		if (write_checkpoint(s, signum == SIGINT ? "SIGINT" : "SIGTERM", &bytes, &secs, err,
				     sizeof(err)))
			s->exit_status = 1;
	}
	ps_server_stop(s);
}

int ps_server_init(struct ps_server *s, const struct ps_config *cfg, int shard, uv_loop_t *loop)
{
	const struct ps_transport_ops *ops;
	struct ps_transport_cbs cbs = {
		.on_accept = on_accept, .on_frame = on_frame, .on_close = on_close,
	};
	struct ps_wire_limits hs = {
		.max_frame = PS_WIRE_HANDSHAKE_MAX, .max_meta = PS_WIRE_HANDSHAKE_MAX,
	};
	char err[1200];
	int rc;

	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->shard = shard;
	s->loop = loop;
	s->started = ps_now_s();
	if (shard < 0 || shard >= cfg->nshards) {
		ps_error("shard %d does not exist: the config names shards 0..%d", shard,
			 cfg->nshards - 1);
		return -EINVAL;
	}
	ops = ps_transport_for(cfg, err, sizeof(err), &rc);
	if (!ops) {
		ps_error("%s", err);
		return rc;
	}
	rc = ps_shardmap_init(&s->map, cfg);
	if (rc)
		return rc;
	rc = ps_store_init(&s->store, cfg, &s->map, shard);
	if (rc)
		goto err_free_map;
	s->finished = calloc((size_t)cfg->nworkers, sizeof(*s->finished));
	s->connected = calloc((size_t)cfg->nworkers, sizeof(*s->connected));
	s->live = malloc((size_t)cfg->nworkers);
	s->gone_since = calloc((size_t)cfg->nworkers, sizeof(*s->gone_since));
	s->dedup = calloc((size_t)cfg->nworkers, sizeof(*s->dedup));
	s->seen = calloc((size_t)(s->store.nslots ? s->store.nslots : 1), sizeof(*s->seen));
	ps_auth_random((uint8_t *)&s->boot_id, sizeof(s->boot_id));
	if (!s->finished || !s->connected || !s->live || !s->gone_since || !s->dedup || !s->seen) {
		rc = -ENOMEM;
		goto err_free_store;
	}
	/* every rank is waited for until it has been seen to leave */
	memset(s->live, 1, (size_t)cfg->nworkers);
	s->store.live = s->live;
	s->store.finished = s->finished;
	if (cfg->security.auth) {
		rc = ps_auth_load_secret(cfg, s->secret, err, sizeof(err));
		if (rc) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		}
	} else {
		ps_warn("security.auth is false: any process that reaches %s:%d may push and pull",
			cfg->shards[shard].host, cfg->shards[shard].port);
	}
	if (cfg->checkpoint.dir[0]) {
		ps_checkpoint_path(cfg->checkpoint.dir, shard, s->ckpt_path, sizeof(s->ckpt_path));
		rc = ps_checkpoint_load(s, s->ckpt_path, err, sizeof(err));
		if (rc == -ENOENT) {
			ps_info("no checkpoint at %s: starting from the seed", s->ckpt_path);
		} else if (rc) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		} else {
			ps_info("resumed from %s: clock %" PRIu64, s->ckpt_path, resume_clock(s));
		}
	}
	rc = ops->create(loop, &cbs, &hs, s, &s->transport);
	if (rc)
		goto err_free_store;
	rc = ops->listen(s->transport, cfg->shards[shard].host, cfg->shards[shard].port);
	if (rc) {
		ps_error("cannot listen on %s:%d: %s", cfg->shards[shard].host,
			 cfg->shards[shard].port, ps_strerror(rc));
		goto err_destroy_transport;
	}
	if (cfg->stats.http[0]) {
		/* shard k serves its metrics on the configured port + k (the
		 * loader checked the address) */
		struct ps_endpoint ep = { .port = 0 };
		const char *why;

		if (ps_endpoint_parse(cfg->stats.http, &ep, &why) || ep.port + shard > 65535) {
			ps_error("stats.http '%s': shard %d would serve on port %d, outside 1..65535",
				 cfg->stats.http, shard, ep.port + shard);
			rc = -EINVAL;
			goto err_destroy_transport;
		}
		rc = ps_metrics_http_start(s, ep.host, ep.port + shard, &s->http);
		if (rc)
			goto err_destroy_transport;
	}
	uv_timer_init(loop, &s->ckpt_timer);
	s->ckpt_timer.data = s;
	if (s->ckpt_path[0] && cfg->checkpoint.every_s > 0)
		uv_timer_start(&s->ckpt_timer, on_ckpt_timer, (uint64_t)cfg->checkpoint.every_s * 1000,
			       (uint64_t)cfg->checkpoint.every_s * 1000);
	uv_timer_init(loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, on_tick, 200, 200);
	uv_signal_init(loop, &s->sigint);
	uv_signal_init(loop, &s->sigterm);
	s->sigint.data = s->sigterm.data = s;
	uv_signal_start(&s->sigint, on_signal, SIGINT);
	uv_signal_start(&s->sigterm, on_signal, SIGTERM);
	ps_info("shard %d of %d listening on %s:%d: %d slices, %.1f MiB, %s, %s, map %016" PRIx64,
		shard, cfg->nshards, cfg->shards[shard].host, cfg->shards[shard].port,
		s->store.nslots, (double)s->map.shard_bytes[shard] / 1048576.0,
		cfg->consistency == PS_SYNC ? "sync" : "async", ps_optim_name(cfg->optim.kind),
		s->map.hash);
	return 0;

err_destroy_transport:
	s->transport->ops->destroy(s->transport);
	s->transport = NULL;
	uv_run(loop, UV_RUN_NOWAIT);
err_free_store:
	free(s->finished);
	free(s->connected);
	free(s->live);
	free(s->gone_since);
	free(s->dedup);
	free(s->seen);
	ps_store_free(&s->store);
err_free_map:
	ps_shardmap_free(&s->map);
	return rc;
}

void ps_server_stop(struct ps_server *s)
{
	if (s->stopping)
		return;
	s->stopping = 1;
	uv_close((uv_handle_t *)&s->ckpt_timer, NULL);
	ps_metrics_http_stop(s->http);
	s->http = NULL;
	uv_close((uv_handle_t *)&s->tick, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	s->transport->ops->destroy(s->transport);
}

void ps_server_free(struct ps_server *s)
{
	struct ps_waiting_pull *p;

	while ((p = s->waiting)) {
		s->waiting = p->next;
		free(p);
	}
	free(s->finished);
	free(s->connected);
	free(s->live);
	free(s->gone_since);
	free(s->dedup);
	free(s->seen);
	ps_store_free(&s->store);
	ps_shardmap_free(&s->map);
}
