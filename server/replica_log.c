/* replica_log.c - what the primary forwards to its backup, and the acks
 * that wait for it (replica.h).
 *
 * The store tells of every change it makes (store.h on_apply/on_version);
 * the changes of one loop turn are gathered into one batch with the next
 * number (lsn) and sent to the backup when the turn ends (a uv_check
 * handle), or sooner when the batch grows past half a frame. A push's ack
 * waits in the pending list until the push is committed (async: at once;
 * sync: once every slice it named is past its clock, i.e. the clock's sum
 * was applied) -- then its (worker, incarnation, seq) and its ended clock
 * go into the batch being sent -- and until the backup has confirmed that
 * batch. A primary without a backup acks what is committed at once. The
 * workers' membership (members.c) goes whole into the first batch after it
 * changed, and the answer to a join step waits in the same list (as a
 * packed reply) for the batch that holds the state it tells of.
 *
 * The backup side applies batches and the snapshot (state transfer) the
 * same way, checking every number against what it holds, so a batch that
 * does not follow is refused and the state transferred again. As a
 * checkpoint's are when it is loaded, versions, step counts, ended clocks,
 * batch numbers and epochs must be below 2^53 and every float finite;
 * a batch is checked whole before any of it is applied.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "finite.h"
#include "msg.h"
#include "optim_group.h"
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"
#include "table_ckpt.h"

struct ps_repl_pending {
	struct ps_srv_conn *sc;     /* NULL once the connection closed */
	uint64_t req_id;
	int rank;
	uint64_t incarnation, seq;
	uint64_t clock;
	int end_clock;
	uint64_t lsn;               /* the batch that holds it; 0 = not committed yet */
	double arrived;
	int table;                  /* a sync row push: its table, committed once the
				       table applied clock; else -1 */
	int not_push;               /* a declaration's ack: not counted as a push's */
	uint8_t *reply;             /* a packed reply to send instead of an ack (a join
				       step's answer), reply_len bytes of frame type
				       reply_type; NULL for a push */
	uint32_t reply_len;
	uint8_t reply_type;
	uint32_t nslots;
	struct ps_repl_pending *next;
	int32_t slots[];            /* store slot indices the push named */
};

/* ---- gathering the batch (primary) ---- */

int ps__repl_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	q = realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}


/* A record for slot sl: its version and steps now, with the gradient the
 * optimizer took (g, or NULL for a version passed over); with rank >= 0 a
 * worker's gradient for clock (every_push), kept by the backup. */
static void note(struct ps_server *s, struct ps_slot *sl, const float *g, int rank,
		 uint64_t clock, const struct ps_optim_cfg *oc)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_batch *b = &r->b;
	size_t bytes;
	Ps__ReplSlot x = PS__REPL_SLOT__INIT;

	if (r->state != PS_REPL_PRIMARY)
		return;
	if (g && rank < 0 && s->cfg->repl_every_push && s->cfg->consistency == PS_SYNC) {
		x.sum_staged = 1; /* the backup sums what it was sent */
		g = NULL;
	}
	bytes = g ? (size_t)sl->slice->count * sizeof(float) : 0;
	/* a frame holds half the frame limit of gradients at most */
	if ((b->plen || b->rplen) && b->plen + b->rplen + bytes > s->cfg->limits.max_frame_bytes / 2)
		ps__repl_send_batch(s, 0);
	if (ps__repl_grow((void **)&b->slots, &b->cap, b->nslots + 1, sizeof(*b->slots)) ||
	    ps__repl_grow((void **)&b->payload, &b->pcap, b->plen + bytes, 1)) {
		/* the backup can no longer follow: closing the link makes this
		 * primary step down (ps__repl_link_closed); the pair forms again */
		ps_error("replication: out of memory gathering a batch; stepping down");
		if (r->link)
			r->link->conn->t->ops->close(r->link->conn, -ENOMEM);
		return;
	}
	x.slice = sl->slice->id;
	x.version = rank >= 0 ? clock : sl->version;
	x.steps = sl->steps;
	x.staged = rank >= 0;
	x.rank = rank;
	if (oc && oc->lr != sl->ocfg->lr) {
		/* the push gave the slot's group this rate (Push.group_lr) */
		x.has_lr = 1;
		x.lr = oc->lr;
	}
	if (g) {
		x.has_grad = 1;
		x.offset = b->plen;
		x.length = bytes;
		memcpy(b->payload + b->plen, g, bytes);
		b->plen += bytes;
	}
	b->slots[b->nslots++] = x;
}

