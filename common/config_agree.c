/* config_agree.c - the settings workers and shards must share
 * (config_agree.h).
 *
 * In: cluster.workers (the data split: each worker trains 1/workers of
 * the data, and the barrier counts them), cluster.replicas, the
 * consistency mode and staleness (when a pull is answered), the optimizer
 * and every hyper-parameter (the update the shard applies: a worker tuned
 * for another lr would train something else without a word), and
 * limits.max_clock_ahead (the window of clocks both sides accept). Each
 * embedding table's optimizer settings, for the same reason (as one digest:
 * a Hello is at most PS_WIRE_HANDSHAKE_MAX bytes).
 * Out: what is each process's own business and works whatever the other
 * side has: addresses (the map hash covers the servers), limits other
 * than max_clock_ahead, compression (every push names its codec), train.*,
 * checkpoint.*, stats.*, log.*, seed (the shards initialise, workers only
 * shuffle their own data); and security.*, which the handshake compares
 * itself.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sodium.h>
#include "auth.h"
#include "config_agree.h"
#include "ps_err.h"
#include "ps_log.h"
#include "shardmap.h" /* ps_fnv1a */

static const char *const consistency_names[] = { "sync", "async" };
static const char *const optim_names[] = { "sgd", "momentum", "adam", "adagrad", "adamw" };
static const char *const row_optim_names[] = { "sgd", "adagrad", "rowwise_adagrad", "adam",
					       "ftrl" };

static const char *name_of(const char *const *names, size_t n, int v)
{
	return v >= 0 && (size_t)v < n ? names[v] : "?";
}

static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*at >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *at, len - *at, fmt, ap);
	va_end(ap);
	if (n > 0)
		*at = *at + (size_t)n < len ? *at + (size_t)n : len - 1;
}

size_t ps_config_agreement(const struct ps_config *cfg, char *buf, size_t len)
{
	const struct ps_optim_cfg *o = &cfg->optim;
	size_t at = 0;

	if (!len)
		return 0;
	buf[0] = 0;
	/* %.9g: a float prints exactly, so equal values print alike */
	put(buf, len, &at, "cluster.workers=%d\ncluster.replicas=%d\nconsistency.mode=%s\n"
	    "consistency.staleness=%d\nlimits.max_clock_ahead=%d\noptimizer.name=%s\n"
	    "optimizer.lr=%.9g\noptimizer.momentum=%.9g\noptimizer.nesterov=%s\n"
	    "optimizer.beta1=%.9g\noptimizer.beta2=%.9g\noptimizer.eps=%.9g\n"
	    "optimizer.weight_decay=%.9g\noptimizer.initial_accumulator=%.9g\n",
	    cfg->nworkers, cfg->replicas,
	    name_of(consistency_names, 2, (int)cfg->consistency), cfg->staleness,
	    cfg->limits.max_clock_ahead, name_of(optim_names, 5, (int)o->kind), (double)o->lr,
	    (double)o->momentum, o->nesterov ? "true" : "false", (double)o->beta1,
	    (double)o->beta2, (double)o->eps, (double)o->weight_decay,
	    (double)o->initial_accumulator);
	/* newer keys only when set, so a config without them agrees with a
	 * peer built before they existed */
	if (o->dampening != 0.0f)
		put(buf, len, &at, "optimizer.dampening=%.9g\n", (double)o->dampening);
	if (o->average)
		put(buf, len, &at, "optimizer.average=true\n");
	if (cfg->initial_workers && cfg->initial_workers != cfg->nworkers)
		put(buf, len, &at, "cluster.initial_workers=%d\n", cfg->initial_workers);
	/* the ctr preset's workers cut one order of the click log by the seed
	 * among them: another seed trains some examples twice, others never */
	if (cfg->seed != 1)
		put(buf, len, &at, "seed=%" PRIu64 "\n", cfg->seed);
	if (cfg->ntables - cfg->ndecl_tables) {
		/* a Hello is at most PS_WIRE_HANDSHAKE_MAX bytes: the tables'
		 * settings travel as one digest of their lines; declared tables
		 * are left out (a worker says hello before it declares them,
		 * and the declaration is compared, server/decl_tables.c) */
		uint64_t h = 1469598103934665603ULL;
		char line[PS_NAME_MAX + 300];

		for (int t = 0; t < cfg->ntables - cfg->ndecl_tables; t++) {
			const struct ps_table_cfg *tb = &cfg->tables[t];
			int n = snprintf(line, sizeof(line), "%s:%s:%.9g:%.9g:%.9g:%.9g:%.9g:%.9g:%.9g:"
					 "%.9g;", tb->name, name_of(row_optim_names, 5, tb->optimizer),
					 (double)tb->lr, (double)tb->eps, (double)tb->beta1,
					 (double)tb->beta2, (double)tb->initial_accumulator,
					 (double)tb->l1, (double)tb->l2, (double)tb->ftrl_beta);
			h = ps_fnv1a(h, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line));
		}
		put(buf, len, &at, "model.embeddings (optimizers)=digest %016" PRIx64 "\n", h);
	}
	return at;
}

