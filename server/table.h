/* table.h - one sparse embedding table's rows on one shard
 * (docs/embeddings.md).
 *
 * Layout (apart, as HierarchicalKV keeps them): an open-addressing index
 * of 4-byte row numbers (linear probing, grown at 80% load), per-row
 * metadata (id, recency links, last update time) and the values: each
 * row's dim weights and its optimizer state in one contiguous run of
 * floats. Rows live in chunks of PS_TABLE_CHUNK, so growing never copies
 * them and untouched capacity costs no memory. Two ids never share a row.
 *
 * Rows are kept in order of their last update (a doubly linked list of row
 * numbers): the memory cap drops the least recently updated row, and the
 * time-to-live drops rows from the same end. A dropped row's number is
 * reused; a reused row starts from its id's deterministic initial values
 * and fresh optimizer state. Rows changed since the last checkpoint are
 * marked in a bitmap and dropped ids are remembered (tombstones), so an
 * incremental checkpoint writes only those.
 *
 * Rows are created only by an admitted push (table_admit.c); a pull of an
 * id without a row returns its initial value and creates nothing. Every
 * call runs on the shard's loop thread; nothing blocks.
 */
#ifndef PS_TABLE_H
#define PS_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

#define PS_TABLE_CHUNK_BITS 16
#define PS_TABLE_CHUNK (1u << PS_TABLE_CHUNK_BITS)
#define PS_ROW_NIL UINT32_MAX

/* Admission filter: up to 4-byte slots (24-bit fingerprint, 8-bit count)
 * in buckets of 8, two candidate buckets per id (table_admit.c). */
struct ps_admit {
	uint32_t *slots;
	uint64_t nbuckets;         /* a power of two */
	uint64_t used;             /* slots holding a count */
	uint64_t lookups, hits;    /* pushes of ids without a row; of them, already counted */
	uint64_t decays;           /* times every count was halved to make room */
	uint64_t salt;
};

struct ps_row_meta {
	uint32_t id_lo, id_hi;
	uint32_t prev, next;       /* recency list (newer toward head); free list: next */
	uint32_t stamp;            /* last update, seconds since the table's epoch */
};

struct ps_table_counters {
	uint64_t admitted;         /* rows created */
	uint64_t evicted;          /* rows dropped for the memory cap */
	uint64_t expired;          /* rows dropped by the time-to-live */
	uint64_t pulled, pushed;   /* rows read by pulls, row gradients applied */
};

struct ps_table {
	const struct ps_config *cfg;
	const struct ps_table_cfg *tc;
	int t;                     /* index in cfg->tables */
	uint64_t tkey;             /* ps_rows_table_key */
	int dim, nstate, row_floats;
	uint64_t cap;              /* rows this shard keeps at most: the lower of max_rows'
				      share and budget_rows; 0 = no cap */
	uint64_t budget_rows;      /* rows its share of limits.max_table_bytes holds */
	double epoch;              /* time of stamp 0 */
	uint32_t *index;           /* slots: row number + 1, 0 = empty */
	uint64_t index_mask;
	uint64_t nrows;            /* live rows */
	uint64_t nalloc;           /* row numbers handed out (live + free) */
	uint64_t reserved;         /* new rows promised room (ps_table_reserve) */
	uint32_t nchunks, chunk_cap;
	float **vals;              /* per chunk: PS_TABLE_CHUNK * row_floats */
	struct ps_row_meta **meta; /* per chunk */
	uint64_t **dirty;          /* per chunk: bit per row changed since the last checkpoint */
	uint32_t head, tail;       /* most / least recently updated live row */
	uint32_t free_head;        /* reusable row numbers */
	uint64_t *tombs;           /* ids dropped since the last checkpoint (only with
				      incremental checkpoints); ntombs UINT64_MAX: too
				      many or out of memory, the next one must be full */
	uint64_t ntombs, tomb_cap;
	int track_tombs;
	uint64_t version;          /* sync: clocks applied; async: pushes applied */
	double ckpt_wall;          /* wall-clock time of the checkpoint restored last */
	int keep_nshards;          /* > 0 only in a re-shard's scratch copy of an old shard:
				      restores skip the rows shard keep_shard of keep_nshards
				      will not own (ps_table_keeps), and stamp in whole
				      wall-clock seconds (epoch: a whole second of the wall
				      clock; a row's stamp: its snapshot's second less its
				      age there, never below the newest stamp restored
				      before it), so a row's time of last update is a
				      function of the files alone (server/reshard_rows.c) */
	int keep_shard;
	uint32_t last_stamp;       /* scratch: the newest stamp restored */
	int keep_changes;          /* scratch of a staged re-shard: restores leave the marks
				      of the rows they changed and the ids they dropped, which
				      the staged merge applies (reshard_rows.c) */
	struct ps_admit admit;
	struct ps_table_counters c;
};

