/* rows.c - a shard's embedding requests: row pushes (checked whole, then
 * applied or kept for their sync clock), row pulls (answered or held),
 * the sync clocks of each table, TTL and the tables' counters (rows.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "finite.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "replica.h"
#include "rows.h"
#include "rows_wire.h"
#include "server_int.h"

/* Sync: one worker's row gradients of one clock, copied out of its frame. */
struct rows_push {
	size_t n;
	uint64_t *ids;          /* ascending */
	float *g;               /* n * dim */
	struct ps_table *tb;    /* its table, where room for its new rows is promised */
	uint64_t promised;      /* ... for this many (ps_table_reserve) */
};

struct rows_clock {
	uint64_t clock;
	struct rows_push **by_rank; /* nworkers entries, NULL = not pushed */
	size_t *pos;                /* nworkers: apply_clock's place in each push, made
				       with the clock so applying it allocates nothing */
	struct rows_clock *next;
};

/* A row pull held for its condition. It keeps its ids as they came
 * (delta-varint bytes, already checked), not decoded: a parked pull costs
 * its frame's id bytes and this struct, where 8 bytes per id would let a
 * 1 MB frame of small deltas hold 8 MB. */
struct rows_wait {
	struct ps_srv_conn *sc;
	uint64_t req_id, min_version, clock;
	int table, codec;
	double arrived;
	size_t n;
	size_t enc_len;
	struct rows_wait *next;
	uint8_t enc[];
};

/* Bytes a parked pull counts against limits.max_waiting_bytes(_total). */
static uint64_t wait_cost(const struct rows_wait *w)
{
	return sizeof(*w) + w->enc_len;
}

/* Unlinks nothing: forgets w's bytes and frees it. */
static void wait_free(struct ps_srv_rows *R, struct rows_wait *w)
{
	R->waiting_bytes -= wait_cost(w);
	w->sc->waiting_bytes -= wait_cost(w);
	free(w);
}

int ps__rows_init(struct ps_server *s)
{
	const struct ps_config *cfg = s->cfg;
	struct ps_srv_rows *R = calloc(1, sizeof(*R));
	int rc = -ENOMEM;

	if (!R)
		return rc;
	s->rows = R;
	/* room for every table a worker may declare later
	 * (ps__rows_add_tables), so the entries never move */
	R->t = calloc(PS_MAX_TABLES, sizeof(*R->t));
	R->scratch = malloc(sizeof(float) * PS_MAX_ROW_DIM * 2);
	R->probe = malloc(sizeof(float) * (PS_MAX_ROW_DIM * 4 + 4));
	if (!R->t || !R->scratch || !R->probe)
		return rc;
	for (int t = 0; t < cfg->ntables; t++) {
		struct ps_table *tb = &R->t[t].tb;

		rc = ps_table_init(tb, cfg, t, cfg->nshards, ps_now_s());
		if (rc)
			return rc;
		R->ntables = t + 1;
		ps_info("table %s: at most %" PRIu64 " rows on this shard (%" PRIu64 " bytes a row; "
			"%s), the least recently updated dropped past it", cfg->tables[t].name,
			tb->cap, ps_table_row_cost(tb), tb->cap == tb->budget_rows
			? "its share of limits.max_table_bytes" : "its share of max_rows");
	}
	return 0;
}

/* Promises room in tb for the rows of ids[0..n) it does not hold yet, so
 * that applying an acknowledged push cannot fail for memory; the ids are
 * looked up only when room for all of them is not there already. 0 or
 * -ENOMEM (nothing promised); *promised: the rows promised. */
static int promise_rows(struct ps_table *tb, const uint64_t *ids, size_t n, uint64_t *promised)
{
	uint64_t need = n;

	if (!ps_table_has_room(tb, n)) {
		need = 0;
		for (size_t i = 0; i < n; i++)
			need += ps_table_find(tb, ids[i]) == PS_ROW_NIL;
	}
	if (ps_table_reserve(tb, need))
		return -ENOMEM;
	*promised = need;
	return 0;
}

static void push_free(struct rows_push *p)
{
	if (p) {
		if (p->tb)
			ps_table_unreserve(p->tb, p->promised);
		free(p->ids);
		free(p->g);
		free(p);
	}
}

