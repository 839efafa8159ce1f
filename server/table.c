/* table.c - one embedding table's rows on one shard: the index, the rows
 * in chunks, their recency order, creation, dropping (cap and TTL) and
 * the tombstones of dropped ids (table.h).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ps_err.h"
#include "rows_wire.h"
#include "table.h"

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Index position of id: a different mix from the shard choice, so the
 * ids of one shard still spread over its index. */
static uint64_t home(const struct ps_table *tb, uint64_t id)
{
	return mix64(id + tb->tkey) & tb->index_mask;
}

uint64_t ps_table_row_cost(const struct ps_table *tb)
{
	/* weights and state, metadata, index slots (at worst 40% load after
	 * a doubling: 2.5 slots of 4 bytes), a bit of the dirty bitmap */
	return sizeof(float) * (uint64_t)tb->row_floats + sizeof(struct ps_row_meta) + 10 + 1;
}

/* Rows table tb may keep within its share of limits.max_table_bytes, its
 * admission filter (a fixed size) taken out first; at least 1. */
static uint64_t budget_rows(const struct ps_table *tb, const struct ps_config *cfg)
{
	uint64_t share = cfg->limits.max_table_bytes / (uint64_t)(cfg->ntables ? cfg->ntables : 1);
	uint64_t filter = 0, n;

	if (tb->tc->admission > 1) {
		uint64_t nb = 1;
		while (nb * 8 < (uint64_t)tb->tc->filter_ids)
			nb *= 2;
		filter = nb * 8 * sizeof(uint32_t);
	}
	n = share > filter ? (share - filter) / ps_table_row_cost(tb) : 0;
	return n < 1 ? 1 : n > PS_ROW_NIL - 1 ? PS_ROW_NIL - 1 : n;
}

void ps_table_set_cap(struct ps_table *tb, const struct ps_config *cfg, int nshards)
{
	const struct ps_table_cfg *tc = tb->tc;

	tb->cap = tc->max_rows ? ((uint64_t)tc->max_rows + (uint64_t)nshards - 1) / (uint64_t)nshards
			       : 0;
	if (tb->cap > PS_ROW_NIL - 1 || !tb->cap)
		tb->cap = tb->cap ? PS_ROW_NIL - 1 : 0;
	/* the shard's memory budget, shared evenly by the tables */
	tb->budget_rows = budget_rows(tb, cfg);
	if (!tb->cap || tb->budget_rows < tb->cap)
		tb->cap = tb->budget_rows;
}

int ps_table_init(struct ps_table *tb, const struct ps_config *cfg, int t, int nshards,
		  double epoch)
{
	const struct ps_table_cfg *tc = &cfg->tables[t];
	int rc;

	memset(tb, 0, sizeof(*tb));
	tb->cfg = cfg;
	tb->tc = tc;
	tb->t = t;
	tb->tkey = ps_rows_table_key(tc);
	tb->dim = tc->dim;
	tb->nstate = ps_row_optim_nstate(tc);
	tb->row_floats = tb->dim + tb->nstate;
	ps_table_set_cap(tb, cfg, nshards);
	tb->epoch = epoch;
	tb->track_tombs = cfg->checkpoint.dir[0] && cfg->checkpoint.incremental > 0;
	tb->head = tb->tail = tb->free_head = PS_ROW_NIL;
	tb->index_mask = 1023;
	tb->index = calloc(tb->index_mask + 1, sizeof(*tb->index));
	if (!tb->index)
		return -ENOMEM;
	if (tc->admission > 1) {
		rc = ps_admit_init(&tb->admit, (uint64_t)tc->filter_ids, mix64(cfg->seed ^ tb->tkey));
		if (rc) {
			free(tb->index);
			return rc;
		}
	}
	return 0;
}

void ps_table_free(struct ps_table *tb)
{
	for (uint32_t k = 0; k < tb->nchunks; k++) {
		free(tb->vals[k]);
		free(tb->meta[k]);
		free(tb->dirty[k]);
	}
	free(tb->vals);
	free(tb->meta);
	free(tb->dirty);
	free(tb->index);
	free(tb->tombs);
	ps_admit_free(&tb->admit);
	memset(tb, 0, sizeof(*tb));
}

