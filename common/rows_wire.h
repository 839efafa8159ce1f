/* rows_wire.h - what clients and shards agree on about embedding rows
 * (docs/embeddings.md): where a row lives, its initial value, and how
 * a request's ids travel.
 *
 * A row's shard is the jump consistent hash (jump_hash.h) of a 64-bit mix
 * of (table key, id), so consecutive or clustered ids, and the few most
 * frequent ones, land on shards independently, and from n to n + 1 shards
 * only the rows that land on the new shard move (docs/elastic.md). Initial values come from (seed, table key, id, element)
 * through a counter-based hash, never a shared random stream, so a row
 * created again (after eviction, on another shard count, after a restart)
 * starts from the same values.
 *
 * Ids on the wire are sorted, unique, and delta-varint coded: the first id
 * as an unsigned LEB128 varint, each next one as (id - previous), which is
 * at least 1. A decoder refuses anything else (unsorted, repeated, longer
 * than 10 bytes per varint, overflowing, trailing bytes).
 */
#ifndef PS_ROWS_WIRE_H
#define PS_ROWS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

/* The most bytes one id takes on the wire. */
#define PS_VARINT_MAX 10

/* A table's key: a hash of its name (tables are found by name, not by
 * their place in the config). */
uint64_t ps_rows_table_key(const struct ps_table_cfg *t);

/* The shard (0..nshards-1) holding row id of the table with key tkey. */
int ps_rows_shard(uint64_t tkey, uint64_t id, int nshards);
/* The same under placement (enum ps_placement, shardmap.h): placement 0's
 * multiply-shift places the rows of checkpoints made before jump hashing. */
int ps_rows_shard_placed(uint64_t tkey, uint64_t id, int nshards, int placement);

/* Writes the dim initial values of row id of table t into out. */
void ps_rows_init(const struct ps_config *cfg, int t, uint64_t id, float *out);

/* Encodes n sorted unique ids (delta varint) into out, which holds at least
 * n * PS_VARINT_MAX bytes; returns the bytes written. */
size_t ps_rows_ids_encode(const uint64_t *ids, size_t n, uint8_t *out);

/* Decodes exactly n ids from the len bytes at in into ids. 0, or PS_EPROTO
 * with the reason in why: truncated, a varint over 10 bytes, past 2^64 or
 * padded with a zero byte (one spelling per id list),
 * a delta of 0 after the first id (repeated or unsorted ids), an id past
 * 2^64, or bytes left over. */
int ps_rows_ids_decode(const uint8_t *in, size_t len, size_t n, uint64_t *ids, char *why,
		       size_t whylen);

/* Sorts a copy of the n ids and drops repeats: *uniq (malloc'd, *nuniq
 * entries, ascending) and, for each input position i, where[i] = the index
 * of ids[i] in *uniq. 0 or -ENOMEM. */
int ps_rows_dedup(const uint64_t *ids, size_t n, uint64_t **uniq, size_t *nuniq,
		  uint32_t *where);

#endif
