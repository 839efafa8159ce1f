/* push.c - a shard's push requests: a resent push is answered as the
 * first time without applying it again (dedup.h); an LZ4 payload is
 * expanded; the groups' learning rates (finite, >= 0) and every slice
 * (owner, offsets, clock window, codec, finiteness) are checked before any
 * is offered to the store, so a push is applied
 * whole or not at all; then the ack, and the pulls the push completed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "codec.h"
#include "msg.h"
#include "optim_group.h"
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

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

/* Sync: slice sl applied clock m->clock without this worker (it was out
 * of the live set then, and rejoined at a clock some slices had passed:
 * the HelloReply's clock is the lowest of the slices' versions). The
 * worker has not ended that clock here, so this is no resend: its part for
 * sl is set aside, the rest of the push applies. */
static int late_slice(const struct ps_server *s, const struct ps_srv_conn *sc, const Ps__Push *m,
		      const struct ps_slot *sl)
{
	return s->cfg->consistency == PS_SYNC && m->clock < sl->version &&
	       m->clock >= s->finished[sc->rank];
}

/* The learning rate m gives sl's optimizer group, if it gives one. */
static void group_lr(const struct ps_config *cfg, const Ps__Push *m, const struct ps_slot *sl,
		     struct ps_grad *g)
{
	int grp = cfg->ngroups ? cfg->tensors[sl->slice->tensor].group : -1;

	if (grp >= 0 && (size_t)grp < m->n_group_lr) {
		g->has_lr = 1;
		g->lr = m->group_lr[grp];
	}
}

void ps__srv_handle_push(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Push *m,
			 struct ps_frame *f)
{
	const struct ps_config *cfg = s->cfg;
	struct ps_frame_ref *fr;
	uint8_t *payload = f->payload, *expanded = NULL;
	uint64_t plen = f->hdr.payload_len;
	char why[256];
	int changed = 0, rc, nlate = 0;
	double arrived = ps_now_s();

	s->c.pushes++;
	if (sc->rank >= 0 && ps__srv_stop_refuse(s, sc, m)) {
		ps_frame_release(f); /* retryable: not marked in the dedup window */
		return;
	}
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
			else if (!s->repl || !ps__repl_resent(s, sc, m->req_id, sc->rank,
								sc->incarnation, m->seq))
				send_ack(sc, m->req_id); /* else acked once its batch is confirmed */
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
	if (m->n_group_lr && (int)m->n_group_lr != cfg->ngroups) {
		rc = PS_EPROTO;
		ps_msg_send_error(sc->conn, m->req_id, rc, "push carries %zu group learning rates, "
				  "the declared tensors have %d optimizer groups", m->n_group_lr,
				  cfg->ngroups);
		goto err_reject;
	}
	for (size_t k = 0; k < m->n_group_lr; k++) {
		rc = ps_optim_group_lr_check((int)k, m->group_lr[k], why, sizeof(why));
		if (rc) {
			ps_msg_send_error(sc->conn, m->req_id, rc, "push: %s; nothing of this push was "
					  "applied", why);
			goto err_reject;
		}
	}
	ps__srv_seen_reset(s);
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
		if (ps__srv_seen_twice(s, sl)) {
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
		if (late_slice(s, sc, m, sl))
			continue; /* passed over below */
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
				      !expanded && f->payload_finite, 0, 0 };
		group_lr(cfg, m, sl, &g);
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
	if (m->clock + 1 > s->top_clock)
		s->top_clock = m->clock + 1; /* a re-shard's stop must lie above it (stop.c) */
	fr->frame = f;
	fr->expanded = expanded;
	fr->refs = 1;
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *r = m->slices[i];
		struct ps_slot *sl = ps_store_slot(&s->store, r->slice);
		struct ps_grad g = { payload + r->offset, r->length, (int)r->codec, 0, 0, 0 };

		group_lr(cfg, m, sl, &g);

		if (late_slice(s, sc, m, sl)) {
			nlate++;
			continue;
		}
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
		ps__rows_advance(s);
		changed = 1;
	}
	if (m->leave)
		ps__members_leave(s, sc->rank, m->clock + 1); /* checked: it ends the clock */
	if (nlate)
		ps_debug("worker %d: clock %" PRIu64 ": %d slice(s) had gone on without it (it "
			 "rejoined after they applied that clock): their part set aside", sc->rank,
			 m->clock, nlate);
	if (m->seq)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, 0);
	if (s->repl && ps__repl_push_accepted(s, sc, m->req_id, m, sc->rank, sc->incarnation)) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
	} else if (!s->repl) {
		send_ack(sc, m->req_id);
		ps_histo_add(&s->c.push_lat, ps_now_s() - arrived);
		s->c.acks++;
	}
	if (changed && s->waiting)
		ps__srv_answer_pulls(s);
	return;

err_reject:
	s->c.errors++;
	if (m->seq && rc != PS_EDUP)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, rc < 0 ? rc : PS_EPROTO);
	free(expanded);
	ps_frame_release(f);
}
