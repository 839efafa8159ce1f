/* replica_rows.c - the embedding tables' part of replication
 * (replica.h, docs/embeddings.md): the row updates and expiries the
 * primary gathers into its batches, the backup's check and application of
 * them, and the tables whole in the state transfer.
 *
 * A row update is forwarded as the primary made it: (id, sightings,
 * gradient) under the stamp it used, in groups per table whose version
 * follows; the backup calls ps_table_push_at / ps_table_expire_at with the
 * same arguments, so admission, eviction, the recency order, the stamps
 * and the optimizer state come out bit-identical. The state transfer
 * sends the tables in a checkpoint's layout (table_ckpt.c) with each
 * table's clock and the wall-clock time it was read at, restored through
 * a memory file, and the stamps and epoch set to the primary's: the epoch
 * on the wall clock both processes share, so the transfer's delay does
 * not move it (it would add up over the processes that serve in turn).
 */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ckpt_format.h"
#include "finite.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"
#include "table_ckpt.h"

double ps__repl_since_wall(double wall, double wall_now, double lo, double hi, const char *what)
{
	double d = wall_now - wall;

	if (!wall)
		return lo;
	if (d >= lo - 1 && d <= hi + 1)
		return d;
	ps_warn("replication: %s: the primary read its tables' clocks %.3f s ago by this host's "
		"wall clock, but %.3f..%.3f s by what this process saw: the two hosts' clocks "
		"differ by more than a second; the tables' epoch is set %.3f s after the "
		"primary's at most (keep the hosts' clocks in step, e.g. with NTP)", what, d, lo,
		hi, hi - lo);
	return lo;
}

/* ---- embedding tables: row changes (primary) ---- */

/* Bytes of one row record: id, sightings, dim gradients. */
static size_t row_rec(int dim)
{
	return sizeof(uint64_t) + sizeof(uint32_t) + sizeof(float) * (size_t)dim;
}

/* The group of table t (kind, stamp) at the batch's end, a new one when
 * the last group is another's; NULL when out of memory (the link is then
 * closed: this primary steps down). */
static Ps__ReplRows *rows_group(struct ps_server *s, int t, uint32_t kind, uint32_t stamp,
				int fresh)
{
	struct ps_repl_batch *b = &s->repl->b;
	Ps__ReplRows *g = b->nrows ? &b->rows[b->nrows - 1] : NULL;

	if (!fresh && g && g->table == (uint32_t)t && g->kind == kind && g->stamp == stamp)
		return g;
	if (ps__repl_grow((void **)&b->rows, &b->rcap, b->nrows + 1, sizeof(*b->rows))) {
		ps_error("replication: out of memory gathering a batch; stepping down");
		if (s->repl->link)
			s->repl->link->conn->t->ops->close(s->repl->link->conn, -ENOMEM);
		return NULL;
	}
	g = &b->rows[b->nrows++];
	ps__repl_rows__init(g);
	g->table = (uint32_t)t;
	g->kind = kind;
	g->stamp = stamp;
	g->offset = b->rplen;
	g->version = s->rows->t[t].tb.version;
	return g;
}

void ps__repl_note_row(struct ps_server *s, int t, uint64_t id, const float *g, int sightings,
		       uint32_t stamp)
{
	struct ps_repl *r = s->repl;
	struct ps_repl_batch *b;
	Ps__ReplRows *x;
	size_t rec = row_rec(s->rows->t[t].tb.dim);
	uint32_t k = (uint32_t)sightings;

	if (!r || r->state != PS_REPL_PRIMARY)
		return;
	b = &r->b;
	if ((b->plen || b->rplen) && b->plen + b->rplen + rec > s->cfg->limits.max_frame_bytes / 2)
		ps__repl_send_batch(s, 0);
	if (!(x = rows_group(s, t, 0, stamp, 0)))
		return;
	if (ps__repl_grow((void **)&b->rpayload, &b->rpcap, b->rplen + rec, 1)) {
		b->nrows--; /* forgotten with the batch: the primary steps down */
		ps_error("replication: out of memory gathering a batch; stepping down");
		if (r->link)
			r->link->conn->t->ops->close(r->link->conn, -ENOMEM);
		return;
	}
	memcpy(b->rpayload + b->rplen, &id, sizeof(id));
	memcpy(b->rpayload + b->rplen + sizeof(id), &k, sizeof(k));
	memcpy(b->rpayload + b->rplen + sizeof(id) + sizeof(k), g, rec - sizeof(id) - sizeof(k));
	b->rplen += rec;
	x->n++;
	x->length += rec;
	x->version = s->rows->t[t].tb.version;
}