static void clock_free(const struct ps_server *s, struct rows_clock *k)
{
	for (int r = 0; r < s->cfg->nworkers; r++)
		push_free(k->by_rank[r]);
	free(k->by_rank);
	free(k->pos);
	free(k);
}

void ps__rows_free(struct ps_server *s)
{
	struct ps_srv_rows *R = s->rows;
	struct rows_wait *w;

	if (!R)
		return;
	for (int t = 0; t < R->ntables; t++) {
		struct rows_clock *k;
		while ((k = R->t[t].pending)) {
			R->t[t].pending = k->next;
			clock_free(s, k);
		}
		ps_table_free(&R->t[t].tb);
	}
	while ((w = R->waiting)) {
		R->waiting = w->next;
		free(w);
	}
	free(R->t);
	free(R->scratch);
	free(R->probe);
	free(R);
	s->rows = NULL;
}

int ps__rows_find(const struct ps_server *s, const char *name)
{
	for (int t = 0; t < s->rows->ntables; t++)
		if (!strcmp(s->cfg->tables[t].name, name))
			return t;
	return -1;
}

/* The table named by a request, checked against the client's dim; -1 (and
 * the error sent) when unknown or another dim. */
static int request_table(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			 const char *name, uint32_t dim, size_t n_ids)
{
	int t = ps__rows_find(s, name ? name : "");
	char shown[80];

	snprintf(shown, sizeof(shown), "%s", name ? name : "");
	for (char *p = shown; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
			*p = '?';
	if (t < 0) {
		ps_msg_send_error(sc->conn, req_id, PS_ENOTENSOR, "no embedding table '%s' on "
				  "this shard (model.embeddings)", shown);
		return -1;
	}
	if (dim != (uint32_t)s->cfg->tables[t].dim) {
		ps_msg_send_error(sc->conn, req_id, PS_ESHAPE, "table '%s' has dim %d, the request "
				  "says %u", shown, s->cfg->tables[t].dim, dim);
		return -1;
	}
	if (n_ids > (size_t)s->cfg->limits.max_request_rows) {
		ps_msg_send_error(sc->conn, req_id, PS_ETOOBIG, "%zu ids in one request to table "
				  "'%s'; at most %d (limits.max_request_rows)", n_ids, shown,
				  s->cfg->limits.max_request_rows);
		return -1;
	}
	return t;
}

/* ---- pulls ---- */

static int pull_ready(const struct ps_server *s, const struct rows_wait *w)
{
	if (s->rows->t[w->table].tb.version < w->min_version)
		return 0;
	if (s->cfg->consistency == PS_ASYNC && w->clock > (uint64_t)s->cfg->staleness &&
	    ps__srv_min_finished(s) < w->clock - (uint64_t)s->cfg->staleness)
		return 0;
	return 1;
}

/* Answers w with the rows of ids (its w->n ids, decoded). */
static void send_rows(struct ps_server *s, struct rows_wait *w, const uint64_t *ids)
{
	struct ps_table *tb = &s->rows->t[w->table].tb;
	Ps__PullRowsReply r = PS__PULL_ROWS_REPLY__INIT;
	size_t vals = w->n * (size_t)tb->dim, bytes = vals * (w->codec ? 2 : 4);
	float *out = malloc(sizeof(float) * (vals ? vals : 1));
	uint8_t *enc = NULL;
	struct ps_iov iov;
	int rc;

	if (!out) {
		ps_msg_send_error(w->sc->conn, w->req_id, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < w->n; i++)
		ps_table_read(tb, ids[i], out + i * (size_t)tb->dim);
	iov.base = out;
	iov.len = bytes;
	if (w->codec == PS_CODEC_FP16) {
		const struct ps_codec_ops *co = ps_codec_get(PS_CODEC_FP16);
		struct ps_codec_params prm = { 1.0f, 0 };
		ssize_t e;
		enc = malloc(co->max_bytes(vals, &prm) + 1);
		if (!enc) {
			ps_msg_send_error(w->sc->conn, w->req_id, -ENOMEM, "out of memory");
			free(out);
			return;
		}
		e = co->encode(out, NULL, vals, &prm, 0, enc, co->max_bytes(vals, &prm));
		if (e < 0) {
			ps_msg_send_error(w->sc->conn, w->req_id, (int)e, "fp16 encoding failed");
			free(enc);
			free(out);
			return;
		}
		iov.base = enc;
		iov.len = (size_t)e;
	}
	r.req_id = w->req_id;
	r.n_rows = (uint32_t)w->n;
	r.dim = (uint32_t)tb->dim;
	r.codec = (uint32_t)w->codec;
	r.version = tb->version;
	rc = ps_msg_send(w->sc->conn, PS_MSG_PULL_ROWS_REPLY, &r.base, &iov, 1, PS_SEND_VOLATILE,
			 NULL, NULL);
	if (rc)
		ps_debug("row pull reply to %s not sent: %s", w->sc->conn->peer, ps_strerror(rc));
	s->c.pull_raw += vals * sizeof(float);
	s->c.pull_wire += iov.len;
	s->c.bytes_out += iov.len;
	ps_histo_add(&s->c.pull_lat, ps_now_s() - w->arrived);
	free(enc);
	free(out);
}

/* Answers a parked pull: its ids decoded again (they were checked when it
 * came, so this cannot fail but for memory). */
static void send_parked(struct ps_server *s, struct rows_wait *w)
{
	uint64_t *ids = malloc(sizeof(uint64_t) * (w->n ? w->n : 1));
	char why[200];
	int rc = ids ? ps_rows_ids_decode(w->enc, w->enc_len, w->n, ids, why, sizeof(why))
		     : -ENOMEM;

	if (rc)
		ps_msg_send_error(w->sc->conn, w->req_id, rc, "row pull: %s",
				  ids ? why : "out of memory");
	else
		send_rows(s, w, ids);
	free(ids);
}

static void answer_pulls(struct ps_server *s)
{
	struct rows_wait **pp = &s->rows->waiting, *w;

	while ((w = *pp)) {
		if (pull_ready(s, w)) {
			*pp = w->next;
			w->sc->nwaiting--;
			send_parked(s, w);
			ps__srv_check_backlog(s, w->sc);
			wait_free(s->rows, w);
		} else {
			pp = &w->next;
		}
	}
}

void ps__rows_handle_pull(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PullRows *m,
			  const struct ps_frame *f)
{
	struct rows_wait *w, now;
	uint64_t *ids, cost;
	char why[200];
	int t, rc;

	s->c.pulls++;
	t = request_table(s, sc, m->req_id, m->table, m->dim, m->n_ids);
	if (t < 0)
		goto err;
	if (m->codec != PS_CODEC_NONE && m->codec != PS_CODEC_FP16) {
		ps_msg_send_error(sc->conn, m->req_id, PS_EPROTO, "row pull replies can be raw (0) "
				  "or fp16 (1), not codec %u", m->codec);
		goto err;
	}
	if ((uint64_t)m->n_ids * (uint64_t)s->cfg->tables[t].dim * 4 + 65536 >
	    s->cfg->limits.max_frame_bytes) {
		ps_msg_send_error(sc->conn, m->req_id, PS_ETOOBIG, "a reply of %u rows of dim %d "
				  "would pass limits.max_frame_bytes", m->n_ids,
				  s->cfg->tables[t].dim);
		goto err;
	}
	ids = malloc(sizeof(uint64_t) * (m->n_ids ? m->n_ids : 1));
	if (!ids) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		goto err;
	}
	rc = ps_rows_ids_decode(f->payload, f->hdr.payload_len, m->n_ids, ids, why, sizeof(why));
	if (rc) {
		ps_msg_send_error(sc->conn, m->req_id, rc, "row pull: %s", why);
		goto err_free_ids;
	}
	w = &now;
	w->sc = sc;
	w->req_id = m->req_id;
	w->min_version = m->min_version;
	w->clock = m->clock;
	w->table = t;
	w->codec = (int)m->codec;
	w->arrived = ps_now_s();
	w->n = m->n_ids;
	w->enc_len = f->hdr.payload_len;
	if (pull_ready(s, w)) {
		send_rows(s, w, ids);
		free(ids);
		return;
	}
	free(ids);
	ids = NULL;
	if (sc->nwaiting >= s->cfg->limits.max_waiting_pulls) {
		ps_msg_send_error(sc->conn, m->req_id, PS_ETOOBIG, "%d pulls of this connection "
				  "wait for their clock already (limits.max_waiting_pulls)",
				  sc->nwaiting);
		goto err;
	}
	cost = wait_cost(&now);
	if (sc->waiting_bytes + cost > s->cfg->limits.max_waiting_bytes) {
		ps_msg_send_error(sc->conn, m->req_id, PS_ETOOBIG, "the row pulls of this "
				  "connection that wait for their clock hold %" PRIu64 " bytes; "
				  "this one would add %" PRIu64 " (limits.max_waiting_bytes %" PRIu64
				  ")", sc->waiting_bytes, cost, s->cfg->limits.max_waiting_bytes);
		goto err;
	}
	if (s->rows->waiting_bytes + cost > s->cfg->limits.max_waiting_bytes_total) {
		ps_msg_send_error(sc->conn, m->req_id, PS_ETOOBIG, "the row pulls waiting for their "
				  "clock on this shard hold %" PRIu64 " bytes; this one would add %"
				  PRIu64 " (limits.max_waiting_bytes_total %" PRIu64 ")",
				  s->rows->waiting_bytes, cost,
				  s->cfg->limits.max_waiting_bytes_total);
		goto err;
	}
	w = malloc(sizeof(*w) + now.enc_len);
	if (!w) {
		ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		goto err;
	}
	*w = now;
	memcpy(w->enc, f->payload, w->enc_len);
	sc->nwaiting++;
	sc->waiting_bytes += cost;
	s->rows->waiting_bytes += cost;
	w->next = s->rows->waiting;
	s->rows->waiting = w;
	return;

err_free_ids:
	free(ids);
err:
	s->c.errors++;
}

void ps__rows_forget(struct ps_server *s, struct ps_srv_conn *sc)
{
	struct rows_wait **pp, *w;

	if (!s->rows)
		return;
	for (pp = &s->rows->waiting; (w = *pp);) {
		if (w->sc == sc) {
			*pp = w->next;
			wait_free(s->rows, w);
		} else {
			pp = &w->next;
		}
	}
}

/* ---- pushes ---- */

/* After rows were created in table st: says once when the table reached
 * its cap and began to drop rows (counted in its evicted). */
static void note_evictions(struct ps_srv_table *st)
{
	const struct ps_table *tb = &st->tb;

	if (!tb->c.evicted || st->evict_logged)
		return;
	st->evict_logged = 1;
	ps_warn("table %s: %" PRIu64 " rows, its cap on this shard (%s); every new row drops the "
		"least recently updated one from now on (counted in evicted)", tb->tc->name,
		tb->nrows, tb->cap == tb->budget_rows ? "its share of limits.max_table_bytes"
		: "its share of max_rows");
}

/* Sync: the next id of clock k in ascending order and the sum of its
 * gradients over the ranks in rank order (each rank's ids are sorted: a
 * merge); pos[] holds each rank's place. 0 at the end, else the number of
 * ranks summed. */
static int clock_next(const struct ps_server *s, const struct rows_clock *k, int dim,
		      size_t *pos, uint64_t *idp, float *sum)
{
	int nw = s->cfg->nworkers, any = 0, seen = 0;
	uint64_t id = UINT64_MAX;

	for (int r = 0; r < nw; r++) {
		const struct rows_push *p = k->by_rank[r];
		if (p && pos[r] < p->n && (!any || p->ids[pos[r]] < id)) {
			id = p->ids[pos[r]];
			any = 1;
		}
	}
	if (!any)
		return 0;
	for (int r = 0; r < nw; r++) {
		const struct rows_push *p = k->by_rank[r];
		if (!p || pos[r] >= p->n || p->ids[pos[r]] != id)
			continue;
		const float *g = p->g + pos[r] * (size_t)dim;
		if (!seen++)
			memcpy(sum, g, sizeof(float) * (size_t)dim);
		else
			for (int j = 0; j < dim; j++)
				sum[j] += g[j];
		pos[r]++;
	}
	*idp = id;
	return seen;
}

/* Sync: applies clock k of table st, all of it or, when a sum or the
 * update of a row would not be finite, none of it (logged and counted as
 * an error; the version moves on all the same). */
static void apply_clock(struct ps_server *s, struct ps_srv_table *st, struct rows_clock *k)
{
	int nw = s->cfg->nworkers, dim = st->tb.dim, seen;
	size_t *pos = k->pos;
	float *sum = s->rows->scratch;
	double now = ps_now_s(), t0 = now;
	uint64_t id;

	memset(pos, 0, sizeof(*pos) * (size_t)nw);
	/* first pass: every row's update is probed, nothing changes */
	while ((seen = clock_next(s, k, dim, pos, &id, sum)))
		if (!ps_table_update_finite(&st->tb, id, sum, s->rows->probe)) {
			ps_error("table %s: the gradients of clock %" PRIu64 " for row %" PRIu64
				 " sum to values that are not finite, or its update would leave "
				 "weights or optimizer state that are not finite; that clock is not "
				 "applied to the table (no row changed)", st->tb.tc->name, k->clock, id);
			s->c.errors++;
			return;
		}
	memset(pos, 0, sizeof(*pos) * (size_t)nw);
	uint32_t stamp = ps_table_stamp(&st->tb, now);
	int t = (int)(st - s->rows->t);
	while ((seen = clock_next(s, k, dim, pos, &id, sum))) {
		if (ps_table_push_at(&st->tb, id, sum, seen, stamp) < 0) {
			/* not sent to the backup either: the two copies stay equal */
			ps_error("table %s: out of memory creating row %" PRIu64 "; its gradients "
				 "of clock %" PRIu64 " are lost", st->tb.tc->name, id, k->clock);
			continue;
		}
		ps__repl_note_row(s, t, id, sum, seen, stamp);
	}
	note_evictions(st);
	s->store.applies++;
	s->store.apply_seconds += ps_now_s() - t0;
}

/* Sync: whether every live worker pushed or ended clock k (and one did). */
static int clock_complete(const struct ps_server *s, const struct rows_clock *k, uint64_t c)
{
	int any = 0;

	for (int r = 0; r < s->cfg->nworkers; r++) {
		int done = (k && k->by_rank[r]) || s->finished[r] > c;
		if (!done && s->live[r])
			return 0;
		any |= done;
	}
	return any;
}

void ps__rows_advance(struct ps_server *s)
{
	int changed = 0;

	if (!s->rows)
		return;
	for (int t = 0; s->cfg->consistency == PS_SYNC && t < s->rows->ntables; t++) {
		struct ps_srv_table *st = &s->rows->t[t];
		for (;;) {
			struct rows_clock *k = st->pending;
			uint64_t c = st->tb.version;
			if (k && k->clock != c)
				k = NULL;
			if (!clock_complete(s, k, c))
				break;
			if (k) {
				apply_clock(s, st, k);
				st->pending = k->next;
				clock_free(s, k);
			}
			st->tb.version = c + 1;
			ps__repl_note_rows_done(s, t);
			changed = 1;
		}
	}
	if (s->rows->waiting && (changed || s->cfg->consistency == PS_ASYNC))
		answer_pulls(s);
}

/* Checks a push whole: ids decoded into *ids, values (float32) into *g. */
static int check_push(struct ps_server *s, const Ps__PushRows *m, const struct ps_frame *f,
		      int t, uint64_t **ids, float **g, char *why, size_t whylen)
{
	size_t dim = (size_t)s->cfg->tables[t].dim, vals = m->n_ids * dim;
	uint64_t off = (m->ids_bytes + 3) & ~(uint64_t)3, vbytes = vals * (m->codec ? 2 : 4);
	int rc;

	if (m->codec != PS_CODEC_NONE && m->codec != PS_CODEC_FP16) {
		snprintf(why, whylen, "row gradients can be raw (0) or fp16 (1), not codec %u",
			 m->codec);
		return PS_EPROTO;
	}
	if (m->ids_bytes > f->hdr.payload_len || off > f->hdr.payload_len ||
	    f->hdr.payload_len - off != vbytes) {
		snprintf(why, whylen, "payload of %" PRIu64 " bytes does not hold %" PRIu64 " bytes "
			 "of ids and %u rows of dim %zu", f->hdr.payload_len, m->ids_bytes, m->n_ids,
			 dim);
		return PS_ESHAPE;
	}
	*ids = malloc(sizeof(uint64_t) * (m->n_ids ? m->n_ids : 1));
	*g = malloc(sizeof(float) * (vals ? vals : 1));
	if (!*ids || !*g) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	rc = ps_rows_ids_decode(f->payload, m->ids_bytes, m->n_ids, *ids, why, whylen);
	if (rc)
		return rc;
	if (m->codec == PS_CODEC_FP16) {
		rc = ps_codec_get(PS_CODEC_FP16)->decode(f->payload + off, vbytes, vals, *g, why,
							  whylen);
		if (rc)
			return rc;
	} else {
		memcpy(*g, f->payload + off, vbytes);
	}
	if (!ps_words_finite(*g, vals)) {
		snprintf(why, whylen, "gradients that are not finite");
		return PS_ENOFINITE;
	}
	return 0;
}

/* Sync: keeps rank's gradients for clock c of table st. */
static int keep_push(struct ps_server *s, struct ps_srv_table *st, int rank, uint64_t c,
		     struct rows_push *p)
{
	struct rows_clock **kk = &st->pending, *k;

	while (*kk && (*kk)->clock < c)
		kk = &(*kk)->next;
	k = *kk;
	if (!k || k->clock != c) {
		k = calloc(1, sizeof(*k));
		if (!k || !(k->by_rank = calloc((size_t)s->cfg->nworkers, sizeof(*k->by_rank))) ||
		    !(k->pos = calloc((size_t)s->cfg->nworkers, sizeof(*k->pos)))) {
			if (k)
				free(k->by_rank);
			free(k);
			return -ENOMEM;
		}
		k->clock = c;
		k->next = *kk;
		*kk = k;
	}
	if (k->by_rank[rank])
		return PS_EDUP;
	k->by_rank[rank] = p;
	return 0;
}

static void send_ack(struct ps_srv_conn *sc, uint64_t req_id)
{
	Ps__PushAck ack = PS__PUSH_ACK__INIT;

	ack.req_id = req_id;
	ps_msg_send(sc->conn, PS_MSG_PUSH_ACK, &ack.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
}

/* An accepted row push: acknowledged now, or with replicas once it is
 * committed (sync: table t has applied its clock; t -1: at once) and the
 * backup confirmed the batch that holds it (replica_log.c). */
static void acknowledge(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PushRows *m,
			int t, double arrived)
{
	if (s->repl) {
		if (ps__repl_rows_accepted(s, sc, m->req_id, sc->rank, sc->incarnation, m->seq,
					   m->clock, t))
			ps_msg_send_error(sc->conn, m->req_id, -ENOMEM, "out of memory");
		return;
	}
	send_ack(sc, m->req_id);
	ps_histo_add(&s->c.push_lat, ps_now_s() - arrived);
	s->c.acks++;
}

void ps__rows_handle_push(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PushRows *m,
			  const struct ps_frame *f)
{
	const struct ps_config *cfg = s->cfg;
	struct rows_push *p = NULL;
	uint64_t *ids = NULL;
	float *g = NULL;
	char why[256];
	int t, rc, code;
	double arrived = ps_now_s();

	s->c.pushes++;
	if (ps__srv_stop_refuse_rows(s, sc, m))
		return; /* retryable: not marked in the dedup window (stop.c) */
	if (m->seq) {
		ps_dedup_incarnation(&s->dedup[sc->rank], sc->incarnation);
		switch (ps_dedup_check(&s->dedup[sc->rank], m->seq, &code)) {
		case PS_DEDUP_NEW:
			break;
		case PS_DEDUP_SEEN:
			s->c.duplicate_pushes++;
			if (code)
				ps_msg_send_error(sc->conn, m->req_id, code, "row push %" PRIu64 " was "
						  "refused when it first came: %s", m->seq,
						  ps_strerror(code));
			else if (!s->repl || !ps__repl_resent(s, sc, m->req_id, sc->rank,
								sc->incarnation, m->seq))
				send_ack(sc, m->req_id); /* else acked once its batch is confirmed */
			return;
		case PS_DEDUP_TOO_OLD:
			ps_msg_send_error(sc->conn, m->req_id, PS_EDUP, "row push %" PRIu64 " is older "
					  "than the pushes this shard remembers", m->seq);
			s->c.errors++;
			return;
		}
	}
	t = request_table(s, sc, m->req_id, m->table, m->dim, m->n_ids);
	if (t < 0) {
		rc = PS_ENOTENSOR;
		goto err_reject;
	}
	if (cfg->consistency == PS_SYNC) {
		uint64_t v = s->rows->t[t].tb.version;
		if (m->clock < v && m->clock >= s->finished[sc->rank]) {
			/* A worker that rejoined at the clock it was told (the
			 * lowest of the dense slices' versions) while this table
			 * had applied that clock without it, as the dense path's
			 * late slices: not a resend (it has not ended the clock
			 * here), so its rows for that clock are set aside */
			ps_debug("worker %d: row push for clock %" PRIu64 " of table '%s', which "
				 "had gone on without it (version %" PRIu64 "): set aside", sc->rank,
				 m->clock, cfg->tables[t].name, v);
			if (m->seq)
				ps_dedup_mark(&s->dedup[sc->rank], m->seq, 0);
			acknowledge(s, sc, m, -1, arrived);
			return;
		}
		if (m->clock < v || m->clock >= v + (uint64_t)cfg->limits.max_clock_ahead) {
			rc = PS_ECLOCK;
			ps_msg_send_error(sc->conn, m->req_id, rc, "row push for clock %" PRIu64 " but "
					  "table '%s' is at version %" PRIu64 " (accepting clocks %"
					  PRIu64 "..%" PRIu64 ")", m->clock, cfg->tables[t].name, v, v,
					  v + (uint64_t)cfg->limits.max_clock_ahead - 1);
			goto err_reject;
		}
	}
	rc = check_push(s, m, f, t, &ids, &g, why, sizeof(why));
	if (rc) {
		ps_msg_send_error(sc->conn, m->req_id, rc, "row push to table '%s': %s; nothing of "
				  "it was applied", cfg->tables[t].name, why);
		goto err_reject;
	}
	s->c.push_raw[m->codec] += (uint64_t)m->n_ids * (uint64_t)cfg->tables[t].dim * 4;
	s->c.push_wire[m->codec] += f->hdr.payload_len;
	s->c.bytes_in += f->hdr.payload_len;
	if (cfg->consistency == PS_SYNC) {
		p = malloc(sizeof(*p));
		if (!p) {
			rc = -ENOMEM;
			ps_msg_send_error(sc->conn, m->req_id, rc, "out of memory");
			goto err_reject;
		}
		*p = (struct rows_push){ m->n_ids, ids, g, NULL, 0 };
		ids = NULL;
		g = NULL;
		if (promise_rows(&s->rows->t[t].tb, p->ids, p->n, &p->promised)) {
			rc = -ENOMEM;
			ps_msg_send_error(sc->conn, m->req_id, rc, "out of memory for the new rows "
					  "of table '%s' (worker %d, clock %" PRIu64 "); nothing of "
					  "the push was taken", cfg->tables[t].name, sc->rank, m->clock);
			push_free(p);
			goto err_reject;
		}
		p->tb = &s->rows->t[t].tb;
		rc = keep_push(s, &s->rows->t[t], sc->rank, m->clock, p);
		if (rc) {
			ps_msg_send_error(sc->conn, m->req_id, rc, rc == PS_EDUP
					  ? "worker %d already pushed rows of table '%s' for clock %"
					    PRIu64 " to this shard (one push per table, shard and clock)"
					  : "out of memory (worker %d, table '%s', clock %" PRIu64 ")",
					  sc->rank, cfg->tables[t].name, m->clock);
			push_free(p);
			goto err_reject;
		}
	} else {
		struct ps_table *tb = &s->rows->t[t].tb;
		double t0 = ps_now_s();
		/* every row's update is probed before any is applied */
		for (size_t i = 0; i < m->n_ids; i++)
			if (!ps_table_update_finite(tb, ids[i], g + i * (size_t)tb->dim,
						    s->rows->probe)) {
				rc = PS_ENOFINITE;
				ps_msg_send_error(sc->conn, m->req_id, rc, "row push to table '%s': "
						  "the update of row %" PRIu64 " by these finite "
						  "gradients would leave weights or optimizer state that "
						  "are not finite (values too large); nothing of it was "
						  "applied", cfg->tables[t].name, ids[i]);
				goto err_reject;
			}
		uint64_t promised;
		if (promise_rows(tb, ids, m->n_ids, &promised)) {
			rc = -ENOMEM;
			ps_msg_send_error(sc->conn, m->req_id, rc, "out of memory for the new rows "
					  "of table '%s'; nothing of the push was applied",
					  cfg->tables[t].name);
			goto err_reject;
		}
		uint32_t stamp = ps_table_stamp(tb, t0);
		for (size_t i = 0; i < m->n_ids; i++) {
			const float *gi = g + i * (size_t)tb->dim;
			if (ps_table_push_at(tb, ids[i], gi, 1, stamp) < 0) {
				/* not sent to the backup either (as apply_clock) */
				ps_error("table %s: out of memory creating row %" PRIu64 "; its "
					 "gradient is lost", tb->tc->name, ids[i]);
				continue;
			}
			ps__repl_note_row(s, t, ids[i], gi, 1, stamp);
		}
		ps_table_unreserve(tb, promised);
		tb->version++;
		ps__repl_note_rows_done(s, t);
		note_evictions(&s->rows->t[t]);
		s->store.applies++;
		s->store.apply_seconds += ps_now_s() - t0;
	}
	free(ids);
	free(g);
	if (m->clock + 1 > s->top_clock)
		s->top_clock = m->clock + 1; /* a re-shard's stop must lie above it (stop.c) */
	if (m->seq)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, 0);
	acknowledge(s, sc, m, cfg->consistency == PS_SYNC ? t : -1, arrived);
	ps__rows_advance(s);
	return;

err_reject:
	s->c.errors++;
	if (m->seq && rc != PS_EDUP)
		ps_dedup_mark(&s->dedup[sc->rank], m->seq, rc < 0 ? rc : PS_EPROTO);
	free(ids);
	free(g);
}

/* ---- time-to-live and counters ---- */

void ps__rows_tick(struct ps_server *s, double now)
{
	/* a backup drops what its primary dropped, when the batch says so */
	if (s->repl && !ps__repl_serving(s))
		return;
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		uint32_t stamp = ps_table_stamp(tb, now);
		uint64_t n = ps_table_expire_at(tb, stamp);
		if (n) {
			ps__repl_note_expired(s, t, stamp, n);
			ps_debug("table %s: %" PRIu64 " rows expired (ttl %d s)",
				 s->cfg->tables[t].name, n, s->cfg->tables[t].ttl_s);
		}
	}
}

