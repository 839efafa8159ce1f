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
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ps_err.h"
#include "ps_time.h"
#include "rows.h"
#include "rows_wire.h"
#include "server.h"
#include "table_ckpt.h"

struct ckpt_table {
	uint64_t key;           /* ps_rows_table_key */
	uint32_t dim, row_floats;
	uint64_t version, nrows, filter_slots;
	uint64_t admitted, evicted, expired;
	uint64_t filter_lookups, filter_hits, filter_decays;
};

struct ckpt_row {
	uint64_t id;
	uint32_t age;           /* seconds since its last update, at the snapshot */
	uint32_t reserved;
};

#define ROWS_PER_READ 4096

static size_t row_bytes(const struct ps_table *tb)
{
	return sizeof(struct ckpt_row) + sizeof(float) * (size_t)tb->row_floats;
}

static uint64_t filter_slots(const struct ps_table *tb)
{
	return tb->admit.slots ? tb->admit.nbuckets * 8 : 0;
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
	double now = ps_now_s();

	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		const struct ps_table *tb = &s->rows->t[t].tb;
		uint32_t cur = now - tb->epoch > 0 ? (uint32_t)(now - tb->epoch) : 0;
		struct ckpt_table ct = { ps_rows_table_key(tb->tc), (uint32_t)tb->dim,
					 (uint32_t)tb->row_floats, tb->version, tb->nrows,
					 filter_slots(tb), tb->c.admitted, tb->c.evicted,
					 tb->c.expired, tb->admit.lookups, tb->admit.hits,
					 tb->admit.decays };
		memcpy(b, &ct, sizeof(ct));
		b += sizeof(ct);
		for (uint32_t r = tb->tail; r != PS_ROW_NIL; r = ps_table_meta(tb, r)->prev) {
			const struct ps_row_meta *m = ps_table_meta(tb, r);
			struct ckpt_row cr = { ps_row_id(m), m->stamp < cur ? cur - m->stamp : 0, 0 };
			memcpy(b, &cr, sizeof(cr));
			memcpy(b + sizeof(cr), ps_table_vals(tb, r), sizeof(float) * (size_t)tb->row_floats);
			b += row_bytes(tb);
		}
		memcpy(b, tb->admit.slots, (size_t)ct.filter_slots * sizeof(uint32_t));
		b += ct.filter_slots * sizeof(uint32_t);
	}
}

static int read_at(int fd, void *p, size_t n, uint64_t off)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
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

		if (end - pos < sizeof(ct) || read_at(fd, &ct, sizeof(ct), pos)) {
			snprintf(err, errlen, "table '%s' is missing (the file ends)", tb->tc->name);
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

int ps__rows_ckpt_restore(struct ps_server *s, int fd, uint64_t pos, char *err, size_t errlen)
{
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
		 * restored stamp is >= 0 and ages are kept */
		if (ct.nrows) {
			struct ckpt_row cr;
			if (read_at(fd, &cr, sizeof(cr), pos))
				goto err_read;
			oldest = cr.age;
		}
		tb->epoch = ps_now_s() - oldest;
		for (uint64_t done = 0; done < ct.nrows;) {
			size_t n = ct.nrows - done > ROWS_PER_READ ? ROWS_PER_READ
								  : (size_t)(ct.nrows - done);
			if (read_at(fd, buf, n * rb, pos))
				goto err_read;
			for (size_t i = 0; i < n; i++) {
				struct ckpt_row cr;
				uint32_t r;
				memcpy(&cr, buf + i * rb, sizeof(cr));
				r = ps_table_insert(tb, cr.id, cr.age <= oldest ? oldest - cr.age : 0);
				if (r == PS_ROW_NIL) {
					snprintf(err, errlen, "table '%s': out of memory at row %" PRIu64,
						 tb->tc->name, done + i);
					rc = -ENOMEM;
					goto out;
				}
				memcpy(ps_table_vals(tb, r), buf + i * rb + sizeof(cr),
				       sizeof(float) * (size_t)tb->row_floats);
			}
			done += n;
			pos += n * rb;
		}
		if (ct.filter_slots) {
			if (read_at(fd, tb->admit.slots, ct.filter_slots * sizeof(uint32_t), pos))
				goto err_read;
			tb->admit.used = 0;
			for (uint64_t i = 0; i < ct.filter_slots; i++)
				tb->admit.used += tb->admit.slots[i] != 0;
		}
		pos += ct.filter_slots * sizeof(uint32_t);
		tb->version = ct.version;
		tb->c.admitted = ct.admitted;
		tb->c.evicted = ct.evicted;
		tb->c.expired = ct.expired;
		tb->admit.lookups = ct.filter_lookups;
		tb->admit.hits = ct.filter_hits;
		tb->admit.decays = ct.filter_decays;
		ps_table_clear_changes(tb);
	}
	goto out;

err_read:
	snprintf(err, errlen, "cannot read: %s", strerror(errno ? errno : EIO));
	rc = PS_EPROTO;
out:
	free(buf);
	return rc;
}