/* Sets up table t of cfg for a shard of a cluster of nshards; epoch is the
 * time (ps_now_s) of stamp 0. 0 or -ENOMEM. */
int ps_table_init(struct ps_table *tb, const struct ps_config *cfg, int t, int nshards,
		  double epoch);
void ps_table_free(struct ps_table *tb);

/* Makes room for n more new rows beyond those already promised: the
 * index grown and the chunks allocated that inserting them would need, so
 * that those inserts cannot run out of memory (a shard acknowledges a row
 * push before it applies it). 0, or -ENOMEM with nothing promised.
 * ps_table_unreserve gives the promise back once the rows are in. */
int ps_table_reserve(struct ps_table *tb, uint64_t n);
/* Whether ps_table_reserve(tb, n) would allocate nothing. */
int ps_table_has_room(const struct ps_table *tb, uint64_t n);
void ps_table_unreserve(struct ps_table *tb, uint64_t n);

/* Sets tb's row cap from its max_rows' share and its share of
 * limits.max_table_bytes among cfg's tables (again when tables are
 * declared: the budget is shared by more). Rows past a lowered cap are
 * dropped as new ones come, least recently updated first. */
void ps_table_set_cap(struct ps_table *tb, const struct ps_config *cfg, int nshards);

/* The row number of id, or PS_ROW_NIL. */
uint32_t ps_table_find(const struct ps_table *tb, uint64_t id);

static inline float *ps_table_vals(const struct ps_table *tb, uint32_t r)
{
	return tb->vals[r >> PS_TABLE_CHUNK_BITS] +
	       (size_t)(r & (PS_TABLE_CHUNK - 1)) * (size_t)tb->row_floats;
}

static inline struct ps_row_meta *ps_table_meta(const struct ps_table *tb, uint32_t r)
{
	return &tb->meta[r >> PS_TABLE_CHUNK_BITS][r & (PS_TABLE_CHUNK - 1)];
}

/* Whether row r changed since the last checkpoint (or restore). */
static inline int ps_table_changed(const struct ps_table *tb, uint32_t r)
{
	uint32_t o = r & (PS_TABLE_CHUNK - 1);

	return (int)(tb->dirty[r >> PS_TABLE_CHUNK_BITS][o >> 6] >> (o & 63) & 1);
}

static inline uint64_t ps_row_id(const struct ps_row_meta *m)
{
	return (uint64_t)m->id_hi << 32 | m->id_lo;
}

/* Copies the dim weights of id into out: its row's, or its initial values
 * when it has none. */
void ps_table_read(struct ps_table *tb, uint64_t id, float *out);

/* One push's gradient (dim floats) for id, seen by `sightings` pushes (the
 * workers whose gradients g sums). Counts them in the admission filter
 * while id has no row; creates the row when they reach the table's
 * admission (dropping the least recently updated row at the cap), applies
 * the optimizer and makes the row the most recent. 1 when applied, 0 when
 * only counted, -ENOMEM. */
int ps_table_push(struct ps_table *tb, uint64_t id, const float *g, int sightings, double now);

/* Drops rows not updated for the table's ttl; returns how many. */
uint64_t ps_table_expire(struct ps_table *tb, double now);

/* The last-update stamp of a row updated at now (seconds since the
 * table's epoch). The _at forms take the stamp instead of the time, so a
 * backup repeats the primary's update or expiry exactly (replica_log.c). */
uint32_t ps_table_stamp(const struct ps_table *tb, double now);
int ps_table_push_at(struct ps_table *tb, uint64_t id, const float *g, int sightings,
		     uint32_t stamp);
uint64_t ps_table_expire_at(struct ps_table *tb, uint32_t stamp);

/* FNV-1a of the rows (id, weights and state, least recently updated
 * first), the admission filter's slots and the version: what a primary and
 * its backup must agree on, and what a restart from a checkpoint restores
 * (TableStats.checksum). Stamps are not in it: a checkpoint keeps ages in
 * whole seconds, so a restart may move a stamp by a second. */
uint64_t ps_table_checksum(const struct ps_table *tb);

/* The row for id with its initial values, fresh state and the given stamp,
 * made the most recent (checkpoint restore, and ps_table_push). Existing
 * rows are returned as they are. PS_ROW_NIL when out of memory. */
uint32_t ps_table_insert(struct ps_table *tb, uint64_t id, uint32_t stamp);

