/* table_ckpt.c - the embedding tables' part of a shard's checkpoint file
 * (checkpoint.h): after the dense state and the workers' finished clocks,
 * per table of the config, in order:
 *   struct ckpt_table
 *   nrows x (struct ckpt_row, then dim weights and nstate floats of state),
 *     least recently updated first, so restoring them in file order
 *     rebuilds the recency order the cap and the TTL use
 *   the admission filter's slots (filter_slots x uint32), so counts of ids
 *     not admitted yet survive a restart
 * The file's CRC covers it like the rest. A row's last update is kept as
 * its age at the snapshot: time the shard was down does not count toward
 * the TTL.
 *
 * An incremental checkpoint (shard-K.ckpt.delta-N, checkpoint.incremental)
 * has the same dense part and, for the tables, a struct ckpt_delta_head
 * naming the full file it builds on (its CRC and length) and its place N
 * in the chain, then per table a struct ckpt_table whose nrows counts the
 * rows changed since the previous checkpoint, followed by ntombs dropped
 * ids (uint64), the changed rows least recently updated first, each with
 * its age, and the whole admission filter. The rows changed since the last
 * checkpoint are exactly the most recent ones (an update makes a row the
 * newest), so they are found by walking the recency list from its newest
 * end, and restoring them in file order rebuilds the same order.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ckpt_format.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows.h"
#include "rows_wire.h"
#include "server.h"
#include "table_ckpt.h"

#define ROWS_PER_READ 4096

static size_t row_bytes(const struct ps_table *tb)
{
	return sizeof(struct ckpt_row) + sizeof(float) * (size_t)tb->row_floats;
}

static uint64_t filter_slots(const struct ps_table *tb)
{
	return tb->admit.slots ? tb->admit.nbuckets * 8 : 0;
}

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t ps__rows_ckpt_size(const struct ps_server *s)
{
	size_t n = 0;

	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		n += sizeof(struct ckpt_table) + (size_t)tb->nrows * row_bytes(tb) +
		     (size_t)filter_slots(tb) * sizeof(uint32_t);
	}
	return n;
}

void ps__rows_ckpt_snapshot(const struct ps_server *s, uint8_t *b)
{
	ps__rows_ckpt_snapshot_at(s, b, ps_now_s());
}

void ps__rows_ckpt_snapshot_at(const struct ps_server *s, uint8_t *b, double now)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		uint32_t cur = now - tb->epoch > 0 ? (uint32_t)(now - tb->epoch) : 0;
		struct ckpt_table ct = { ps_rows_table_key(tb->tc), (uint32_t)tb->dim,
					 (uint32_t)tb->row_floats, tb->version, tb->nrows,
					 filter_slots(tb), tb->c.admitted, tb->c.evicted,
					 tb->c.expired, tb->admit.lookups, tb->admit.hits,
					 tb->admit.decays, 0, tb->nrows, wall_now() };
		memcpy(b, &ct, sizeof(ct));
		b += sizeof(ct);
		for (uint32_t r = tb->tail; r != PS_ROW_NIL; r = ps_table_meta(tb, r)->prev) {
			const struct ps_row_meta *m = ps_table_meta(tb, r);
			struct ckpt_row cr = { ps_row_id(m), m->stamp < cur ? cur - m->stamp : 0, 0 };
			memcpy(b, &cr, sizeof(cr));
			memcpy(b + sizeof(cr), ps_table_vals(tb, r), sizeof(float) * (size_t)tb->row_floats);
			b += row_bytes(tb);
		}
		if (ct.filter_slots)
			memcpy(b, tb->admit.slots, (size_t)ct.filter_slots * sizeof(uint32_t));
		b += ct.filter_slots * sizeof(uint32_t);
	}
}

/* Reads exactly n bytes at offset off; 0 or -1 with errno (EIO at the end). */
static int read_at(int fd, void *p, size_t n, uint64_t off)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