static void on_apply(void *arg, struct ps_slot *sl, const float *g,
		     const struct ps_optim_cfg *oc)
{
	note(arg, sl, g, -1, 0, oc);
}

static void on_version(void *arg, struct ps_slot *sl)
{
	note(arg, sl, NULL, -1, 0, NULL);
}

static void on_offer(void *arg, struct ps_slot *sl, int rank, uint64_t clock, const float *g)
{
	note(arg, sl, g, rank, clock, NULL);
}

void ps__repl_log_init_hooks(struct ps_server *s)
{
	s->store.on_apply = on_apply;
	s->store.on_version = on_version;
	if (s->cfg->repl_every_push && s->cfg->consistency == PS_SYNC)
		s->store.on_offer = on_offer;
	s->store.hook_arg = s;
}

/* ---- every_push: the workers' gradients the backup keeps until the sum ---- */

struct ps_repl_staged {
	struct ps_slot *sl;
	uint64_t clock;
	int rank;
	struct ps_repl_staged *next;
	float g[];
};

void ps__repl_staged_free(struct ps_server *s, const struct ps_slot *sl, uint64_t below)
{
	struct ps_repl_staged **pp = &s->repl->staged, *x;

	while ((x = *pp)) {
		if (!sl || (x->sl == sl && x->clock < below)) {
			*pp = x->next;
			free(x);
		} else {
			pp = &x->next;
		}
	}
}

static int stage(struct ps_server *s, struct ps_slot *sl, const Ps__ReplSlot *x,
		 const uint8_t *data)
{
	struct ps_repl_staged *st;

	if (!x->has_grad || x->rank < 0 || x->rank >= s->cfg->nworkers || x->version < sl->version)
		return PS_EPROTO;
	st = malloc(sizeof(*st) + x->length);
	if (!st)
		return -ENOMEM;
	st->sl = sl;
	st->clock = x->version;
	st->rank = x->rank;
	memcpy(st->g, data, x->length);
	st->next = s->repl->staged;
	s->repl->staged = st;
	return 0;
}

/* The rank-ordered sum (optimizer.average: the mean) of the gradients kept
 * for sl at clock, into s->store.scratch, as the primary's store took it;
 * NULL when none. */
static const float *staged_sum(struct ps_server *s, struct ps_slot *sl, uint64_t clock)
{
	size_t n = (size_t)sl->slice->count;
	float *acc = s->store.scratch;
	int have = 0;

	for (int r = 0; r < s->cfg->nworkers; r++)
		for (struct ps_repl_staged *x = s->repl->staged; x; x = x->next)
			if (x->sl == sl && x->clock == clock && x->rank == r) {
				if (!have++)
					memcpy(acc, x->g, n * sizeof(float));
				else
					for (size_t i = 0; i < n; i++)
						acc[i] += x->g[i];
				break;
			}
	if (have > 1 && sl->ocfg->average) {
		/* optimizer.average: the mean, as the primary's store took it */
		const float k = (float)have;
		for (size_t i = 0; i < n; i++)
			acc[i] /= k;
	}
	return have ? acc : NULL;
}

/* Sends what is gathered as batch lsn + 1 (with_state: the ended clocks
 * and the marks too) to the backup, if there is one; the batch is numbered
 * either way, so lsn counts what this primary applied. */