void ps__repl_note_rows_done(struct ps_server *s, int t)
{
	struct ps_repl *r = s->repl;
	Ps__ReplRows *x;

	if (!r || r->state != PS_REPL_PRIMARY)
		return;
	x = r->b.nrows ? &r->b.rows[r->b.nrows - 1] : NULL;
	if (!x || x->table != (uint32_t)t || x->kind != 0)
		x = rows_group(s, t, 0, 0, 1);
	if (x)
		x->version = s->rows->t[t].tb.version;
}

void ps__repl_note_expired(struct ps_server *s, int t, uint32_t stamp, uint64_t n)
{
	struct ps_repl *r = s->repl;
	Ps__ReplRows *x;

	if (!r || r->state != PS_REPL_PRIMARY)
		return;
	if ((x = rows_group(s, t, 1, stamp, 1)))
		x->n = n;
}

/* ---- embedding tables: row changes (backup) ---- */

/* Checks a batch's row groups against this shard's tables and the frame. */
int ps__repl_rows_check(const struct ps_server *s, const Ps__ReplBatch *m,
			const struct ps_frame *f)
{
	for (size_t i = 0; i < m->n_rows; i++) {
		const Ps__ReplRows *x = m->rows[i];
		const struct ps_table *tb;
		size_t rec;

		if (!s->rows || x->table >= (uint32_t)s->rows->ntables || x->kind > 1 ||
		    x->version >= PS_MAX_CLOCK) {
			ps_warn("replication: batch %" PRIu64 " changes table %u (kind %u, version %"
				PRIu64 "): not this shard's", m->lsn, x->table, x->kind, x->version);
			return PS_EPROTO;
		}
		if (x->kind == 1)
			continue;
		tb = &s->rows->t[x->table].tb;
		rec = row_rec(tb->dim);
		if (x->n > f->hdr.payload_len / rec || x->length != x->n * rec ||
		    x->offset > f->hdr.payload_len || x->length > f->hdr.payload_len - x->offset) {
			ps_warn("replication: batch %" PRIu64 " holds %" PRIu64 " rows of table '%s' "
				"in %" PRIu64 " bytes at %" PRIu64 ": not in its %" PRIu64 " bytes",
				m->lsn, x->n, tb->tc->name, x->length, x->offset, f->hdr.payload_len);
			return PS_EPROTO;
		}
		for (uint64_t j = 0; j < x->n; j++) {
			float g[PS_MAX_ROW_DIM];
			uint32_t k;
			const uint8_t *p = f->payload + x->offset + j * rec;
			memcpy(&k, p + sizeof(uint64_t), sizeof(k));
			memcpy(g, p + sizeof(uint64_t) + sizeof(k), sizeof(float) * (size_t)tb->dim);
			if (!k || k > (uint32_t)s->cfg->nworkers ||
			    !ps_words_finite(g, (size_t)tb->dim)) {
				ps_warn("replication: batch %" PRIu64 " updates a row of table '%s' with "
					"%u sightings or gradients that are not finite", m->lsn,
					tb->tc->name, k);
				return PS_EPROTO;
			}
		}
	}
	return 0;
}

/* Applies a batch's row groups (checked by rows_check) as the primary
 * made them. */
