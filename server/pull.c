/* pull.c - a shard's pull requests: when one may be answered (the version
 * it asks for, and in async mode the staleness bound against the slowest
 * live worker), the reply (raw or fp16 weights, sent volatile since they
 * change with the next apply), the pulls held until their condition holds,
 * and closing a peer that does not read its replies.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "codec.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "server_int.h"

static int pull_ready(const struct ps_server *s, const struct ps_waiting_pull *p)
{
	for (uint32_t i = 0; i < p->n; i++)
		if (p->slots[i]->version < p->min_version)
			return 0;
	if (s->cfg->consistency == PS_ASYNC && p->clock > (uint64_t)s->cfg->staleness &&
	    ps__srv_min_finished(s) < p->clock - (uint64_t)s->cfg->staleness)
		return 0;
	if (p->clock > ps__members_pull_cap(s, p->sc->rank))
		return 0; /* a worker joins from the held clock plus one, or leaves after
			     the frozen one */
	return 1;
}

static void send_pull_reply(struct ps_server *s, struct ps_waiting_pull *p)
{
	Ps__SliceRef refs_small[16], *refs = refs_small;
	Ps__SliceRef *ptrs_small[16], **ptrs = ptrs_small;
	struct ps_iov iov_small[16], *iov = iov_small;
	Ps__PullReply r = PS__PULL_REPLY__INIT;
	uint64_t off = 0, fin = ps__srv_min_finished(s);
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
	/* sync: the members of the clock the puller starts next */
	if (ps__members_fill_pull(s, s->cfg->consistency == PS_SYNC ? p->min_version : p->clock,
				  &r)) {
		ps_msg_send_error(p->sc->conn, p->req_id, -ENOMEM, "out of memory");
		goto out_free;
	}
	if (s->cfg->consistency == PS_ASYNC)
		ps__members_told(s, p->clock); /* it computes that clock now */
	/* The weights change with the next apply: volatile send. */
	rc = ps_msg_send(p->sc->conn, PS_MSG_PULL_REPLY, &r.base, iov, (int)p->n, PS_SEND_VOLATILE,
			 NULL, NULL);
	if (rc)
		ps_debug("pull reply to %s not sent: %s", p->sc->conn->peer, ps_strerror(rc));
	ps_histo_add(&s->c.pull_lat, ps_now_s() - p->arrived);
	if (p->clock > fin && p->clock - fin > s->c.max_clock_gap)
		s->c.max_clock_gap = p->clock - fin;
	s->c.bytes_out += off;
	free(r.members);
out_free:
	free(enc);
	if (refs != refs_small) {
		free(refs);
		free(ptrs);
		free(iov);
	}
}

/* Drops a peer that does not read what it asked for. Backpressure (the
 * transport stops reading a peer past limits.max_write_queue_bytes) keeps
 * a queue within that plus one reply; what can still grow it is pulls
 * parked earlier and released now, so a queue past the limit plus one
 * frame closes the connection. */
int ps__srv_check_backlog(struct ps_server *s, struct ps_srv_conn *sc)
{
	size_t q = sc->conn->t->ops->queued_bytes(sc->conn);

	if (q <= s->cfg->limits.max_write_queue + s->cfg->limits.max_frame_bytes)
		return 0;
	ps_warn("closing connection from %s: %zu reply bytes queued and not read "
		"(limits.max_write_queue_bytes is %" PRIu64 ", plus one frame of at most "
		"limits.max_frame_bytes)", sc->conn->peer, q, s->cfg->limits.max_write_queue);
	sc->conn->t->ops->close(sc->conn, PS_ETOOBIG);
	return 1;
}

/* Appends to buf (len bytes, *off used so far) like snprintf, never past
 * its end. */