void ps__repl_send_batch(struct ps_server *s, int with_state)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_batch *b = &r->b;
	Ps__ReplBatch m = PS__REPL_BATCH__INIT;
	Ps__ReplSlot **sp = NULL;
	Ps__ReplMark **mp = NULL;
	Ps__ReplRows **rp = NULL;
	Ps__ReplMembers mem;
	int with_members = 0;
	struct ps_iov iov[3];
	int niov = 0;

	if (b->plen)
		iov[niov++] = (struct ps_iov){ b->payload, b->plen };
	if (b->rplen)
		iov[niov++] = (struct ps_iov){ b->rpayload, b->rplen };
	if (b->decl && b->decl_len)
		iov[niov++] = (struct ps_iov){ b->decl_values, b->decl_len };
	r->lsn++;
	/* the membership as it stands after this batch's changes, once per
	 * change (also without a backup: a new one gets it in its snapshot) */
	if (ps__members_repl_dirty(s)) {
		if (ps__members_repl_fill(s, &mem) == 0)
			with_members = 1;
		else if (r->link)
			r->link->conn->t->ops->close(r->link->conn, -ENOMEM);
	}
	if (r->link) {
		sp = malloc(sizeof(*sp) * (b->nslots + 1));
		mp = malloc(sizeof(*mp) * (b->nmarks + 1));
		rp = malloc(sizeof(*rp) * (b->nrows + 1));
	}
	if (r->link && (!sp || !mp || !rp)) {
		/* the batch cannot be forwarded: closing the link (not by the
		 * peer) makes this primary step down rather than acknowledge
		 * what its backup lacks (ps__repl_link_closed) */
		r->link->conn->t->ops->close(r->link->conn, -ENOMEM);
	} else if (r->link) {
		for (size_t i = 0; i < b->nslots; i++)
			sp[i] = &b->slots[i];
		for (size_t i = 0; i < b->nmarks; i++)
			mp[i] = &b->marks[i];
		for (size_t i = 0; i < b->nrows; i++) {
			/* the rows' records follow the slices' gradients */
			b->rows[i].offset += b->plen;
			rp[i] = &b->rows[i];
		}
		m.n_rows = b->nrows;
		m.rows = rp;
		m.lsn = r->lsn;
		m.epoch = r->epoch;
		m.n_slots = b->nslots;
		m.slots = sp;
		m.n_marks = b->nmarks;
		m.marks = mp;
		ps__repl_decl_fill(b, &m, b->plen + b->rplen);
		if (with_state || with_members) {
			/* a hold or a join raised the joiner's ended clock */
			m.n_finished = (size_t)s->cfg->nworkers;
			m.finished = r->cfinished;
		}
		if (with_members)
			m.members = &mem;
		if (ps_msg_send(r->link->conn, PS_MSG_REPL_BATCH, &m.base, iov, niov,
				PS_SEND_VOLATILE, NULL, NULL)) {
			r->link->conn->t->ops->close(r->link->conn, PS_ECLOSED);
		} else {
			r->batches++;
			r->bytes += b->plen + b->rplen + (b->decl ? b->decl_len : 0);
		}
		r->last_sent = ps_now_s();
	}
	if (with_members)
		ps__members_repl_fill_free(&mem);
	free(sp);
	free(mp);
	free(rp);
	b->nslots = 0;
	b->plen = 0;
	b->nmarks = 0;
	b->nrows = 0;
	b->rplen = 0;
	ps__repl_decl_clear(b);
}

/* ---- pending acks ---- */

int ps__repl_push_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			   const Ps__Push *m, int rank, uint64_t incarnation)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_pending *p;
	uint32_t n = s->cfg->consistency == PS_SYNC ? (uint32_t)m->n_slices : 0;

	p = calloc(1, sizeof(*p) + sizeof(p->slots[0]) * n);
	if (!p)
		return -ENOMEM;
	p->sc = sc;
	p->req_id = req_id;
	p->rank = rank;
	p->incarnation = incarnation;
	p->seq = m->seq;
	p->clock = m->clock;
	p->end_clock = m->end_clock;
	p->arrived = ps_now_s();
	p->table = -1;
	p->nslots = n;
	for (uint32_t i = 0; i < n; i++)
		p->slots[i] = s->store.slot_of[m->slices[i]->slice]; /* checked by push.c */
	*r->pending_tail = p;
	r->pending_tail = &p->next;
	return 0;
}

int ps__repl_resent(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id, int rank,
		    uint64_t incarnation, uint64_t seq)
{
	for (struct ps_repl_pending *p = s->repl->pending; p; p = p->next)
		if (p->rank == rank && p->incarnation == incarnation && p->seq == seq) {
			p->sc = sc;
			p->req_id = req_id;
			return 1;
		}
	return 0;
}