int ps__repl_rows_apply(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f)
{
	for (size_t i = 0; i < m->n_rows; i++) {
		const Ps__ReplRows *x = m->rows[i];
		struct ps_table *tb = &s->rows->t[x->table].tb;
		size_t rec = row_rec(tb->dim);

		if (x->kind == 1) {
			uint64_t n = ps_table_expire_at(tb, x->stamp);
			if (n != x->n) {
				ps_warn("replication: table '%s': %" PRIu64 " rows expired here, %" PRIu64
					" on the primary: the copies differ; the state is transferred "
					"again", tb->tc->name, n, x->n);
				return PS_EPROTO;
			}
		}
		for (uint64_t j = 0; x->kind == 0 && j < x->n; j++) {
			float *g = s->rows->scratch;
			const uint8_t *p = f->payload + x->offset + j * rec;
			uint64_t id;
			uint32_t k;
			memcpy(&id, p, sizeof(id));
			memcpy(&k, p + sizeof(id), sizeof(k));
			memcpy(g, p + sizeof(id) + sizeof(k), sizeof(float) * (size_t)tb->dim);
			if (ps_table_push_at(tb, id, g, (int)k, x->stamp) < 0) {
				ps_error("replication: table '%s': out of memory creating row %" PRIu64
					 "; the state is transferred again", tb->tc->name, id);
				return -ENOMEM;
			}
		}
		tb->version = x->version;
	}
	return 0;
}

/* The embedding tables whole, in a checkpoint's layout (table_ckpt.c:
 * rows least recently updated first with their ages, state, admission
 * filter, counters), in frames of half the frame limit; clocks[t] gets
 * the seconds since each table's epoch at the instant the ages were taken. */
int ps__repl_send_tables(struct ps_server *s, struct ps_srv_conn *sc, Ps__ReplSnapshot *m,
			  double *clocks)
{
	size_t len = ps__rows_ckpt_size(s), chunk = s->cfg->limits.max_frame_bytes / 2;
	uint8_t *img = malloc(len ? len : 1);
	double now, wall = ps_wall_mono_s(&now);
	int rc = 0;

	if (!img)
		return -ENOMEM;
	ps__rows_ckpt_snapshot_at(s, img, now);
	for (int t = 0; t < s->rows->ntables; t++)
		clocks[t] = now - s->rows->t[t].tb.epoch;
	m->tables = 1;
	m->tables_total = len;
	m->table_clocks_wall = wall;
	for (size_t off = 0; off < len && !rc; off += chunk) {
		struct ps_iov iov = { img + off, len - off < chunk ? len - off : chunk };
		m->tables_offset = off;
		rc = ps_msg_send(sc->conn, PS_MSG_REPL_SNAPSHOT, &m->base, &iov, 1,
				 PS_SEND_VOLATILE, NULL, NULL);
	}
	m->tables = 0;
	m->table_clocks_wall = 0;
	free(img);
	return rc;
}

/* A part of the tables' image: kept until the snapshot's last frame. */
int ps__repl_tables_part(struct ps_server *s, const Ps__ReplSnapshot *m,
			 const struct ps_frame *f)
{
	struct ps_repl *r = s->repl;
	int ntables = s->rows ? s->rows->ntables : 0;
	/* the image holds at most the rows the tables' budget allows */
	uint64_t most = s->cfg->limits.max_table_bytes + (uint64_t)ntables * 4096;

	if (!m->tables_offset) {
		free(r->snap_tables);
		r->snap_tables = NULL;
		r->snap_tables_got = 0;
		r->snap_tables_len = m->tables_total;
		if (!ntables || m->tables_total > most || !m->tables_total) {
			ps_warn("replication: snapshot with %" PRIu64 " bytes of embedding tables; "
				"this shard has %d tables and keeps at most %" PRIu64 " bytes of them",
				m->tables_total, ntables, most);
			return PS_EPROTO;
		}
		if (!(m->table_clocks_wall >= 0 && m->table_clocks_wall < 1e11)) {
			ps_warn("replication: snapshot with the tables' clocks read at %g s of the "
				"primary's wall clock: out of range", m->table_clocks_wall);
			return PS_EPROTO;
		}
		/* the image was read before this frame was sent: the delay
		 * since is at least the time since it came */
		r->snap_tables_at = ps_now_s();
		r->snap_tables_wall = m->table_clocks_wall;
		r->snap_tables = malloc(m->tables_total);
		if (!r->snap_tables)
			return -ENOMEM;
	}
	if (!r->snap_tables || m->tables_total != r->snap_tables_len ||
	    m->tables_offset != r->snap_tables_got ||
	    f->hdr.payload_len > r->snap_tables_len - r->snap_tables_got) {
		ps_warn("replication: snapshot frame with bytes %" PRIu64 "..+%" PRIu64 " of the "
			"tables' %" PRIu64 " after %" PRIu64 ": out of order", m->tables_offset,
			f->hdr.payload_len, m->tables_total, r->snap_tables_got);
		return PS_EPROTO;
	}
	memcpy(r->snap_tables + r->snap_tables_got, f->payload, f->hdr.payload_len);
	r->snap_tables_got += f->hdr.payload_len;
	return 0;
}