int ps__rows_ckpt_check(const struct ps_server *s, int fd, uint64_t pos, uint64_t end,
			char *err, size_t errlen)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		struct ckpt_table ct;
		uint64_t rb = row_bytes(tb);

		if (end - pos < sizeof(ct)) {
			snprintf(err, errlen, "table '%s' is missing (the file ends)", tb->tc->name);
			return PS_EPROTO;
		}
		if (read_at(fd, &ct, sizeof(ct), pos)) {
			snprintf(err, errlen, "table '%s': cannot read its record: %s", tb->tc->name,
				 strerror(errno));
			return PS_EPROTO;
		}
		pos += sizeof(ct);
		if (ct.key != ps_rows_table_key(tb->tc) || ct.dim != (uint32_t)tb->dim ||
		    ct.row_floats != (uint32_t)tb->row_floats ||
		    ct.filter_slots != filter_slots(tb)) {
			snprintf(err, errlen, "table %d is not '%s' of dim %d with %d floats of state "
				 "and a filter of %" PRIu64 " slots as configured (name, dim, "
				 "optimizer or filter_ids changed)", t, tb->tc->name, tb->dim,
				 tb->nstate, filter_slots(tb));
			return PS_ECONFIG;
		}
		if (ct.nrows > (end - pos) / rb || ct.nrows >= PS_ROW_NIL ||
		    (tb->cap && ct.nrows > tb->cap)) {
			snprintf(err, errlen, "table '%s' claims %" PRIu64 " rows: more than the file "
				 "holds or the cap allows (damaged?)", tb->tc->name, ct.nrows);
			return PS_EPROTO;
		}
		pos += ct.nrows * rb;
		if ((end - pos) / sizeof(uint32_t) < ct.filter_slots) {
			snprintf(err, errlen, "table '%s': the admission filter is cut short",
				 tb->tc->name);
			return PS_EPROTO;
		}
		pos += ct.filter_slots * sizeof(uint32_t);
	}
	if (pos != end) {
		snprintf(err, errlen, "%" PRIu64 " bytes after the last table (damaged, or made with "
			 "other tables)", end - pos);
		return PS_EPROTO;
	}
	return 0;
}

/* The admission filter's slots of a table record at pos (full or
 * incremental), and its count of used slots. 0, or -1 with errno. */
static int read_filter(int fd, struct ps_table *tb, const struct ckpt_table *ct, uint64_t pos)
{
	if (!ct->filter_slots)
		return 0;
	if (read_at(fd, tb->admit.slots, ct->filter_slots * sizeof(uint32_t), pos))
		return -1;
	tb->admit.used = 0;
	for (uint64_t i = 0; i < ct->filter_slots; i++)
		tb->admit.used += tb->admit.slots[i] != 0;
	return 0;
}

/* A re-shard's scratch table (keep_nshards): the stamp of a row restored
 * from a snapshot whose whole wall-clock second less the row's age is
 * `st` seconds past the table's epoch, kept no older than the newest
 * restored before it, so each old shard's rows stay in their recency order
 * with stamps that never fall toward the newest (reshard_rows.c merges the
 * old shards' lists by them). */
static uint32_t scratch_stamp(struct ps_table *tb, int64_t st)
{
	if (st < (int64_t)tb->last_stamp)
		st = tb->last_stamp;
	if (st > (int64_t)4000000000u)
		st = 4000000000u;
	tb->last_stamp = (uint32_t)st;
	return (uint32_t)st;
}

/* A table's version and counters as a checkpoint recorded them; nothing
 * loaded counts as changed since (except in a staged re-shard's scratch
 * table, whose marks the staged merge reads). */
static void restore_counters(struct ps_table *tb, const struct ckpt_table *ct)
{
	tb->version = ct->version;
	tb->c.admitted = ct->admitted;
	tb->c.evicted = ct->evicted;
	tb->c.expired = ct->expired;
	tb->admit.lookups = ct->filter_lookups;
	tb->admit.hits = ct->filter_hits;
	tb->admit.decays = ct->filter_decays;
	if (!tb->keep_changes)
		ps_table_clear_changes(tb);
}