void ps__repl_conn_gone(struct ps_server *s, struct ps_srv_conn *sc)
{
	if (!s->repl)
		return;
	for (struct ps_repl_pending *p = s->repl->pending; p; p = p->next)
		if (p->sc == sc)
			p->sc = NULL;
}

int ps__repl_reply_later(struct ps_server *s, struct ps_srv_conn *sc, unsigned type,
			 const ProtobufCMessage *m)
{
	struct ps_repl *r = s->repl;
	size_t len = protobuf_c_message_get_packed_size(m);
	struct ps_repl_pending *p = calloc(1, sizeof(*p));

	if (!p || len > UINT32_MAX || !(p->reply = malloc(len ? len : 1))) {
		free(p);
		return -ENOMEM;
	}
	protobuf_c_message_pack(m, p->reply);
	p->reply_len = (uint32_t)len;
	p->reply_type = (uint8_t)type;
	p->sc = sc;
	p->rank = sc->rank;
	p->arrived = ps_now_s();
	p->table = -1;
	*r->pending_tail = p;
	r->pending_tail = &p->next;
	return 0;
}

/* A pending ack without slots (a row push or a declaration), queued. */
static struct ps_repl_pending *pending_plain(struct ps_server *s, struct ps_srv_conn *sc,
					     uint64_t req_id, int rank, uint64_t incarnation,
					     uint64_t seq, uint64_t clock, int t)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_pending *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->sc = sc;
	p->req_id = req_id;
	p->rank = rank;
	p->incarnation = incarnation;
	p->seq = seq;
	p->clock = clock;
	p->arrived = ps_now_s();
	p->table = t;
	*r->pending_tail = p;
	r->pending_tail = &p->next;
	return p;
}

int ps__repl_rows_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			   int rank, uint64_t incarnation, uint64_t seq, uint64_t clock, int t)
{
	return pending_plain(s, sc, req_id, rank, incarnation, seq, clock, t) ? 0 : -ENOMEM;
}

int ps__repl_decl_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id)
{
	struct ps_repl_pending *p = pending_plain(s, sc, req_id, sc->rank, sc->incarnation, 0, 0,
						  -1);

	if (!p)
		return -ENOMEM;
	p->not_push = 1;
	return 0;
}

static int committed(const struct ps_server *s, const struct ps_repl_pending *p)
{
	if (p->table >= 0)
		return s->rows->t[p->table].tb.version > p->clock;
	for (uint32_t i = 0; i < p->nslots; i++)
		if (s->store.slots[p->slots[i]].version <= p->clock)
			return 0;
	return 1;
}

/* p is committed in batch lsn: what the backup must know of it. */
static int commit(struct ps_server *s, struct ps_repl_pending *p, uint64_t lsn)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_batch *b = &r->b;

	if (p->seq) {
		if (ps__repl_grow((void **)&b->marks, &b->mcap, b->nmarks + 1, sizeof(*b->marks)))
			return -ENOMEM;
		Ps__ReplMark x = PS__REPL_MARK__INIT;
		x.rank = p->rank;
		x.incarnation = p->incarnation;
		x.seq = p->seq;
		b->marks[b->nmarks++] = x;
		ps_dedup_incarnation(&r->cdedup[p->rank], p->incarnation);
		ps_dedup_mark(&r->cdedup[p->rank], p->seq, 0);
	}
	if (p->end_clock && p->clock + 1 > r->cfinished[p->rank])
		r->cfinished[p->rank] = p->clock + 1;
	p->lsn = lsn;
	return 0;
}

void ps__repl_note_finished(struct ps_server *s, int rank)
{
	struct ps_repl *r = s->repl;

	if (r && s->finished[rank] > r->cfinished[rank])
		r->cfinished[rank] = s->finished[rank];
}

/* Commits what is committed and sends the batch gathered (the flush
 * without the release). */
static void gather_send(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	int commits = 0;

	for (struct ps_repl_pending *p = r->pending; p; p = p->next)
		if (!p->lsn && committed(s, p)) {
			if (commit(s, p, r->lsn + 1)) {
				ps_error("replication: out of memory; acks wait for the next batch");
				break;
			}
			commits++;
		}
	if (r->b.nslots || r->b.nmarks || r->b.nrows || r->b.decl || r->b.decl_tables || commits ||
	    ps__members_repl_dirty(s))
		ps__repl_send_batch(s, 1);
}