uint32_t ps_table_find(const struct ps_table *tb, uint64_t id)
{
	uint64_t i = home(tb, id);

	for (;;) {
		uint32_t v = tb->index[i];
		if (!v)
			return PS_ROW_NIL;
		if (ps_row_id(ps_table_meta(tb, v - 1)) == id)
			return v - 1;
		i = (i + 1) & tb->index_mask;
	}
}

/* Doubles the index (at 80% load). */
static int grow_index(struct ps_table *tb)
{
	uint64_t n = (tb->index_mask + 1) * 2;
	uint32_t *old = tb->index, *idx = calloc(n, sizeof(*idx));
	uint64_t oldn = tb->index_mask + 1;

	if (!idx)
		return -ENOMEM;
	tb->index = idx;
	tb->index_mask = n - 1;
	for (uint64_t j = 0; j < oldn; j++) {
		uint64_t i;
		if (!old[j])
			continue;
		i = home(tb, ps_row_id(ps_table_meta(tb, old[j] - 1)));
		while (idx[i])
			i = (i + 1) & tb->index_mask;
		idx[i] = old[j];
	}
	free(old);
	return 0;
}

/* Removes row r of id from the index: backward-shift deletion, so
 * lookups never need tombstones in the index. */
static void index_remove(struct ps_table *tb, uint64_t id, uint32_t r)
{
	uint64_t i = home(tb, id), j, h;

	while (tb->index[i] != r + 1)
		i = (i + 1) & tb->index_mask;
	j = i;
	for (;;) {
		j = (j + 1) & tb->index_mask;
		if (!tb->index[j])
			break;
		h = home(tb, ps_row_id(ps_table_meta(tb, tb->index[j] - 1)));
		/* move j back to i when its home is not within (i, j] cyclically */
		if (((j - h) & tb->index_mask) >= ((j - i) & tb->index_mask)) {
			tb->index[i] = tb->index[j];
			i = j;
		}
	}
	tb->index[i] = 0;
}

static void lru_unlink(struct ps_table *tb, uint32_t r)
{
	struct ps_row_meta *m = ps_table_meta(tb, r);

	if (m->prev != PS_ROW_NIL)
		ps_table_meta(tb, m->prev)->next = m->next;
	else
		tb->head = m->next;
	if (m->next != PS_ROW_NIL)
		ps_table_meta(tb, m->next)->prev = m->prev;
	else
		tb->tail = m->prev;
}

static void lru_push_head(struct ps_table *tb, uint32_t r)
{
	struct ps_row_meta *m = ps_table_meta(tb, r);

	m->prev = PS_ROW_NIL;
	m->next = tb->head;
	if (tb->head != PS_ROW_NIL)
		ps_table_meta(tb, tb->head)->prev = r;
	tb->head = r;
	if (tb->tail == PS_ROW_NIL)
		tb->tail = r;
}

static void mark_dirty(struct ps_table *tb, uint32_t r)
{
	uint32_t o = r & (PS_TABLE_CHUNK - 1);

	tb->dirty[r >> PS_TABLE_CHUNK_BITS][o >> 6] |= 1ull << (o & 63);
}

/* One more chunk of rows: room for PS_TABLE_CHUNK row numbers past the
 * last chunk's. 0 or -ENOMEM (nothing changed but the spare slots of the
 * chunk arrays). */
static int add_chunk(struct ps_table *tb)
{
	uint32_t k = tb->nchunks;

	if (k >= tb->chunk_cap) {
		uint32_t nc = tb->chunk_cap ? tb->chunk_cap * 2 : 16;
		float **v = realloc(tb->vals, sizeof(*v) * nc);
		if (v)
			tb->vals = v;
		struct ps_row_meta **m = realloc(tb->meta, sizeof(*m) * nc);
		if (m)
			tb->meta = m;
		uint64_t **d = realloc(tb->dirty, sizeof(*d) * nc);
		if (d)
			tb->dirty = d;
		if (!v || !m || !d)
			return -ENOMEM;
		tb->chunk_cap = nc;
	}
	/* malloc, not calloc: rows are written whole when handed out, and
	 * untouched pages of a chunk cost nothing */
	tb->vals[k] = malloc(sizeof(float) * PS_TABLE_CHUNK * (size_t)tb->row_floats);
	tb->meta[k] = malloc(sizeof(struct ps_row_meta) * PS_TABLE_CHUNK);
	tb->dirty[k] = calloc(PS_TABLE_CHUNK / 64, sizeof(uint64_t));
	if (!tb->vals[k] || !tb->meta[k] || !tb->dirty[k]) {
		free(tb->vals[k]);
		free(tb->meta[k]);
		free(tb->dirty[k]);
		return -ENOMEM;
	}
	tb->nchunks = k + 1;
	return 0;
}