int ps__rows_ckpt_restore(struct ps_server *s, int fd, uint64_t pos, char *err, size_t errlen)
{
	struct ps_table_bulk bulk = { 0 };
	uint8_t *buf = NULL;
	int rc = 0;

	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		struct ckpt_table ct;
		size_t rb = row_bytes(tb);
		uint32_t oldest = 0;

		if (read_at(fd, &ct, sizeof(ct), pos))
			goto err_read;
		pos += sizeof(ct);
		free(buf);
		buf = malloc(rb * ROWS_PER_READ);
		if (!buf) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		/* the oldest row comes first: its age sets the epoch, so that every
		 * restored stamp is >= 0 and ages are kept (a re-shard's scratch
		 * table: on the wall clock, from the snapshot's whole second) */
		if (ct.nrows) {
			struct ckpt_row cr;
			if (read_at(fd, &cr, sizeof(cr), pos))
				goto err_read;
			oldest = cr.age;
		}
		tb->epoch = tb->keep_nshards > 0 ? floor(ct.wall) - oldest : ps_now_s() - oldest;
		tb->last_stamp = 0;
		if (ps_table_bulk_begin(tb, &bulk, ct.nrows)) {
			ps_table_bulk_end(&bulk);
			snprintf(err, errlen, "table '%s': out of memory for %" PRIu64 " rows",
				 tb->tc->name, ct.nrows);
			rc = -ENOMEM;
			goto out;
		}
		for (uint64_t done = 0; done < ct.nrows;) {
			size_t n = ct.nrows - done > ROWS_PER_READ ? ROWS_PER_READ
								  : (size_t)(ct.nrows - done);
			if (read_at(fd, buf, n * rb, pos))
				goto err_read;
			for (size_t i = 0; i < n; i++) {
				struct ckpt_row cr;
				uint32_t r, st;
				int dup;
				memcpy(&cr, buf + i * rb, sizeof(cr));
				if (i + PS_TABLE_PREFETCH_AHEAD < n) {
					uint64_t next;
					memcpy(&next, buf + (i + PS_TABLE_PREFETCH_AHEAD) * rb, sizeof(next));
					ps_table_bulk_prefetch(tb, &bulk, next);
				}
				if (!ps_table_keeps(tb, cr.id))
					continue;
				st = cr.age <= oldest ? oldest - cr.age : 0;
				if (tb->keep_nshards > 0)
					st = scratch_stamp(tb, st);
				r = ps_table_bulk_insert(tb, &bulk, cr.id, st, &dup);
				if (r == PS_ROW_NIL) {
					if (dup)
						snprintf(err, errlen, "table '%s': row %" PRIu64 " holds id "
							 "%" PRIu64 ", which an earlier row holds "
							 "(damaged?)", tb->tc->name, done + i, cr.id);
					else
						snprintf(err, errlen, "table '%s': out of memory at row "
							 "%" PRIu64, tb->tc->name, done + i);
					rc = dup ? PS_EPROTO : -ENOMEM;
					goto out;
				}
				memcpy(ps_table_vals(tb, r), buf + i * rb + sizeof(cr),
				       sizeof(float) * (size_t)tb->row_floats);
			}
			done += n;
			pos += n * rb;
		}
		ps_table_bulk_end(&bulk);
		if (read_filter(fd, tb, &ct, pos))
			goto err_read;
		pos += ct.filter_slots * sizeof(uint32_t);
		tb->ckpt_wall = ct.wall;
		restore_counters(tb, &ct);
	}
	goto out;

err_read:
	snprintf(err, errlen, "cannot read: %s", strerror(errno));
	rc = PS_EPROTO;
out:
	ps_table_bulk_end(&bulk);
	free(buf);
	return rc;
}

/* ---- incremental checkpoints ---- */

static uint64_t dirty_rows(const struct ps_table *tb)
{
	uint64_t n = 0;

	for (uint32_t k = 0; k < tb->nchunks; k++)
		for (uint32_t w = 0; w < PS_TABLE_CHUNK / 64; w++)
			n += (uint64_t)__builtin_popcountll(tb->dirty[k][w]);
	return n;
}

int ps__rows_delta_possible(const struct ps_server *s)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++)
		if (s->rows->t[t].tb.ntombs == UINT64_MAX)
			return 0; /* a tombstone was lost: only a full checkpoint is right */
	return 1;
}

size_t ps__rows_delta_size(const struct ps_server *s)
{
	size_t n = sizeof(struct ckpt_delta_head);

	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		n += sizeof(struct ckpt_table) + (size_t)dirty_rows(tb) * row_bytes(tb) +
		     (size_t)tb->ntombs * sizeof(uint64_t) +
		     (size_t)filter_slots(tb) * sizeof(uint32_t);
	}
	return n;
}

