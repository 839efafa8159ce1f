/* rows.h - a shard's embedding tables and their requests (not a public
 * API; docs/embeddings.md).
 *
 * Each table of the config has a struct ps_table here (table.h) holding the
 * rows whose (table, id) hash names this shard. Row pushes follow the
 * dense rules (docs/consistency.md):
 *  - sync: each worker's push of clock c (one per table and shard; the
 *    client sends one with no ids when it has none here) is copied and
 *    kept; when every live worker has pushed c, or ended it, the gradients
 *    are summed per id in rank order, applied once, and the table's version
 *    becomes c + 1;
 *  - async: applied on arrival; the version counts applied pushes.
 * Row pulls wait for min_version (sync) or the staleness bound (async),
 * like dense pulls. Everything runs on the shard's loop thread.
 */
#ifndef PS_ROWS_H
#define PS_ROWS_H

#include "ps.pb-c.h"
#include "table.h"

struct ps_server;
struct ps_srv_conn;
struct ps_frame;
struct rows_clock;
struct rows_wait;

struct ps_srv_table {
	struct ps_table tb;
	struct rows_clock *pending;  /* sync: clocks not applied yet, ascending */
	uint64_t pending_bytes;      /* gradient bytes they hold */
	int evict_logged;            /* the cap was reached and said so in the log */
};

struct ps_srv_rows {
	int ntables;
	struct ps_srv_table *t;
	struct rows_wait *waiting;   /* row pulls held for their condition */
	uint64_t waiting_bytes;      /* what they hold (limits.max_waiting_bytes_total) */
	float *scratch;              /* PS_MAX_ROW_DIM floats: sums, decoded rows */
	float *probe;                /* a row's copy for ps_table_update_finite */
	/* > 0 only in a re-shard's scratch copy of an old shard: what its
	 * tables keep (table.h), tables declared at run time included */
	int keep_shard, keep_nshards;
};

int ps__rows_init(struct ps_server *s);
void ps__rows_free(struct ps_server *s);
/* decl_tables.c: tables cfg->tables[first..ntables) were just declared:
 * sets them up, every table's cap again (they share the memory budget)
 * and, sync, their versions up to the finished clocks. 0 or -ENOMEM (the
 * new tables are not set up then; the caller undoes the declaration). */
int ps__rows_add_tables(struct ps_server *s, int first);
/* s->cfg was replaced by a copy (declare.c): the tables point into it. */
void ps__rows_rebind(struct ps_server *s);
/* Index of the table named name, or -1. */
int ps__rows_find(const struct ps_server *s, const char *name);

/* Request handlers (conn.c dispatch); f stays the caller's. */
void ps__rows_handle_pull(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PullRows *m,
			  const struct ps_frame *f);
void ps__rows_handle_push(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PushRows *m,
			  const struct ps_frame *f);

/* After the live set or a worker's finished clock changed: applies the
 * sync clocks that became complete and answers the row pulls that may go. */
void ps__rows_advance(struct ps_server *s);
/* sc is closing: its held row pulls go. */
void ps__rows_forget(struct ps_server *s, struct ps_srv_conn *sc);
/* Periodic: drops rows past their table's ttl (not on a backup: it drops
 * what its primary's batches say). */
void ps__rows_tick(struct ps_server *s, double now);
/* Forgets the sync clocks kept and not applied yet (a primary stepping
 * down: their pushes were not acknowledged and come again). */
void ps__rows_drop_pending(struct ps_server *s);
/* Empties every table (and the kept clocks), as at start: before a
 * replication snapshot is restored into them. 0 or -ENOMEM. */
int ps__rows_reset(struct ps_server *s);
/* Fills m->tables (allocated; free with ps__rows_stats_free). checksums:
 * each table's checksum too (it reads every row: seconds for millions of
 * rows, so the answers to a re-shard's stop and a join, which read only
 * clocks, go without: 0 there). */
int ps__rows_stats(const struct ps_server *s, Ps__Stats *m, int checksums);
void ps__rows_stats_free(Ps__Stats *m);

#endif