size_t ps_config_agreement_partner(const struct ps_config *cfg, char *buf, size_t len)
{
	uint64_t h = 1469598103934665603ULL;
	char line[PS_NAME_MAX + 200];

	if (!len)
		return 0;
	size_t at = ps_config_agreement(cfg, buf, len);
	/* rows are drawn from the seed and created, evicted and expired by
	 * these, each process on its own from the updates it applies */
	if (cfg->seed == 1) /* else among the worker's lines */
		put(buf, len, &at, "seed=1\n");
	put(buf, len, &at, "limits.max_table_bytes=%" PRIu64 "\n", cfg->limits.max_table_bytes);
	for (int t = 0; t < cfg->ntables - cfg->ndecl_tables; t++) {
		const struct ps_table_cfg *tb = &cfg->tables[t];
		int n = snprintf(line, sizeof(line), "%s:%d:%.9g:%d:%d:%" PRId64 ":%" PRId64 ";",
				 tb->name, (int)tb->init, (double)tb->init_value, tb->admission,
				 tb->ttl_s, tb->max_rows, tb->filter_ids);
		h = ps_fnv1a(h, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line));
	}
	if (cfg->ntables - cfg->ndecl_tables)
		put(buf, len, &at, "model.embeddings (rows)=digest %016" PRIx64 "\n", h);
	return at;
}

/* The form of one value on the wire: itself, or with key "#" and 16 hex
 * digits of a BLAKE2b keyed with the cluster secret over "name=value", so
 * that the Hello, sent before any encryption, shows no hyper-parameter to
 * a listener and lets nobody without the secret test guesses. */
static void wire_value(const uint8_t *key, const char *line, size_t linelen, const char *v,
		       size_t vlen, char *out, size_t outlen)
{
	uint8_t h[8];

	if (!key) {
		snprintf(out, outlen, "%.*s", (int)vlen, v);
		return;
	}
	crypto_generichash_state st;

	/* its own domain: no other use of the secret hashes these bytes */
	crypto_generichash_init(&st, key, PS_AUTH_KEY_LEN, sizeof(h));
	crypto_generichash_update(&st, (const uint8_t *)"ps settings\0", 12);
	crypto_generichash_update(&st, (const uint8_t *)line, linelen);
	crypto_generichash_final(&st, h, sizeof(h));
	snprintf(out, outlen, "#%02x%02x%02x%02x%02x%02x%02x%02x", h[0], h[1], h[2], h[3], h[4],
		 h[5], h[6], h[7]);
}

size_t ps_config_agreement_wire(const char *plain, const uint8_t *key, char *out, size_t len)
{
	size_t at = 0;

	if (!len)
		return 0;
	out[0] = 0;
	for (const char *s = plain; *s;) {
		const char *eq = strchr(s, '='), *nl = strchr(s, '\n');
		char v[PS_AGREE_MAX];

		if (!eq || !nl || eq > nl)
			break;
		wire_value(key, s, (size_t)(nl - s), eq + 1, (size_t)(nl - eq) - 1, v, sizeof(v));
		put(out, len, &at, "%.*s=%s\n", (int)(eq - s), s, v);
		s = nl + 1;
	}
	return at;
}