void ps__rows_delta_snapshot(const struct ps_server *s, uint8_t *b, uint32_t seq,
			     uint32_t base_crc, uint64_t base_len)
{
	struct ckpt_delta_head dh = { CKPT_DELTA_MAGIC, seq, base_crc, 0, base_len };
	double now = ps_now_s(), wall = wall_now();

	memcpy(b, &dh, sizeof(dh));
	b += sizeof(dh);
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		uint32_t cur = now - tb->epoch > 0 ? (uint32_t)(now - tb->epoch) : 0;
		struct ckpt_table ct = { ps_rows_table_key(tb->tc), (uint32_t)tb->dim,
					 (uint32_t)tb->row_floats, tb->version, dirty_rows(tb),
					 filter_slots(tb), tb->c.admitted, tb->c.evicted,
					 tb->c.expired, tb->admit.lookups, tb->admit.hits,
					 tb->admit.decays, tb->ntombs, tb->nrows, wall };
		memcpy(b, &ct, sizeof(ct));
		b += sizeof(ct);
		if (tb->ntombs)
			memcpy(b, tb->tombs, (size_t)tb->ntombs * sizeof(uint64_t));
		b += tb->ntombs * sizeof(uint64_t);
		/* the ct.nrows newest rows, written oldest first: find the oldest of
		 * them, then walk toward the newest */
		uint32_t r = tb->head;
		for (uint64_t i = 1; i < ct.nrows; i++)
			r = ps_table_meta(tb, r)->next;
		for (uint64_t i = 0; i < ct.nrows; i++, r = ps_table_meta(tb, r)->prev) {
			const struct ps_row_meta *m = ps_table_meta(tb, r);
			struct ckpt_row cr = { ps_row_id(m), m->stamp < cur ? cur - m->stamp : 0, 0 };
			memcpy(b, &cr, sizeof(cr));
			memcpy(b + sizeof(cr), ps_table_vals(tb, r), sizeof(float) * (size_t)tb->row_floats);
			b += row_bytes(tb);
		}
		if (ct.filter_slots)
			memcpy(b, tb->admit.slots, (size_t)ct.filter_slots * sizeof(uint32_t));
		b += ct.filter_slots * sizeof(uint32_t);
	}
}

void ps__rows_ckpt_taken(struct ps_server *s)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++)
		ps_table_clear_changes(&s->rows->t[t].tb);
}

int ps__rows_delta_check(const struct ps_server *s, int fd, uint64_t pos, uint64_t end,
			 uint32_t seq, uint32_t base_crc, uint64_t base_len, char *err,
			 size_t errlen)
{
	struct ckpt_delta_head dh;

	if (end - pos < sizeof(dh)) {
		snprintf(err, errlen, "no incremental header (the file ends)");
		return PS_EPROTO;
	}
	if (read_at(fd, &dh, sizeof(dh), pos)) {
		snprintf(err, errlen, "cannot read the incremental header: %s", strerror(errno));
		return PS_EPROTO;
	}
	if (dh.magic != CKPT_DELTA_MAGIC || dh.seq != seq) {
		snprintf(err, errlen, "not incremental checkpoint %u of the chain", seq);
		return PS_EPROTO;
	}
	if (dh.base_crc != base_crc || dh.base_len != base_len) {
		snprintf(err, errlen, "builds on another full checkpoint (CRC %08x, %" PRIu64
			 " bytes; the full file has %08x, %" PRIu64 ")", dh.base_crc, dh.base_len,
			 base_crc, base_len);
		return -ESTALE; /* the loader sets such a file aside */
	}
	pos += sizeof(dh);
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		struct ckpt_table ct;
		uint64_t rb = row_bytes(tb);

		if (end - pos < sizeof(ct)) {
			snprintf(err, errlen, "table '%s' is missing (the file ends)", tb->tc->name);
			return PS_EPROTO;
		}
		if (read_at(fd, &ct, sizeof(ct), pos)) {
			snprintf(err, errlen, "table '%s': cannot read its record: %s", tb->tc->name,
				 strerror(errno));
			return PS_EPROTO;
		}
		pos += sizeof(ct);
		if (ct.key != ps_rows_table_key(tb->tc) || ct.dim != (uint32_t)tb->dim ||
		    ct.row_floats != (uint32_t)tb->row_floats || ct.filter_slots != filter_slots(tb)) {
			snprintf(err, errlen, "table %d is not '%s' as configured", t, tb->tc->name);
			return PS_ECONFIG;
		}
		if (ct.ntombs > (end - pos) / 8 || ct.nrows > (end - pos - ct.ntombs * 8) / rb ||
		    ct.live_rows >= PS_ROW_NIL || (tb->cap && ct.live_rows > tb->cap)) {
			snprintf(err, errlen, "table '%s' claims %" PRIu64 " changed rows and %" PRIu64
				 " dropped ids: more than the file holds (damaged?)", tb->tc->name,
				 ct.nrows, ct.ntombs);
			return PS_EPROTO;
		}
		pos += ct.ntombs * 8 + ct.nrows * rb;
		if ((end - pos) / sizeof(uint32_t) < ct.filter_slots) {
			snprintf(err, errlen, "table '%s': the admission filter is cut short",
				 tb->tc->name);
			return PS_EPROTO;
		}
		pos += ct.filter_slots * sizeof(uint32_t);
	}
	if (pos != end) {
		snprintf(err, errlen, "%" PRIu64 " bytes after the last table", end - pos);
		return PS_EPROTO;
	}
	return 0;
}