void ps__repl_flush(struct ps_server *s)
{
	struct ps_repl *r = s->repl;

	if (!r || r->state != PS_REPL_PRIMARY)
		return;
	gather_send(s);
	ps__repl_release(s);
}

void ps__repl_release(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_pending **pp = &r->pending, *p;
	double now = ps_now_s();

	while ((p = *pp)) {
		if (!p->lsn || (r->link && p->lsn > r->acked)) {
			pp = &p->next;
			continue;
		}
		if (p->sc && p->reply) {
			p->sc->conn->t->ops->send(p->sc->conn, p->reply_type, p->reply,
						  p->reply_len, NULL, 0, PS_SEND_VOLATILE, NULL,
						  NULL);
		} else if (p->sc) {
			Ps__PushAck ack = PS__PUSH_ACK__INIT;
			ack.req_id = p->req_id;
			ps_msg_send(p->sc->conn, PS_MSG_PUSH_ACK, &ack.base, NULL, 0,
				    PS_SEND_VOLATILE, NULL, NULL);
			if (!p->not_push) {
				s->c.acks++;
				ps_histo_add(&s->c.push_lat, now - p->arrived);
			}
		}
		*pp = p->next;
		free(p->reply);
		free(p);
	}
	r->pending_tail = pp;
}

void ps__repl_drop_pending(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_pending *p;

	while ((p = r->pending)) {
		r->pending = p->next;
		free(p->reply);
		free(p);
	}
	r->pending_tail = &r->pending;
	r->b.nslots = r->b.plen = r->b.nmarks = 0;
	r->b.nrows = r->b.rplen = 0;
	ps__repl_decl_clear(&r->b);
}

void ps__repl_adopt_committed(struct ps_server *s)
{
	struct ps_repl *r = s->repl;
	size_t nw = (size_t)s->cfg->nworkers;

	if (r->state == PS_REPL_PRIMARY) {
		/* stepping down: what was not committed is forgotten with the
		 * gradients kept for it; the workers send those pushes again */
		memcpy(s->finished, r->cfinished, nw * sizeof(*s->finished));
		memcpy(s->dedup, r->cdedup, nw * sizeof(*s->dedup));
	} else {
		/* taking over: the backup's state is the committed one */
		memcpy(r->cfinished, s->finished, nw * sizeof(*s->finished));
		memcpy(r->cdedup, s->dedup, nw * sizeof(*s->dedup));
	}
}

/* ---- state transfer ---- */

struct kept {
	struct ps_server *s;
	uint64_t n, bytes;
};

/* A gradient waiting in the primary's barrier, forwarded to a new backup
 * as it was to the old one (every_push). */
static void resend_kept(void *arg, struct ps_slot *sl, int rank, uint64_t clock, const float *g)
{
	struct kept *k = arg;

	note(k->s, sl, g, rank, clock, NULL);
	k->n++;
	k->bytes += (uint64_t)sl->slice->count * sizeof(float);
}

