/* handshake.h - whether a shard accepts a client's Hello (docs/protocol.md).
 *
 * Pure: it looks only at the Hello and at what the shard is, so the same
 * check serves ps-server and the handshake fuzzer.
 */
#ifndef PS_HANDSHAKE_H
#define PS_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "ps.pb-c.h"

/* 0 when shard `shard` (shard-map hash map_hash) of cfg accepts h; else
 * PS_EREFUSED with the reason, naming both sides' values, in err. */
int ps_hello_check(const struct ps_config *cfg, uint64_t map_hash, int shard, const Ps__Hello *h,
		   char *err, size_t errlen);

#endif