static void held_add(char *buf, size_t len, size_t *off, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void held_add(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	*off = n < 0 ? len : *off + (size_t)n;
}

void ps__srv_pull_held_why(const struct ps_server *s, const struct ps_waiting_pull *p,
			   char *buf, size_t len)
{
	const struct ps_config *cfg = s->cfg;
	uint64_t need; /* clocks every live worker must have finished */
	int nmiss = 0, shown = 0;
	size_t off = 0;
	double now = ps_now_s();

	if (cfg->consistency == PS_SYNC)
		need = p->min_version;
	else
		need = p->clock > (uint64_t)cfg->staleness ? p->clock - (uint64_t)cfg->staleness : 0;
	for (int r = 0; r < cfg->nworkers; r++)
		nmiss += s->live[r] && s->finished[r] < need;
	buf[0] = '\0';
	if (nmiss == 0 && p->clock > ps__members_pull_cap(s, p->sc->rank)) {
		held_add(buf, len, &off, "waiting for a worker's join or leave, which holds clock %"
			 PRIu64, ps__members_pull_cap(s, p->sc->rank));
		return;
	}
	if (nmiss == 0 || need == 0) {
		held_add(buf, len, &off, "waiting for version %" PRIu64 " of its slices",
			 p->min_version);
		return;
	}
	held_add(buf, len, &off, "waiting for workers ");
	for (int r = 0; r < cfg->nworkers && shown < 8; r++)
		if (s->live[r] && s->finished[r] < need)
			held_add(buf, len, &off, "%s%d", shown++ ? ", " : "", r);
	if (nmiss > shown)
		held_add(buf, len, &off, " and %d more", nmiss - shown);
	held_add(buf, len, &off, " of %d at clock %" PRIu64 " (", cfg->nworkers, need - 1);
	shown = 0;
	for (int r = 0; r < cfg->nworkers && shown < 4; r++) {
		if (!s->live[r] || s->finished[r] >= need)
			continue;
		held_add(buf, len, &off, "%s", shown++ ? "; " : "");
		if (s->connected[r])
			held_add(buf, len, &off, "worker %d connected, at clock %" PRIu64, r,
				 s->finished[r]);
		else if (s->gone_since[r] > 0)
			held_add(buf, len, &off, "worker %d disconnected %.0f s ago", r,
				 now - s->gone_since[r]);
		else
			held_add(buf, len, &off, "worker %d never connected", r);
	}
	held_add(buf, len, &off, "%s)", nmiss > shown ? "; ..." : "");
	if (off >= len && len > 4)
		memcpy(buf + len - 4, "...", 4);
}

/* Answers every waiting pull whose condition now holds. */
void ps__srv_answer_pulls(struct ps_server *s)
{
	struct ps_waiting_pull **pp = &s->waiting, *p;

	while ((p = *pp)) {
		if (pull_ready(s, p)) {
			*pp = p->next;
			p->sc->nwaiting--;
			send_pull_reply(s, p);
			ps__srv_check_backlog(s, p->sc);
			free(p);
		} else {
			pp = &p->next;
		}
	}
}

void ps__srv_handle_pull(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Pull *m)
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
	p->warned = 0;
	p->codec = (int)m->codec;
	if (m->codec != PS_CODEC_NONE && m->codec != PS_CODEC_FP16) {
		s->c.errors++;
		ps_msg_send_error(sc->conn, m->req_id, PS_EPROTO,
				  "pull replies can be raw (0) or fp16 (1), not codec %u", m->codec);
		free(p);
		return;
	}
	p->n = (uint32_t)m->n_slices;
	ps__srv_seen_reset(s);
	for (size_t i = 0; i < m->n_slices; i++) {
		p->slots[i] = ps_store_slot(&s->store, m->slices[i]);
		if (!p->slots[i]) {
			s->c.errors++;
			ps_msg_send_error(sc->conn, m->req_id, PS_ENOTENSOR,
					  "slice %u is not owned by shard %d", m->slices[i], s->shard);
			free(p);
			return;
		}
		if (ps__srv_seen_twice(s, p->slots[i])) {
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
	if (sc->nwaiting >= s->cfg->limits.max_waiting_pulls) {
		/* each push walks the waiting list: a peer parking pulls without
		 * bound would slow every push and hold memory */
		s->c.errors++;
		ps_msg_send_error(sc->conn, m->req_id, PS_ETOOBIG,
				  "%d pulls of this connection wait for their clock already "
				  "(limits.max_waiting_pulls)", sc->nwaiting);
		free(p);
		return;
	}
	sc->nwaiting++;
	p->next = s->waiting;
	s->waiting = p;
}