int ps__repl_send_snapshot(struct ps_server *s, struct ps_srv_conn *sc)
{
	struct ps_repl *r = s->repl;
	Ps__ReplSnapshot m = PS__REPL_SNAPSHOT__INIT;
	struct kept kept = { s, 0, 0 };
	uint64_t bytes = 0;
	int rc;

	/* the store now stands at batch r->lsn: what this loop turn gathered
	 * is numbered, not sent (the new backup takes batches only after the
	 * snapshot, which holds it; its acks wait for the snapshot's) */
	r->link = NULL;
	gather_send(s);
	r->link = sc;
	m.lsn = r->lsn;
	m.epoch = r->epoch;
	/* the declared tensors and tables first: the frames below need them */
	rc = ps__repl_send_decl(s, sc, r->lsn, r->epoch);
	if (rc)
		return rc;
	for (int k = 0; k < s->store.nslots; k++) {
		const struct ps_slot *sl = &s->store.slots[k];

		for (int j = 0; j <= sl->opt->nstate; j++) {
			struct ps_iov iov = { j ? sl->state[j - 1] : sl->w,
					      (size_t)sl->slice->count * sizeof(float) };
			m.slice = sl->slice->id;
			m.which = (uint32_t)j;
			m.version = sl->version;
			m.steps = sl->steps;
			rc = ps_msg_send(sc->conn, PS_MSG_REPL_SNAPSHOT, &m.base, &iov, 1,
					 PS_SEND_VOLATILE, NULL, NULL);
			if (rc)
				return rc;
			bytes += iov.len;
		}
	}
	double clocks[PS_MAX_TABLES];
	int ntables = s->rows ? s->rows->ntables : 0;
	if (ntables) {
		rc = ps__repl_send_tables(s, sc, &m, clocks);
		if (rc)
			return rc;
		bytes += ps__rows_ckpt_size(s);
	}
	struct ps_iov dd = { r->cdedup, sizeof(*r->cdedup) * (size_t)s->cfg->nworkers };
	m.slice = 0;
	m.which = 0;
	m.last = 1;
	m.tables = 0;
	m.n_finished = (size_t)s->cfg->nworkers;
	m.finished = r->cfinished;
	m.n_table_clocks = (size_t)ntables;
	m.table_clocks = clocks;
	Ps__ReplMembers mem;
	rc = ps__members_repl_fill(s, &mem);
	if (rc)
		return rc;
	m.members = &mem;
	rc = ps_msg_send(sc->conn, PS_MSG_REPL_SNAPSHOT, &m.base, &dd, 1, PS_SEND_VOLATILE, NULL,
			 NULL);
	ps__members_repl_fill_free(&mem);
	if (rc)
		return rc;
	/* every_push: the gradients kept in the barriers of clocks not summed
	 * yet were forwarded to the backup before this one; the new backup
	 * gets them again in the batch right after the state, else it would
	 * sum those clocks without them when they complete */
	if (s->cfg->repl_every_push && s->cfg->consistency == PS_SYNC) {
		ps_store_each_kept(&s->store, resend_kept, &kept);
		if (r->b.nslots)
			ps__repl_send_batch(s, 1);
	}
	r->snap_lsn = r->lsn;
	r->last_sent = ps_now_s();
	if (kept.n)
		ps_info("replication: state sent to the new backup %s: %" PRIu64 " bytes, and %"
			PRIu64 " pushed slices waiting for their clock's sum (%" PRIu64
			" bytes), at batch %" PRIu64, sc->conn->peer, bytes, kept.n, kept.bytes,
			r->lsn);
	else
		ps_info("replication: state sent to the new backup %s: %" PRIu64 " bytes at batch %"
			PRIu64, sc->conn->peer, bytes, r->lsn);
	return 0;
}

