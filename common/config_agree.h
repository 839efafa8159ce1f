/* config_agree.h - the settings every worker and shard of a cluster must
 * share, beyond the shard map (docs/security.md, docs/operations.md).
 *
 * A worker sends them in its Hello (field settings) as "key=value" lines;
 * the shard compares them with its own and refuses a worker whose config
 * differs, naming the key and both values. The map hash (shardmap.h)
 * already covers where the parameters live (servers, tensors, slice_bytes,
 * table dims and optimizers); these are the settings that decide how they
 * are trained: the data split, the consistency rule and the update rule.
 */
#ifndef PS_CONFIG_AGREE_H
#define PS_CONFIG_AGREE_H

#include <stddef.h>
#include "config.h"

/* Room for the lines of ps_config_agreement. */
#define PS_AGREE_MAX 1024

/* Writes cfg's settings as "key=value\n" lines into buf (len bytes, at
 * least PS_AGREE_MAX). Returns the length written. */
size_t ps_config_agreement(const struct ps_config *cfg, char *buf, size_t len);

/* Compares a peer's lines (theirs, as received: untrusted, any bytes) with
 * mine. 0 when they agree; else PS_ECONFIG with the first key that differs
 * and both values in err ("KEY: the worker has A, shard N has B"). With
 * own_only the shard's value is left out (for a peer that has not proved
 * the secret yet: docs/security.md). */
int ps_config_agreement_diff(const char *mine, const char *theirs, size_t theirs_len,
			     int shard, int own_only, char *err, size_t errlen);

#endif