/* A fresh row number: a reused one, or the next, in a new chunk when needed. */
static uint32_t new_row(struct ps_table *tb)
{
	if (tb->free_head != PS_ROW_NIL) {
		uint32_t r = tb->free_head;
		tb->free_head = ps_table_meta(tb, r)->next;
		return r;
	}
	if (tb->nalloc >= PS_ROW_NIL - 1)
		return PS_ROW_NIL;
	if ((tb->nalloc >> PS_TABLE_CHUNK_BITS) >= tb->nchunks && add_chunk(tb))
		return PS_ROW_NIL;
	return (uint32_t)tb->nalloc++;
}

/* Rows the table must have room for once n more are promised. */
static uint64_t rows_wanted(const struct ps_table *tb, uint64_t n)
{
	uint64_t want = tb->nrows + tb->reserved + n;

	/* past the cap a new row takes an evicted one's place */
	return tb->cap && want > tb->cap ? tb->cap : want;
}

int ps_table_has_room(const struct ps_table *tb, uint64_t n)
{
	uint64_t want = rows_wanted(tb, n);

	return want * 5 <= (tb->index_mask + 1) * 4 &&
	       (uint64_t)tb->nchunks * PS_TABLE_CHUNK >= want;
}

int ps_table_reserve(struct ps_table *tb, uint64_t n)
{
	uint64_t want = rows_wanted(tb, n);

	if (want >= PS_ROW_NIL - 1)
		return -ENOMEM;
	/* the index as insert_new would grow it, and row numbers: the free
	 * ones and those of the chunks not yet handed out */
	while (want * 5 > (tb->index_mask + 1) * 4)
		if (grow_index(tb))
			return -ENOMEM;
	while ((uint64_t)tb->nchunks * PS_TABLE_CHUNK < want)
		if (add_chunk(tb))
			return -ENOMEM;
	tb->reserved += n;
	return 0;
}

void ps_table_unreserve(struct ps_table *tb, uint64_t n)
{
	tb->reserved -= n < tb->reserved ? n : tb->reserved;
}

void ps_table_row_reset(const struct ps_table *tb, uint64_t id, float *row)
{
	const struct ps_table_cfg *tc = tb->tc;

	ps_rows_init(tb->cfg, tb->t, id, row);
	for (int j = 0; j < tb->nstate; j++)
		row[tb->dim + j] = (tc->optimizer == PS_ROPT_ADAGRAD ||
				    tc->optimizer == PS_ROPT_ROWWISE_ADAGRAD)
				   ? tc->initial_accumulator : 0.0f;
}

/* Remembers a dropped id for the next incremental checkpoint. Bounded:
 * past max(2^20, live rows) dropped ids (or out of memory) the list goes
 * and the next checkpoint is a full one, which needs none. */
static void add_tomb(struct ps_table *tb, uint64_t id)
{
	uint64_t limit = tb->nrows > (1u << 20) ? tb->nrows : (1u << 20);

	if (!tb->track_tombs || tb->ntombs == UINT64_MAX)
		return;
	if (tb->ntombs == tb->tomb_cap) {
		uint64_t n = tb->tomb_cap ? tb->tomb_cap * 2 : 1024;
		uint64_t *p = tb->ntombs < limit ? realloc(tb->tombs, sizeof(*p) * n) : NULL;
		if (!p) {
			/* without the tombstone the next incremental checkpoint would
			 * bring the row back: force a full one instead */
			free(tb->tombs);
			tb->tombs = NULL;
			tb->tomb_cap = 0;
			tb->ntombs = UINT64_MAX;
			return;
		}
		tb->tombs = p;
		tb->tomb_cap = n;
	}
	tb->tombs[tb->ntombs++] = id;
}

/* Drops live row r: out of the index and the recency list, its number
 * free for reuse, its id remembered for the next incremental checkpoint. */
