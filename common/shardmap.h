/* shardmap.h - the deterministic key space (docs/architecture.md, Sharding).
 *
 * Each tensor of the config is cut, in config order, into slices of at most
 * slice_bytes; slices get global ids 0..nslices-1 in that order. Slices are
 * assigned to shards by rendezvous (highest random weight) hashing with
 * bounded loads (docs/elastic.md): largest first (ties by id), each slice
 * goes to the shard of highest weight mix(slice id, shard index) among
 * those it leaves within (1 + 1/10) * total / nshards bytes, else to the
 * least loaded. Computed from the config alone, so every process derives
 * the same map; a shard holds at most 10% over the mean, or the mean plus
 * one slice when slices are that big; from n to n + 1 shards the slices
 * whose top choice becomes the new shard move, and those the bound
 * displaces. The map's hash, which travels in the handshake, covers the
 * placement's id, so a process of another placement is refused.
 *
 * Placement 0 (PS_PLACE_GREEDY) is the one before re-sharding: slices by
 * longest-processing-time greedy (largest first, each to the least-loaded
 * shard), rows by multiply-shift. It is built only to read checkpoints
 * made with it (server/reshard.c re-places them); its hash is the one
 * those files hold.
 */
#ifndef PS_SHARDMAP_H
#define PS_SHARDMAP_H

#include <stdint.h>
#include "config.h"

/* How slices and rows find their shard. */
enum ps_placement {
	PS_PLACE_GREEDY = 0,    /* before re-sharding: greedy slices, multiply-shift rows */
	PS_PLACE_HRW = 1,       /* rendezvous slices (bounded loads), jump-hashed rows */
};
/* The placement every process uses. */
#define PS_PLACEMENT PS_PLACE_HRW
/* The load bound of rendezvous placement: a shard takes a slice only when
 * it then holds at most (1 + 1/PS_HRW_SLACK) * total / nshards bytes
 * (unless no shard can). */
#define PS_HRW_SLACK 10

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
	int placement;                  /* enum ps_placement */
};

/* Builds the map of cfg (placement PS_PLACEMENT). Returns 0, -ENOMEM, or
 * PS_ECONFIG (no shards). */
int ps_shardmap_init(struct ps_shardmap *m, const struct ps_config *cfg);
/* The same with another placement (reading old checkpoints). */
int ps_shardmap_init_placed(struct ps_shardmap *m, const struct ps_config *cfg, int placement);
void ps_shardmap_free(struct ps_shardmap *m);

/* Initial value of element i of tensor t, the same on every shard count:
 * a counter-based hash of (seed, tensor index, i), never a shared stream. */
float ps_init_value(const struct ps_config *cfg, int t, int64_t i);

/* FNV-1a 64-bit, used for map hashes and parameter checksums. */
uint64_t ps_fnv1a(uint64_t h, const void *data, size_t len);
#define PS_FNV_OFFSET 0xcbf29ce484222325ull

#endif