void ps_config_agreement_own(const char *plain, const char *refusal, const char *self,
			     char *out, size_t len)
{
	const char *colon = strchr(refusal, ':');
	size_t keylen = colon ? (size_t)(colon - refusal) : 0;

	out[0] = 0;
	for (const char *s = plain; keylen && *s;) {
		const char *eq = strchr(s, '='), *nl = strchr(s, '\n');

		if (!eq || !nl || eq > nl)
			break;
		if ((size_t)(eq - s) == keylen && memcmp(s, refusal, keylen) == 0) {
			snprintf(out, len, "; this %s has %.*s", self, (int)(nl - eq) - 1, eq + 1);
			return;
		}
		s = nl + 1;
	}
}

/* The value of key (keylen bytes, "key=" included) in lines s (n bytes);
 * NULL when absent. *vlen gets its length. */
static const char *value_of(const char *s, size_t n, const char *key, size_t keylen,
			    size_t *vlen)
{
	const char *end = s + n;

	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		const char *eol = nl ? nl : end;

		if ((size_t)(eol - s) >= keylen && memcmp(s, key, keylen) == 0) {
			*vlen = (size_t)(eol - s) - keylen;
			return s + keylen;
		}
		s = nl ? nl + 1 : end;
	}
	return NULL;
}

int ps_config_agreement_diff(const char *mine, const uint8_t *key, const char *theirs,
			     size_t theirs_len, int shard, const char *peer, char *err, size_t errlen)
{
	const char *s = mine;

	if (!theirs_len) {
		snprintf(err, errlen, "%s sent none of the settings workers and shards must "
			 "share (cluster.workers, consistency, optimizer...): a build older than "
			 "this shard?", peer);
		return PS_ECONFIG;
	}
	while (*s) {
		const char *eq = strchr(s, '='), *nl = strchr(s, '\n');
		size_t keylen, vlen = 0, mylen;
		const char *v;
		char said[100], want[PS_AGREE_MAX];

		if (!eq || !nl || eq > nl)
			break;
		keylen = (size_t)(eq - s) + 1;
		wire_value(key, s, (size_t)(nl - s), eq + 1, (size_t)(nl - eq) - 1, want,
			   sizeof(want));
		mylen = strlen(want);
		v = value_of(theirs, theirs_len, s, keylen, &vlen);
		if (!v || vlen != mylen || memcmp(v, want, mylen) != 0) {
			if (key || !v)
				/* digests: the worker names its own value (it knows it) */
				snprintf(err, errlen, "%.*s: shard %d has %.*s%s%s%s; the two configs "
					 "must agree", (int)keylen - 1, s, shard, (int)(nl - eq) - 1,
					 eq + 1, v ? "" : ", ", v ? "" : peer, v ? "" : " sent none");
			else {
				/* the peer's bytes, escaped: no terminal codes into logs */
				ps_log_escape(said, sizeof(said), v, vlen);
				snprintf(err, errlen, "%.*s: %s has %s, shard %d has %.*s; the two "
					 "configs must agree", (int)keylen - 1, s, peer, said, shard,
					 (int)(nl - eq) - 1, eq + 1);
			}
			return PS_ECONFIG;
		}
		s = nl + 1;
	}
	/* a key only the peer sent: a setting sent only when not its
	 * default (optimizer.dampening, cluster.initial_workers, the tables'
	 * digest...), which this shard has at its default, or one this
	 * build does not know; either way not what the shard does */
	for (const char *t = theirs, *end = theirs + theirs_len; t < end;) {
		const char *nl = memchr(t, '\n', (size_t)(end - t)), *eol = nl ? nl : end;
		const char *eq = memchr(t, '=', (size_t)(eol - t));
		char name[100], said[100];

		size_t mlen;

		if (eq && eq > t && !value_of(mine, strlen(mine), t, (size_t)(eq - t) + 1, &mlen)) {
			ps_log_escape(name, sizeof(name), t, (size_t)(eq - t));
			if (key)
				snprintf(err, errlen, "%s: shard %d has none (its default); the two "
					 "configs must agree", name, shard);
			else {
				ps_log_escape(said, sizeof(said), eq + 1, (size_t)(eol - eq) - 1);
				snprintf(err, errlen, "%s: %s has %s, shard %d has none (its "
					 "default); the two configs must agree", name, peer, said, shard);
			}
			return PS_ECONFIG;
		}
		t = nl ? nl + 1 : end;
	}
	return 0;
}