static void drop_row(struct ps_table *tb, uint32_t r)
{
	struct ps_row_meta *m = ps_table_meta(tb, r);
	uint64_t id = ps_row_id(m);
	uint32_t o = r & (PS_TABLE_CHUNK - 1);

	index_remove(tb, id, r);
	lru_unlink(tb, r);
	tb->dirty[r >> PS_TABLE_CHUNK_BITS][o >> 6] &= ~(1ull << (o & 63));
	m->next = tb->free_head;
	m->prev = PS_ROW_NIL;
	tb->free_head = r;
	tb->nrows--;
	add_tomb(tb, id);
}

/* A new row for id, absent from the index; its values unset. */
static uint32_t insert_new(struct ps_table *tb, uint64_t id, uint32_t stamp)
{
	struct ps_row_meta *m;
	uint32_t r;
	uint64_t i;

	if ((tb->nrows + 1) * 5 > (tb->index_mask + 1) * 4 && grow_index(tb))
		return PS_ROW_NIL;
	if (tb->cap && tb->nrows >= tb->cap) {
		drop_row(tb, tb->tail);
		tb->c.evicted++;
	}
	r = new_row(tb);
	if (r == PS_ROW_NIL)
		return r;
	m = ps_table_meta(tb, r);
	m->id_lo = (uint32_t)id;
	m->id_hi = (uint32_t)(id >> 32);
	m->stamp = stamp;
	i = home(tb, id);
	while (tb->index[i])
		i = (i + 1) & tb->index_mask;
	tb->index[i] = r + 1;
	lru_push_head(tb, r);
	mark_dirty(tb, r);
	tb->nrows++;
	return r;
}

uint32_t ps_table_insert_newest(struct ps_table *tb, uint64_t id, uint32_t stamp)
{
	ps_table_remove(tb, id);
	return insert_new(tb, id, stamp);
}

uint32_t ps_table_insert(struct ps_table *tb, uint64_t id, uint32_t stamp)
{
	uint32_t r = ps_table_find(tb, id);

	if (r != PS_ROW_NIL)
		return r;
	r = insert_new(tb, id, stamp);
	if (r != PS_ROW_NIL)
		ps_table_row_reset(tb, id, ps_table_vals(tb, r));
	return r;
}

/* Grows the index at once to the size n live rows would grow it to. */
static int reserve(struct ps_table *tb, uint64_t n)
{
	while (n * 5 > (tb->index_mask + 1) * 4)
		if (grow_index(tb))
			return -ENOMEM;
	return 0;
}

/* The bitmap's bit for id: a mix unrelated to the index's and the shard's. */
static uint64_t bulk_bit(const struct ps_table_bulk *b, uint64_t id)
{
	return mix64(id ^ UINT64_C(0x5bd1e9955bd1e995)) & b->mask;
}

int ps_table_bulk_begin(struct ps_table *tb, struct ps_table_bulk *b, uint64_t n)
{
	uint64_t bits = 1u << 16;

	while (bits < n * 8)
		bits *= 2;
	b->mask = bits - 1;
	b->seen = calloc(bits / 8, 1);
	if (!b->seen)
		return -ENOMEM;
	/* rows already there (none at a restart) are in no bitmap: look every
	 * id up then */
	if (tb->nrows)
		memset(b->seen, 0xff, bits / 8);
	/* a re-shard's scratch table keeps a share of the rows, which its
	 * index grows to as they come */
	if (tb->keep_nshards > 0)
		return 0;
	return reserve(tb, tb->cap && tb->cap < n ? tb->cap : n);
}

void ps_table_bulk_prefetch(const struct ps_table *tb, const struct ps_table_bulk *b,
			    uint64_t id)
{
	__builtin_prefetch(&tb->index[home(tb, id)]);
	__builtin_prefetch(&b->seen[bulk_bit(b, id) >> 3]);
}

uint32_t ps_table_bulk_insert(struct ps_table *tb, struct ps_table_bulk *b, uint64_t id,
			      uint32_t stamp, int *dup)
{
	uint64_t bit = bulk_bit(b, id);
	uint8_t m = (uint8_t)(1u << (bit & 7));

	*dup = 0;
	if ((b->seen[bit >> 3] & m) && ps_table_find(tb, id) != PS_ROW_NIL) {
		*dup = 1;
		return PS_ROW_NIL;
	}
	b->seen[bit >> 3] |= m;
	return insert_new(tb, id, stamp);
}

void ps_table_bulk_end(struct ps_table_bulk *b)
{
	free(b->seen);
	b->seen = NULL;
}

