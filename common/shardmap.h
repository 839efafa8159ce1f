/* shardmap.h - the deterministic key space (docs/architecture.md, Sharding).
 *
 * Each tensor of the config is cut, in config order, into slices of at most
 * slice_bytes; slices get global ids 0..nslices-1 in that order. Slices are
 * assigned to shards by longest-processing-time greedy (largest slice first,
 * ties by lower id; each to the least-loaded shard, ties by lower shard):
 * computed from the config alone, so every process derives the same map,
 * and shard loads differ by at most one slice. The map's hash travels in the
 * handshake.
 */
#ifndef PS_SHARDMAP_H
#define PS_SHARDMAP_H

#include <stdint.h>
#include "config.h"

struct ps_slice {
	uint32_t id;
	int32_t tensor;     /* index into cfg->tensors */
	int64_t offset;     /* first element inside the tensor */
	int64_t count;      /* elements */
	int32_t shard;
};

struct ps_shardmap {
	int nshards;
	int ntensors;
	uint32_t nslices;
	struct ps_slice *slices;        /* nslices, by id */
	uint32_t *tensor_first;         /* ntensors + 1: slices of tensor t are [first[t], first[t+1]) */
	uint64_t *shard_bytes;          /* nshards: bytes owned by each shard */
	uint64_t hash;
};

/* Builds the map of cfg. Returns 0, -ENOMEM, or PS_ECONFIG (no shards). */
int ps_shardmap_init(struct ps_shardmap *m, const struct ps_config *cfg);
void ps_shardmap_free(struct ps_shardmap *m);

/* Initial value of element i of tensor t, the same on every shard count:
 * a counter-based hash of (seed, tensor index, i), never a shared stream. */
float ps_init_value(const struct ps_config *cfg, int t, int64_t i);

/* FNV-1a 64-bit, used for map hashes and parameter checksums. */
uint64_t ps_fnv1a(uint64_t h, const void *data, size_t len);
#define PS_FNV_OFFSET 0xcbf29ce484222325ull

#endif