int ps__rows_delta_restore(struct ps_server *s, int fd, uint64_t pos, char *err, size_t errlen)
{
	uint8_t *buf = NULL;
	int rc = 0;

	pos += sizeof(struct ckpt_delta_head);
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		struct ckpt_table ct;
		size_t rb = row_bytes(tb);
		uint64_t id, cur;

		if (read_at(fd, &ct, sizeof(ct), pos))
			goto err_read;
		pos += sizeof(ct);
		/* the time between the two snapshots ages the unchanged rows (a
		 * scratch table's epoch is on the wall clock already) */
		if (tb->ckpt_wall > 0 && ct.wall > tb->ckpt_wall && tb->keep_nshards <= 0)
			tb->epoch -= ct.wall - tb->ckpt_wall;
		tb->ckpt_wall = ct.wall;
		for (uint64_t i = 0; i < ct.ntombs; i++, pos += 8) {
			if (read_at(fd, &id, 8, pos))
				goto err_read;
			ps_table_remove(tb, id);
		}
		free(buf);
		buf = malloc(rb);
		if (!buf) {
			snprintf(err, errlen, "out of memory");
			rc = -ENOMEM;
			goto out;
		}
		/* the changed rows are the most recent ones: back in the recency
		 * list oldest first, each made the newest */
		cur = ps_now_s() - tb->epoch > 0 ? (uint64_t)(ps_now_s() - tb->epoch) : 0;
		for (uint64_t i = 0; i < ct.nrows; i++, pos += rb) {
			struct ckpt_row cr;
			uint32_t r, st;
			if (read_at(fd, buf, rb, pos))
				goto err_read;
			memcpy(&cr, buf, sizeof(cr));
			st = cr.age < cur ? (uint32_t)(cur - cr.age) : 0;
			if (!ps_table_keeps(tb, cr.id))
				continue;
			if (tb->keep_nshards > 0)
				st = scratch_stamp(tb, (int64_t)floor(ct.wall) - (int64_t)tb->epoch -
							   (int64_t)cr.age);
			r = ps_table_insert_newest(tb, cr.id, st);
			if (r == PS_ROW_NIL) {
				snprintf(err, errlen, "table '%s': out of memory", tb->tc->name);
				rc = -ENOMEM;
				goto out;
			}
			memcpy(ps_table_vals(tb, r), buf + sizeof(struct ckpt_row),
			       sizeof(float) * (size_t)tb->row_floats);
		}
		if (read_filter(fd, tb, &ct, pos))
			goto err_read;
		pos += ct.filter_slots * sizeof(uint32_t);
		/* a re-shard's scratch table holds a share of them: at most */
		if (tb->keep_nshards > 0 ? tb->nrows > ct.live_rows : tb->nrows != ct.live_rows) {
			snprintf(err, errlen, "table '%s' has %" PRIu64 " rows after the incremental "
				 "checkpoint, which says %" PRIu64 " (a checkpoint of the chain is "
				 "missing?)", tb->tc->name, tb->nrows, ct.live_rows);
			rc = PS_EPROTO;
			goto out;
		}
		restore_counters(tb, &ct);
	}
	goto out;

err_read:
	snprintf(err, errlen, "cannot read: %s", strerror(errno));
	rc = PS_EPROTO;
out:
	free(buf);
	return rc;
}