int ps_table_keeps(const struct ps_table *tb, uint64_t id)
{
	return tb->keep_nshards <= 0 ||
	       ps_rows_shard(tb->tkey, id, tb->keep_nshards) == tb->keep_shard;
}

int ps_table_remove(struct ps_table *tb, uint64_t id)
{
	uint32_t r = ps_table_find(tb, id);

	if (r == PS_ROW_NIL)
		return 0;
	drop_row(tb, r);
	return 1;
}

void ps_table_read(struct ps_table *tb, uint64_t id, float *out)
{
	uint32_t r = ps_table_find(tb, id);

	if (r == PS_ROW_NIL)
		ps_rows_init(tb->cfg, tb->t, id, out);
	else
		memcpy(out, ps_table_vals(tb, r), sizeof(float) * (size_t)tb->dim);
	tb->c.pulled++;
}

uint32_t ps_table_stamp(const struct ps_table *tb, double now)
{
	double s = now - tb->epoch;

	return s <= 0 ? 0 : s >= 4e9 ? 4000000000u : (uint32_t)s;
}

int ps_table_push(struct ps_table *tb, uint64_t id, const float *g, int sightings, double now)
{
	return ps_table_push_at(tb, id, g, sightings, ps_table_stamp(tb, now));
}

int ps_table_push_at(struct ps_table *tb, uint64_t id, const float *g, int sightings,
		     uint32_t st)
{
	uint32_t r = ps_table_find(tb, id);

	if (r == PS_ROW_NIL) {
		if (tb->tc->admission > 1 && !ps_admit_sight(&tb->admit, id, sightings,
							     tb->tc->admission))
			return 0;
		r = ps_table_insert(tb, id, st);
		if (r == PS_ROW_NIL)
			return -ENOMEM;
		tb->c.admitted++;
	} else if (r != tb->head) {
		lru_unlink(tb, r);
		lru_push_head(tb, r);
	}
	ps_table_meta(tb, r)->stamp = st;
	ps_row_optim_apply(tb->tc, ps_table_vals(tb, r), g);
	mark_dirty(tb, r);
	tb->c.pushed++;
	return 1;
}

uint64_t ps_table_expire(struct ps_table *tb, double now)
{
	return ps_table_expire_at(tb, ps_table_stamp(tb, now));
}

uint64_t ps_table_expire_at(struct ps_table *tb, uint32_t st)
{
	uint32_t ttl = (uint32_t)tb->tc->ttl_s;
	uint64_t n = 0;

	if (!ttl)
		return 0;
	/* the tail is the least recently updated row: stop at the first that is not old */
	while (tb->tail != PS_ROW_NIL && ps_table_meta(tb, tb->tail)->stamp + (uint64_t)ttl <= st) {
		drop_row(tb, tb->tail);
		n++;
	}
	tb->c.expired += n;
	return n;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

uint64_t ps_table_checksum(const struct ps_table *tb)
{
	uint64_t h = 0xcbf29ce484222325ull;

	h = fnv(h, &tb->version, sizeof(tb->version));
	h = fnv(h, &tb->nrows, sizeof(tb->nrows));
	for (uint32_t r = tb->tail; r != PS_ROW_NIL; r = ps_table_meta(tb, r)->prev) {
		const struct ps_row_meta *m = ps_table_meta(tb, r);
		uint64_t id = ps_row_id(m);
		h = fnv(h, &id, sizeof(id));
		h = fnv(h, ps_table_vals(tb, r), sizeof(float) * (size_t)tb->row_floats);
	}
	if (tb->admit.slots)
		h = fnv(h, tb->admit.slots, sizeof(uint32_t) * tb->admit.nbuckets * 8);
	return h;
}

uint64_t ps_table_bytes(const struct ps_table *tb)
{
	uint64_t per_row = sizeof(float) * (uint64_t)tb->row_floats + sizeof(struct ps_row_meta);

	return (tb->index_mask + 1) * sizeof(uint32_t) + tb->nalloc * per_row +
	       (uint64_t)tb->nchunks * (PS_TABLE_CHUNK / 8) + tb->tomb_cap * sizeof(uint64_t) +
	       ps_admit_bytes(&tb->admit);
}

void ps_table_clear_changes(struct ps_table *tb)
{
	for (uint32_t k = 0; k < tb->nchunks; k++)
		memset(tb->dirty[k], 0, PS_TABLE_CHUNK / 8);
	tb->ntombs = 0;
}