/* Each table's rows in the image: their stamps become the primary's (its
 * stamp at the image minus the age) and the table's epoch the primary's,
 * so rows updated here after a takeover get the stamps the primary would
 * have given them and expire when they would have there. The image's
 * instant on this process's clock is now minus the time since, on the
 * wall clock: then the epoch is the primary's exactly (one host), not
 * later by the transfer's delay. */
static void tables_restamp(struct ps_server *s, const double *clocks)
{
	struct ps_repl *rp = s->repl;
	const uint8_t *b = rp->snap_tables;
	double now, wnow = ps_wall_mono_s(&now);
	double since = ps__repl_since_wall(rp->snap_tables_wall, wnow, now - rp->snap_tables_at,
					   now - rp->snap_started, "the state transfer");

	for (int t = 0; t < s->rows->ntables; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		struct ckpt_table ct;
		size_t rb = sizeof(struct ckpt_row) + sizeof(float) * (size_t)tb->row_floats;
		uint32_t r = tb->tail, cur = (uint32_t)clocks[t];

		memcpy(&ct, b, sizeof(ct));
		b += sizeof(ct);
		for (uint64_t i = 0; i < ct.nrows && r != PS_ROW_NIL; i++, b += rb) {
			struct ckpt_row cr;
			struct ps_row_meta *mt = ps_table_meta(tb, r);
			memcpy(&cr, b, sizeof(cr));
			mt->stamp = cr.age <= cur ? cur - cr.age : 0;
			r = mt->prev;
		}
		b += ct.filter_slots * sizeof(uint32_t);
		tb->epoch = now - since - clocks[t];
	}
}

/* The tables' image received whole: checked, then every table emptied and
 * restored from it (through a memory file: table_ckpt.c reads files). */
int ps__repl_tables_restore(struct ps_server *s, const double *clocks)
{
	struct ps_repl *r = s->repl;
	char err[300];
	int fd = memfd_create("ps-repl-tables", MFD_CLOEXEC), rc = 0;

	if (fd < 0) {
		rc = -errno;
		ps_warn("replication: the snapshot's embedding tables: cannot make a memory file: "
			"%s", strerror(-rc));
		return rc;
	}
	for (uint64_t off = 0; off < r->snap_tables_len;) {
		ssize_t n = write(fd, r->snap_tables + off, r->snap_tables_len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			ps_warn("replication: the snapshot's embedding tables: cannot write them to a "
				"memory file (%" PRIu64 " of %" PRIu64 " bytes written): %s", off,
				r->snap_tables_len, strerror(-rc));
			goto out_close;
		}
		off += (uint64_t)n;
	}
	rc = ps__rows_ckpt_check(s, fd, 0, r->snap_tables_len, err, sizeof(err));
	if (!rc && (rc = ps__rows_reset(s)))
		snprintf(err, sizeof(err), "out of memory");
	if (!rc)
		rc = ps__rows_ckpt_restore(s, fd, 0, err, sizeof(err));
	if (rc) {
		ps_warn("replication: the snapshot's embedding tables: %s", err);
		goto out_close;
	}
	tables_restamp(s, clocks);
	/* the rows are all new here: the next checkpoint is a full one */
	s->tables_gen++;
	s->ckpt_have_base = 0;
out_close:
	close(fd);
	free(r->snap_tables);
	r->snap_tables = NULL;
	r->snap_tables_got = r->snap_tables_len = 0;
	return rc;
}
