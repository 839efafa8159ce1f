/* jump_hash.h - jump consistent hash (Lamping and Veach, "A Fast, Minimal
 * Memory, Consistent Hash Algorithm", 2014): the row placement that
 * re-sharding needs (docs/elastic.md), so that going from n to n + 1 shards
 * moves only the keys that land on the new shard, about 1/(n + 1) of them,
 * instead of the multiply-shift placement's (used before, placement 0) half
 * or more.
 *
 * The rows' placement (ps_rows_shard, placement PS_PLACE_HRW of
 * shardmap.h); tests/check_jump.c measures what it moves.
 */
#ifndef PS_JUMP_HASH_H
#define PS_JUMP_HASH_H

#include <stdint.h>

/* The bucket 0..n-1 of key (n >= 1): from n to n + 1 buckets a key either
 * stays or moves to bucket n. O(log n), no table. Well mixed keys only (a
 * 64-bit hash of the row's table and id). */
static inline int ps_jump_hash(uint64_t key, int n)
{
	int64_t b = -1, j = 0;

	while (j < n) {
		b = j;
		key = key * 2862933555777941757ULL + 1;
		j = (int64_t)((double)(b + 1) * ((double)(1LL << 31) / (double)((key >> 33) + 1)));
	}
	return (int)b;
}

#endif