int ps__repl_on_snapshot(struct ps_server *s, const Ps__ReplSnapshot *m,
			 const struct ps_frame *f, int *done)
{
	struct ps_repl *r = s->repl;
	size_t nw = (size_t)s->cfg->nworkers;

	*done = 0;
	if (m->lsn >= PS_MAX_CLOCK || m->epoch >= PS_MAX_CLOCK || m->version >= PS_MAX_CLOCK ||
	    m->steps >= PS_MAX_CLOCK) {
		ps_warn("replication: snapshot frame at batch %" PRIu64 " of epoch %" PRIu64 " with "
			"version %" PRIu64 " and %" PRIu64 " steps: out of range (at most 2^53 - 1)",
			m->lsn, m->epoch, m->version, m->steps);
		return PS_EPROTO;
	}
	if (m->declare || m->declare_tables)
		return ps__repl_snapshot_decl(s, m);
	if (m->tables)
		return ps__repl_tables_part(s, m, f);
	if (m->last) {
		int ntables = s->rows ? s->rows->ntables : 0;
		if (m->n_table_clocks != (size_t)ntables ||
		    (ntables && r->snap_tables_got != r->snap_tables_len)) {
			ps_warn("replication: snapshot end with %zu tables and %" PRIu64 " of %" PRIu64
				" bytes of them; this shard has %d tables", m->n_table_clocks,
				r->snap_tables_got, r->snap_tables_len, ntables);
			return PS_EPROTO;
		}
		if (m->n_finished != nw || f->hdr.payload_len != nw * sizeof(*s->dedup)) {
			ps_warn("replication: snapshot end with %zu clocks and %" PRIu64 " dedup bytes "
				"for %zu workers", m->n_finished, f->hdr.payload_len, nw);
			return PS_EPROTO;
		}
		for (size_t i = 0; i < nw; i++)
			if (m->finished[i] >= PS_MAX_CLOCK)
				return PS_EPROTO;
		char why[200];
		if (m->members && ps__members_repl_check(s, m->members, why, sizeof(why))) {
			ps_warn("replication: snapshot end with a membership this shard cannot "
				"hold: %s", why);
			return PS_EPROTO;
		}
		if (ntables) {
			for (int t = 0; t < ntables; t++)
				if (!(m->table_clocks[t] >= 0 && m->table_clocks[t] < 4e9)) {
					ps_warn("replication: snapshot with table %d at %g s since its "
						"epoch: out of range", t, m->table_clocks[t]);
					return PS_EPROTO;
				}
			int rc = ps__repl_tables_restore(s, m->table_clocks);
			if (rc)
				return rc;
		}
		memcpy(s->finished, m->finished, nw * sizeof(*s->finished));
		memcpy(s->dedup, f->payload, nw * sizeof(*s->dedup));
		int rc = ps__members_repl_apply(s, m->members, why, sizeof(why));
		if (rc) {
			ps_warn("replication: snapshot membership: %s", why);
			return rc;
		}
		r->lsn = m->lsn;
		r->epoch = m->epoch;
		ps__repl_staged_free(s, NULL, 0);
		*done = 1;
		return 0;
	}
	struct ps_slot *sl = ps_store_slot(&s->store, m->slice);
	if (!sl || m->which > (uint32_t)sl->opt->nstate ||
	    f->hdr.payload_len != (uint64_t)sl->slice->count * sizeof(float)) {
		ps_warn("replication: snapshot frame for slice %u array %u (%" PRIu64 " bytes) does "
			"not match this shard", m->slice, m->which, f->hdr.payload_len);
		return PS_EPROTO;
	}
	if (!f->payload_finite && !ps_words_finite(f->payload, (size_t)sl->slice->count)) {
		ps_warn("replication: snapshot frame for slice %u array %u holds NaN or infinite "
			"values", m->slice, m->which);
		return PS_EPROTO;
	}
	memcpy(m->which ? sl->state[m->which - 1] : sl->w, f->payload, f->hdr.payload_len);
	sl->version = m->version;
	sl->steps = m->steps;
	return 0;
}

