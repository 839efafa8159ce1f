/* handshake.c - whether a shard accepts a client's Hello (handshake.h). */
#include <inttypes.h>
#include <stdio.h>
#include "handshake.h"
#include "ps_err.h"
#include "wire.h"

int ps_hello_check(const struct ps_config *cfg, uint64_t map_hash, int shard, const Ps__Hello *h,
		   char *err, size_t errlen)
{
	if (h->protocol_version != PS_PROTOCOL_VERSION)
		snprintf(err, errlen, "protocol version mismatch: client speaks %u, shard %d speaks %u",
			 h->protocol_version, shard, PS_PROTOCOL_VERSION);
	else if (h->shard_map_hash != map_hash)
		snprintf(err, errlen,
			 "shard map mismatch: client has %016" PRIx64 ", shard %d has %016" PRIx64
			 " (the configs differ in servers, tensors, slice_bytes or embedding tables; "
			 "after a re-shard, start this process again with the new config)",
			 h->shard_map_hash, shard, map_hash);
	else if (h->shard != shard)
		snprintf(err, errlen, "wrong shard: client expected shard %d, this is shard %d",
			 h->shard, shard);
	else if (h->role == PS__ROLE__ROLE_WORKER && (h->rank < 0 || h->rank >= cfg->nworkers))
		snprintf(err, errlen, "worker rank %d outside 0..%d (cluster.workers is %d)",
			 h->rank, cfg->nworkers - 1, cfg->nworkers);
	else if (h->role == PS__ROLE__ROLE_REPLICA && !cfg->replicas)
		snprintf(err, errlen, "a replica of shard %d dialed, but cluster.replicas is 0 here; "
			 "the two configs must agree", shard);
	else if (h->role == PS__ROLE__ROLE_REPLICA &&
		 (h->replica < 0 || h->replica > 1 || h->repl_state > PS__REPL_STATE__REPL_PRIMARY))
		snprintf(err, errlen, "replica %d in state %u: expected replica 0 or 1", h->replica,
			 h->repl_state);
	else if (h->role == PS__ROLE__ROLE_REPLICA &&
		 (h->epoch >= PS_MAX_CLOCK || h->lsn >= PS_MAX_CLOCK))
		snprintf(err, errlen, "replica %d at epoch %" PRIu64 ", batch %" PRIu64 ": out of "
			 "range (at most 2^53 - 1)", h->replica, h->epoch, h->lsn);
	else if (h->role != PS__ROLE__ROLE_WORKER && h->role != PS__ROLE__ROLE_STAT &&
		 h->role != PS__ROLE__ROLE_REPLICA && h->role != PS__ROLE__ROLE_READER)
		snprintf(err, errlen, "unknown role %d", (int)h->role);
	else if (h->done_clock >= PS_MAX_CLOCK)
		/* the shard adopts it as the worker's finished clock: bounded so
		 * that no clock arithmetic built on it can wrap */
		snprintf(err, errlen, "done_clock %" PRIu64 " out of range (at most 2^53 - 1)",
			 h->done_clock);
	else
		return 0;
	return PS_EREFUSED;
}