/* id's row made again as the most recent one, its values left for the
 * caller to write (an incremental checkpoint's changed row): an old row
 * of id is dropped first. PS_ROW_NIL when out of memory. */
uint32_t ps_table_insert_newest(struct ps_table *tb, uint64_t id, uint32_t stamp);

/* How many ids ahead a loop of insertions or lookups prefetches: enough
 * loads in flight to hide the memory's latency (a 5-million-row restore
 * took 2.2 s of CPU without, 1.1-1.5 s with). */
#define PS_TABLE_PREFETCH_AHEAD 16

/* Bulk insertion of rows that should all be new (a checkpoint restore,
 * the rows a re-shard gathered). A plain insert first looks the id up,
 * and an absent id's search reads the row of every slot it passes: a
 * cache miss each, half of a 10-million-row restore. Here a bitmap of
 * about 8 bits a row, on another hash of the id, answers "certainly new"
 * for most ids; only the others (about 6%) are looked up. A repeated id
 * is reported, not inserted twice. The caller prefetches ahead. */
struct ps_table_bulk {
	uint8_t *seen;
	uint64_t mask;             /* bits - 1 */
};

/* For up to n rows: the bitmap made, and the index grown at once to the
 * size n rows would grow it to (nothing rehashed on the way; not in a
 * re-shard's scratch table, which keeps a share). 0 or -ENOMEM (then
 * ps_table_bulk_end). */
int ps_table_bulk_begin(struct ps_table *tb, struct ps_table_bulk *b, uint64_t n);
/* Starts the loads the insertion of id will need (call some rows ahead). */
void ps_table_bulk_prefetch(const struct ps_table *tb, const struct ps_table_bulk *b,
			    uint64_t id);
/* The new row for id (values unset, as ps_table_insert_newest), or
 * PS_ROW_NIL: *dup 1 when id has a row already, else out of memory. */
uint32_t ps_table_bulk_insert(struct ps_table *tb, struct ps_table_bulk *b, uint64_t id,
			      uint32_t stamp, int *dup);
void ps_table_bulk_end(struct ps_table_bulk *b);

/* Whether a restore keeps id: always, except in a re-shard's scratch
 * table, which keeps only the rows its new shard will own. */
int ps_table_keeps(const struct ps_table *tb, uint64_t id);

/* Drops id's row (restoring a tombstone): 1 when there was one. */
int ps_table_remove(struct ps_table *tb, uint64_t id);

/* Forgets which rows changed and which ids were dropped (after a
 * checkpoint restore: the file is the new base). */
void ps_table_clear_changes(struct ps_table *tb);

/* Bytes one row costs against limits.max_table_bytes (values, metadata,
 * index and bitmap). */
uint64_t ps_table_row_cost(const struct ps_table *tb);

/* Bytes the table holds (index, rows, metadata, bitmap, filter). */
uint64_t ps_table_bytes(const struct ps_table *tb);

/* Row's weights and state at creation (initial values, fresh state). */
void ps_table_row_reset(const struct ps_table *tb, uint64_t id, float *row);

/* table_optim.c: one update of a row (dim weights then nstate floats). */
void ps_row_optim_apply(const struct ps_table_cfg *tc, float *restrict row,
			const float *restrict g);

/* Whether ps_table_push of g for id would leave the row's weights and
 * optimizer state finite, g included (a sum of finite gradients can
 * overflow, and so can FTRL's or adagrad's g*g). Updates a copy in
 * scratch (row_floats floats) of id's row, or of its initial values when
 * it has none; changes nothing in the table. */
int ps_table_update_finite(const struct ps_table *tb, uint64_t id, const float *g, float *scratch);

/* table_admit.c */
int ps_admit_init(struct ps_admit *a, uint64_t ids, uint64_t salt);
void ps_admit_free(struct ps_admit *a);
/* Adds k sightings of id; 1 (and forgets id) when its count reaches need,
 * else 0. */
int ps_admit_sight(struct ps_admit *a, uint64_t id, int k, int need);
/* id's count now (0 when not counted). */
int ps_admit_count(const struct ps_admit *a, uint64_t id);
uint64_t ps_admit_bytes(const struct ps_admit *a);
/* Adds src's counts (a filter of the same size and salt: the same table on
 * another shard) to a, each in the bucket it sat in or its partner; a
 * fingerprint a holds there already shares its count, and a full pair of
 * buckets halves every count as ps_admit_sight does (the count being
 * added too). A re-shard's new shard gathers its old shards' filters so
 * (server/reshard.c). 0, or -EINVAL when the filters differ. */
int ps_admit_merge(struct ps_admit *a, const struct ps_admit *src);

#endif
