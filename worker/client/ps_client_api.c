/* ps_client_api.c - the parts of the public API (ps_client.h) that let a
 * program use libps without config.h: the opaque config handle and its
 * accessors, the library version, and the waits a binding needs (with a
 * limit, and a test that does not block).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "config.h"
#include "histo.h"
#include "ps_client_int.h"
#include "ps_err.h"

_Static_assert(PS_HISTO_BUCKETS == 28, "ps_client.h's PS_HISTO_BUCKETS must match histo.h's");

#define STR2(x) #x
#define STR(x) STR2(x)

const char *ps_version(void)
{
	return STR(PS_VERSION_MAJOR) "." STR(PS_VERSION_MINOR);
}

int ps_config_open(struct ps_config **out, const char *path, char *err, size_t errlen)
{
	struct ps_config *cfg = malloc(sizeof(*cfg));
	int rc;

	*out = NULL;
	if (!cfg) {
		snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	rc = ps_config_load(cfg, path, err, errlen);
	if (rc) {
		free(cfg);
		return rc;
	}
	*out = cfg;
	return 0;
}

void ps_config_close(struct ps_config *cfg)
{
	free(cfg);
}

int ps_config_declared(const struct ps_config *cfg)
{
	return cfg->declare;
}

int ps_config_ntensors(const struct ps_config *cfg)
{
	return cfg->ntensors;
}

const char *ps_config_tensor_name(const struct ps_config *cfg, int i)
{
	return i >= 0 && i < cfg->ntensors ? cfg->tensors[i].name : NULL;
}

int64_t ps_config_tensor_count(const struct ps_config *cfg, int i)
{
	return i >= 0 && i < cfg->ntensors ? cfg->tensors[i].count : PS_ENOTENSOR;
}

int ps_config_ntables(const struct ps_config *cfg)
{
	return cfg->ntables;
}

const char *ps_config_table_name(const struct ps_config *cfg, int i)
{
	return i >= 0 && i < cfg->ntables ? cfg->tables[i].name : NULL;
}

int ps_config_table_dim(const struct ps_config *cfg, int i)
{
	return i >= 0 && i < cfg->ntables ? (int)cfg->tables[i].dim : PS_ENOTENSOR;
}

int ps_config_nshards(const struct ps_config *cfg)
{
	return cfg->nshards;
}

int ps_config_sync(const struct ps_config *cfg)
{
	return cfg->consistency == PS_SYNC;
}

int ps_config_nworkers(const struct ps_config *cfg)
{
	return cfg->nworkers;
}

int ps_config_staleness(const struct ps_config *cfg)
{
	return cfg->staleness;
}

int ps_config_connect_timeout_ms(const struct ps_config *cfg)
{
	return cfg->limits.connect_timeout_ms;
}

const char *ps_config_path(const struct ps_config *cfg)
{
	return cfg->path;
}

struct ps_tensor ps_tensor_of(const struct ps_config *cfg, int i, float *data)
{
	return (struct ps_tensor){ cfg->tensors[i].name, data, cfg->tensors[i].count, 0 };
}

/* The pending request id of c, or NULL (c->mu held). */
static struct req *pending(struct ps_client *c, int64_t id)
{
	struct req *r;

	for (r = c->reqs; r && r->id != id; r = r->next)
		;
	return r;
}

int ps_client_done(struct ps_client *c, int64_t id)
{
	struct req *r;
	int done;

	pthread_mutex_lock(&c->mu);
	r = pending(c, id);
	done = r ? r->done : -EINVAL;
	pthread_mutex_unlock(&c->mu);
	return done;
}

int ps_client_wait_timeout(struct ps_client *c, int64_t id, double timeout_s)
{
	struct timespec until;
	struct req *r;
	int rc = 0;

	if (timeout_s < 0)
		return ps_client_wait(c, id);
	clock_gettime(CLOCK_MONOTONIC, &until); /* c->cv waits on this clock */
	until.tv_sec += (time_t)timeout_s;
	until.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->mu);
	r = pending(c, id);
	if (!r) {
		pthread_mutex_unlock(&c->mu);
		return ps_client_wait(c, id); /* sets the error text, -EINVAL */
	}
	/* r stays in the list: only ps_client_wait unlinks and frees it. */
	c->sleepers++;
	while (!r->done && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&c->cv, &c->mu, &until);
	c->sleepers--;
	if (!r->done) {
		ps__client_set_err(c, "request %" PRId64 " not complete within %.3f s", id,
				   timeout_s);
		pthread_mutex_unlock(&c->mu);
		return PS_ETIMEDOUT;
	}
	pthread_mutex_unlock(&c->mu);
	return ps_client_wait(c, id);
}
