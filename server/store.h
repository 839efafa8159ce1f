/* store.h - the parameter slices one shard owns, and how updates reach them.
 *
 * A store holds, for each slice the shard map gives this shard, the weights,
 * the optimizer state and a version. Updates arrive per (worker, clock):
 *  - sync (BSP): gradients of clock c are kept (as references into the
 *    received frames, no copy) until every live worker has pushed clock c
 *    for the slice; they are then summed in rank order (and divided by how
 *    many pushed when the slot's optimizer averages), so the result is
 *    the same bit for bit whatever the arrival order, the optimizer runs
 *    once, with the learning rate the lowest pushing rank gave (declared
 *    groups; else the config's), and the version becomes c + 1. Clocks complete in order. A worker
 *    dropped from the live set (live[r] == 0, its connection gone) is not
 *    waited for; what it pushed before it went is still summed.
 *  - async (SSP): each gradient is applied on arrival (scaled by
 *    1/nworkers when the optimizer averages, with the push's learning
 *    rate); the version counts applied updates.
 * Each slot has its own update rule (ps_slot.opt, .ocfg): the config's
 * optimizer, or the group of its declared tensor.
 * The store never blocks and runs on the shard's loop thread only.
 */
#ifndef PS_STORE_H
#define PS_STORE_H

#include <stdint.h>
#include "config.h"
#include "optimizer.h"
#include "shardmap.h"
#include "transport.h"

/* A received frame shared by the slices it carries. */
struct ps_frame_ref {
	struct ps_frame *frame;
	void *expanded;         /* LZ4 frames: the payload once expanded (freed with the ref) */
	int refs;
};

/* One worker's gradient for one slice, as received: raw float32 (codec 0)
 * or encoded by a codec (codec.h), len bytes at data, inside a frame. */
struct ps_grad {
	const void *data;
	uint64_t len;
	int codec;
	int finite_known;       /* raw: the transport found every value finite */
	int has_lr;             /* lr: the learning rate the push gave the slot's group */
	float lr;
};

struct ps_bucket; /* gradients of one clock, one slice (store.c) */

struct ps_slot {
	const struct ps_slice *slice;
	float *w;
	float *state[PS_OPTIM_MAX_STATE];
	/* its update rule: the config's optimizer, or its tensor's group
	 * (cfg->groups, declared tensors); state has opt->nstate arrays */
	const struct ps_optimizer_ops *opt;
	const struct ps_optim_cfg *ocfg;
	uint64_t version;       /* sync: clocks applied; async: updates applied */
	uint64_t steps;         /* optimizer steps taken */
	struct ps_bucket *pending; /* sync: clocks waiting for workers, ascending */
};

struct ps_store {
	const struct ps_config *cfg;
	const struct ps_shardmap *map;
	const struct ps_optimizer_ops *opt; /* the config's optimizer (cfg->optim) */
	int shard;
	int nslots;
	struct ps_slot *slots;
	int32_t *slot_of;       /* map->nslices entries: slot index or -1 */
	const uint8_t *live;    /* sync: per rank, 1 while the worker counts for the
				   barrier; NULL = every rank (set by the server) */
	const uint64_t *finished; /* sync: per rank, clocks it has ended (its last push
				   of a clock carries end_clock); a rank past clock c
				   is not waited for at c. NULL = not used */
	float *scratch;         /* one slice of sum space */
	float *check;           /* one slice: decoding done to validate a push */
	uint64_t applies;
	uint64_t refused;       /* sync: clocks of a slot not applied, their sum or its
				   update not finite (async pushes are refused by
				   ps_store_check instead) */
	uint64_t *errors;       /* counted there too when set (the shard's errors) */
	double apply_seconds;
	uint64_t bytes_applied;
	/* Told of every change, in order (replication, server/replica_log.c):
	 * an optimizer step on s with gradient g (count floats, valid during
	 * the call only) and settings oc (s's rule, the push's learning rate),
	 * or a version passed over without one. NULL = off. */
	void (*on_apply)(void *arg, struct ps_slot *s, const float *g,
			 const struct ps_optim_cfg *oc);
	void (*on_version)(void *arg, struct ps_slot *s);
	/* sync: rank's gradient g (decoded, count floats) for clock was taken
	 * into s's barrier, before it is summed (replication.forward:
	 * every_push). NULL = off. */
	void (*on_offer)(void *arg, struct ps_slot *s, int rank, uint64_t clock, const float *g);
	void *hook_arg;
};

/* Allocates and initialises the slices of shard `shard` from the seed. */
int ps_store_init(struct ps_store *st, const struct ps_config *cfg,
		  const struct ps_shardmap *map, int shard);
void ps_store_free(struct ps_store *st);

/* The slot of global slice id, or NULL when another shard owns it. */
struct ps_slot *ps_store_slot(struct ps_store *st, uint32_t slice);

/* Offers worker rank's gradient for clock on one slot. g points into fr's
 * frame (count floats); the store takes a reference on fr when it keeps g.
 * Returns 1 when the slot's version changed, 0 when the gradient was kept
 * for later, or PS_ECLOCK (clock already applied or too far ahead),
 * PS_EDUP (this rank already pushed this clock), -ENOMEM. */
int ps_store_offer(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
		   const float *g, struct ps_frame_ref *fr);

/* Same, for a gradient that may be encoded. Its data must have passed
 * ps_store_check. */
int ps_store_offer_grad(struct ps_store *st, struct ps_slot *s, int rank, uint64_t clock,
			const struct ps_grad *g, struct ps_frame_ref *fr);

/* Sync: applies every bucket that became complete, and passes over clocks
 * every live rank has ended, after the live set or a rank's ended clocks
 * changed (a worker left, a clock ended without a push for some slice, a
 * restarted shard learned what its workers ended). Returns how many slots
 * changed version. */
int ps_store_advance(struct ps_store *st);

/* Validates g for slot s before anything is accepted: the length of a raw
 * slice, the whole encoding of an encoded one (decoded into st->check), and
 * that every value is finite; in async mode also that the optimizer's
 * update of s by g, which follows at once, leaves every weight and state
 * value finite. 0, or PS_ESHAPE / PS_EPROTO / PS_ENOFINITE with the reason
 * in err. */
int ps_store_check(struct ps_store *st, const struct ps_slot *s, const struct ps_grad *g,
		   char *err, size_t errlen);

/* Forgets every gradient kept for a later clock (sync), releasing their
 * frames: a shard that stops serving (replication) drops what it had not
 * applied. */
void ps_store_drop_pending(struct ps_store *st);

/* Sync: calls fn with every gradient kept in a barrier (pushed for a clock
 * not applied yet), decoded (count floats, valid during the call only), in
 * slot, clock and rank order: what a backup that joins must be told of
 * again under replication.forward: every_push (server/replica_log.c). */
void ps_store_each_kept(struct ps_store *st,
			void (*fn)(void *arg, struct ps_slot *s, int rank, uint64_t clock,
				   const float *g),
			void *arg);

/* FNV-1a over every owned slice's weights, in slice order. */
uint64_t ps_store_checksum(const struct ps_store *st);

void ps_frame_ref_put(struct ps_frame_ref *fr);

#endif