void ps__rows_drop_pending(struct ps_server *s)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		struct rows_clock *k;
		while ((k = s->rows->t[t].pending)) {
			s->rows->t[t].pending = k->next;
			clock_free(s, k);
		}
	}
}

int ps__rows_reset(struct ps_server *s)
{
	struct ps_srv_rows *R = s->rows;

	ps__rows_drop_pending(s);
	for (int t = 0; R && t < R->ntables; t++) {
		struct ps_table *tb = &R->t[t].tb;
		ps_table_free(tb);
		int rc = ps_table_init(tb, s->cfg, t, s->cfg->nshards, ps_now_s());
		if (rc)
			return rc;
		R->t[t].evict_logged = 0;
	}
	return 0;
}

int ps__rows_stats(const struct ps_server *s, Ps__Stats *m, int checksums)
{
	int n = s->rows ? s->rows->ntables : 0;
	double now, wall = ps_wall_mono_s(&now);
	Ps__TableStats *ts;

	if (!n)
		return 0;
	m->tables = calloc((size_t)n, sizeof(*m->tables));
	ts = calloc((size_t)n, sizeof(*ts));
	if (!m->tables || !ts) {
		free(m->tables);
		free(ts);
		m->tables = NULL;
		return -ENOMEM;
	}
	for (int t = 0; t < n; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		ps__table_stats__init(&ts[t]);
		ts[t].name = (char *)s->cfg->tables[t].name;
		ts[t].dim = (uint32_t)tb->dim;
		ts[t].rows = tb->nrows;
		ts[t].bytes = ps_table_bytes(tb);
		ts[t].admitted = tb->c.admitted;
		ts[t].evicted = tb->c.evicted;
		ts[t].cap_rows = tb->cap;
		ts[t].expired = tb->c.expired;
		ts[t].filter_ids = tb->admit.used;
		ts[t].filter_bytes = ps_admit_bytes(&tb->admit);
		ts[t].filter_lookups = tb->admit.lookups;
		ts[t].filter_hits = tb->admit.hits;
		ts[t].pulled_rows = tb->c.pulled;
		ts[t].pushed_rows = tb->c.pushed;
		ts[t].version = tb->version;
		ts[t].checksum = checksums ? ps_table_checksum(tb) : 0;
		ts[t].epoch_unix = wall - (now - tb->epoch);
		m->tables[t] = &ts[t];
	}
	m->n_tables = (size_t)n;
	return 0;
}

void ps__rows_stats_free(Ps__Stats *m)
{
	if (m->n_tables)
		free(m->tables[0]);
	free(m->tables);
	m->tables = NULL;
	m->n_tables = 0;
}