int ps__repl_on_batch(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f)
{
	struct ps_repl *r = s->repl;
	size_t nw = (size_t)s->cfg->nworkers;

	char why[200];

	if (m->lsn == r->lsn && !m->n_slots && !m->n_marks && !m->n_rows && !m->declare &&
	    !m->declare_tables && !m->members) {
		r->heartbeats++;
		return 0; /* a heartbeat */
	}
	if (m->lsn != r->lsn + 1) {
		ps_warn("replication: batch %" PRIu64 " after batch %" PRIu64 ": a gap", m->lsn,
			r->lsn);
		return PS_EPROTO;
	}
	if (m->n_finished && m->n_finished != nw)
		return PS_EPROTO;
	if (m->lsn >= PS_MAX_CLOCK || m->epoch >= PS_MAX_CLOCK) {
		ps_warn("replication: batch %" PRIu64 " of epoch %" PRIu64 ": out of range (at most "
			"2^53 - 1)", m->lsn, m->epoch);
		return PS_EPROTO;
	}
	if (m->declare || m->declare_tables) {
		/* first: the slices and tables of the rest may be declared here */
		int rc = ps__repl_decl_apply(s, m, f);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_slots; i++) {
		const Ps__ReplSlot *x = m->slots[i];
		struct ps_slot *sl = ps_store_slot(&s->store, x->slice);
		uint64_t n = sl ? (uint64_t)sl->slice->count : 0;

		if (x->has_lr && ps_optim_group_lr_check(0, x->lr, why, sizeof(why))) {
			ps_warn("replication: batch %" PRIu64 " applies slice %u with %s", m->lsn,
				x->slice, why);
			return PS_EPROTO;
		}
		if (x->version >= PS_MAX_CLOCK || x->steps >= PS_MAX_CLOCK) {
			ps_warn("replication: batch %" PRIu64 " sets slice %u to version %" PRIu64
				" and %" PRIu64 " steps: out of range (at most 2^53 - 1)", m->lsn,
				x->slice, x->version, x->steps);
			return PS_EPROTO;
		}
		if (sl && x->has_grad && x->length == n * sizeof(float) && !(x->offset % 4) &&
		    x->offset <= f->hdr.payload_len && x->length <= f->hdr.payload_len - x->offset &&
		    !f->payload_finite && !ps_words_finite(f->payload + x->offset, (size_t)n)) {
			ps_warn("replication: batch %" PRIu64 " holds NaN or infinite gradient values "
				"for slice %u", m->lsn, x->slice);
			return PS_EPROTO;
		}
	}
	for (size_t i = 0; i < m->n_marks; i++)
		if (m->marks[i]->rank < 0 || (size_t)m->marks[i]->rank >= nw || !m->marks[i]->seq)
			return PS_EPROTO;
	for (size_t i = 0; i < m->n_finished; i++)
		if (m->finished[i] >= PS_MAX_CLOCK)
			return PS_EPROTO;
	if (m->members && ps__members_repl_check(s, m->members, why, sizeof(why))) {
		ps_warn("replication: batch %" PRIu64 " holds a membership this shard cannot: %s",
			m->lsn, why);
		return PS_EPROTO;
	}
	if (m->n_rows) {
		int rc = ps__repl_rows_check(s, m, f);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_slots; i++) {
		const Ps__ReplSlot *x = m->slots[i];
		struct ps_slot *sl = ps_store_slot(&s->store, x->slice);
		uint64_t n = sl ? (uint64_t)sl->slice->count : 0;

		if (!sl || (x->has_grad && (x->length != n * sizeof(float) || x->offset % 4 ||
					    x->offset > f->hdr.payload_len ||
					    x->length > f->hdr.payload_len - x->offset))) {
			ps_warn("replication: batch %" PRIu64 " names slice %u with %" PRIu64
				" bytes: not this shard's", m->lsn, x->slice, x->length);
			return PS_EPROTO;
		}
		if (x->staged) {
			int rc = stage(s, sl, x, f->payload + x->offset);
			if (rc)
				return rc;
			continue;
		}
		const float *g = x->has_grad ? (const float *)(f->payload + x->offset) : NULL;
		if (x->sum_staged && !(g = staged_sum(s, sl, x->version - 1))) {
			ps_warn("replication: batch %" PRIu64 " sums clock %" PRIu64 " of slice %u, "
				"of which no gradient came", m->lsn, x->version - 1, x->slice);
			return PS_EPROTO;
		}
		if (g) {
			/* the primary took step steps - 1 from where this slot is */
			if (x->steps != sl->steps + 1) {
				ps_warn("replication: slice %u is at step %" PRIu64 " here, the "
					"primary's step was %" PRIu64, x->slice, sl->steps, x->steps - 1);
				return PS_EPROTO;
			}
			double t0 = ps_now_s();
			struct ps_optim_cfg oc = *sl->ocfg;
			if (x->has_lr)
				oc.lr = x->lr;
			sl->opt->apply(&oc, sl->w, g, sl->state, (size_t)n, sl->steps);
			s->store.applies++;
			s->store.bytes_applied += n * sizeof(float);
			s->store.apply_seconds += ps_now_s() - t0;
		}
		sl->steps = x->steps;
		sl->version = x->version;
		if (s->repl->staged)
			ps__repl_staged_free(s, sl, sl->version);
	}
	if (m->n_rows) {
		int rc = ps__repl_rows_apply(s, m, f);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_finished; i++)
		s->finished[i] = m->finished[i];
	if (m->members) {
		int rc = ps__members_repl_apply(s, m->members, why, sizeof(why));
		if (rc)
			return rc; /* out of memory: checked above */
	}
	for (size_t i = 0; i < m->n_marks; i++) {
		const Ps__ReplMark *x = m->marks[i];
		ps_dedup_incarnation(&s->dedup[x->rank], x->incarnation);
		ps_dedup_mark(&s->dedup[x->rank], x->seq, 0);
	}
	r->lsn = m->lsn;
	r->epoch = m->epoch > r->epoch ? m->epoch : r->epoch;
	r->batches++;
	r->bytes += f->hdr.payload_len;
	return 0;
}
