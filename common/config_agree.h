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
#include <stdint.h>
#include "config.h"

/* Room for the lines of ps_config_agreement. */
#define PS_AGREE_MAX 1024

/* Writes cfg's settings as "key=value\n" lines into buf (len bytes, at
 * least PS_AGREE_MAX). Returns the length written. */
size_t ps_config_agreement(const struct ps_config *cfg, char *buf, size_t len);

/* The lines of ps_config_agreement and what the two processes of a
 * replicated shard must also share, since each makes, evicts and expires
 * rows on its own from the updates it applies: seed,
 * limits.max_table_bytes and a digest of the config's tables' init, value,
 * admission, ttl, max_rows and filter_ids. Sent in a replica's Hello. */
size_t ps_config_agreement_partner(const struct ps_config *cfg, char *buf, size_t len);

/* The lines as sent (Hello.settings): with key (the hashed cluster
 * secret, security.auth) each value is replaced by "#" and a keyed digest
 * of its line, so the Hello shows no setting to a listener; with key NULL
 * (no secret to key it with) the values themselves. Returns the length. */
size_t ps_config_agreement_wire(const char *plain, const uint8_t *key, char *out, size_t len);

/* Compares a peer's lines as sent (theirs: untrusted, any bytes) with
 * mine (plain lines, made wire form with key as above). 0 when they agree;
 * else PS_ECONFIG with the first key that differs in err: "KEY: shard N has
 * B" (digests: the peer adds its own value, ps_config_agreement_own), or
 * "KEY: PEER has A, shard N has B" (plain values), PEER being peer ("the
 * worker", "the partner": the shard's other process). A key only the peer
 * sent is refused too ("shard N has none (its default)"). The shard's value
 * may be told only to a peer that proved the secret (docs/security.md). */
int ps_config_agreement_diff(const char *mine, const uint8_t *key, const char *theirs,
			     size_t theirs_len, int shard, const char *peer, char *err, size_t errlen);

/* A refusal of ps_config_agreement_diff: "; this SELF has A" (self:
 * "worker", "process") for its key from the plain lines, or "" when it
 * names none of them. */
void ps_config_agreement_own(const char *plain, const char *refusal, const char *self,
			     char *out, size_t len);

#endif
