/* server.c - a shard's life cycle and the state its files share.
 *
 * ps_server_init_from loads the secret and the checkpoint, listens, and starts
 * the timers (the tick of conn.c, periodic checkpoints) and signal
 * handlers; ps_server_stop closes them. Also here: the clocks derived from
 * every worker's finished clock, and the check for a slice named twice in
 * one request, which the push and pull handlers share.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "ps_time.h"
#include "auth.h"
#include "checkpoint.h"
#include "reshard.h"
#include "metrics_http.h"
#include "ps_err.h"
#include "ps_log.h"
#include "replica.h"
#include "rows.h"
#include "members.h"
#include "server_int.h"

/* The slowest finished clock over the live workers (the fastest when none
 * is live): what the async staleness bound and a rejoining worker's clock
 * are measured against. */
uint64_t ps__srv_min_finished(const struct ps_server *s)
{
	uint64_t m = UINT64_MAX;

	for (int r = 0; r < s->cfg->nworkers; r++)
		if (s->live[r] && ps__members_counted(s, r) < m)
			m = ps__members_counted(s, r); /* a leaving rank: frozen (members.h) */
	if (m == UINT64_MAX) { /* nobody live: the fastest clock */
		m = 0;
		for (int r = 0; r < s->cfg->nworkers; r++)
			if (s->finished[r] > m)
				m = s->finished[r];
	}
	return m;
}

/* Starts a request's check for slices named twice (each may appear once
 * in a push or a pull: a repeated one would multiply the work and, in a
 * pull, the reply). */
void ps__srv_seen_reset(struct ps_server *s)
{
	if (++s->seen_gen == 0) {
		memset(s->seen, 0, sizeof(*s->seen) * (size_t)s->store.nslots);
		s->seen_gen = 1;
	}
}

/* 1 when slot sl was already named by the current request. */
int ps__srv_seen_twice(struct ps_server *s, const struct ps_slot *sl)
{
	size_t i = (size_t)(sl - s->store.slots);

	if (s->seen[i] == s->seen_gen)
		return 1;
	s->seen[i] = s->seen_gen;
	return 0;
}

/* The clock a (re)connecting worker continues from (HelloReply.clock). */
uint64_t ps__srv_resume_clock(const struct ps_server *s)
{
	uint64_t v = UINT64_MAX;

	if (s->cfg->consistency == PS_SYNC)
		for (int k = 0; k < s->store.nslots; k++)
			v = s->store.slots[k].version < v ? s->store.slots[k].version : v;
	if (v == UINT64_MAX)
		v = ps__srv_min_finished(s);
	return v;
}

/* SIGUSR1: a re-shard's pre-copy (admin.c). */
static void on_precopy(uv_signal_t *h, int signum)
{
	(void)signum;
	ps__srv_precopy(h->data);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct ps_server *s = h->data;

	ps_info("received %s, stopping", signum == SIGINT ? "SIGINT" : "SIGTERM");
	if (s->ckpt_job && !s->stopping) {
		/* the background write finishes first, then the last checkpoint
		 * is written and the shard stops (admin.c ckpt_done) */
		ps_info("waiting for the checkpoint being written");
		s->ckpt_final = signum == SIGINT ? "SIGINT" : "SIGTERM";
		return;
	}
	if (s->ckpt_path[0] && !s->stopping) {
		char err[512];
		uint64_t bytes;
		double secs;

		if (ps__srv_write_checkpoint(s, signum == SIGINT ? "SIGINT" : "SIGTERM", &bytes,
					     &secs, err, sizeof(err)))
			s->exit_status = 1;
	}
	ps_server_stop(s);
}

/* The address shard binds: its servers entry, or with cluster.listen_any
 * every address of the family of that entry (an IPv6 literal: ::). */
static const char *listen_host(const struct ps_config *cfg, int shard, int replica)
{
	const struct ps_endpoint *ep;

	ep = ps_config_replica_addr(cfg, shard, replica);
	if (!cfg->listen_any)
		return ep->host;
	return strchr(ep->host, ':') ? "::" : "0.0.0.0";
}

/* What to do about a listen that failed with rc. */
static const char *listen_hint(int rc)
{
	switch (rc) {
	case PS_ERESOLVE:
		return " on this host; give an address in cluster.servers, add the name to DNS or "
		       "/etc/hosts, or set cluster.listen_any: true";
	case -EADDRINUSE:
		return "; another process holds the port (a shard of the same config still "
		       "running? `ss -ltnp` names it)";
	case -EADDRNOTAVAIL:
		return "; the address is not one of this host's: run shard K on the host of "
		       "cluster.servers[K], or set cluster.listen_any: true";
	default:
		return "";
	}
}

/* A re-shard (from): the old cluster's checkpoints give this shard its
 * state, unless its own checkpoint is of this map already (written by an
 * earlier start of the same re-shard, which it resumes from). Then, with
 * cluster.replicas: 1, the new map's checkpoint is written at once,
 * before serving (each process of a new pair holds the state on its own
 * disk before the pair forms; 1); else the marker naming the old files is
 * written and the checkpoint is written in the background once the shard
 * serves (2): a restart before it is written takes the old files again,
 * the same state, so serving first loses nothing a checkpoint written
 * first would keep. 0 when its own checkpoint is to be loaded, or a
 * negative code (logged). */
static int start_reshard(struct ps_server *s, const struct ps_reshard_from *from)
{
	char err[1200];
	uint64_t have = 0, bytes;
	double secs;
	int rc = ps_checkpoint_map_hash(s->ckpt_path, &have, err, sizeof(err));

	if (!rc && have == s->map.hash) {
		/* written by an earlier start of this re-shard when newer than
		 * the old checkpoints; else left by an older run of this map */
		char old[1100];
		struct stat a, b;

		snprintf(old, sizeof(old), "%s/shard-0.ckpt", from->dir);
		if (s->cfg->replicas && stat(old, &b)) /* the pair's other file */
			snprintf(old, sizeof(old), "%s/shard-0-r1.ckpt", from->dir);
		if (stat(s->ckpt_path, &a) || stat(old, &b) || a.st_mtim.tv_sec > b.st_mtim.tv_sec ||
		    (a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec >= b.st_mtim.tv_nsec)) {
			ps_info("%s is of this shard map and newer than %s (an earlier start of this "
				"re-shard wrote it): resuming from it", s->ckpt_path, old);
			return 0;
		}
		ps_warn("%s is of this shard map but older than %s: left by an earlier run, "
			"not this re-shard's; re-sharding over it", s->ckpt_path, old);
	}
	if (rc && rc != -ENOENT && rc != PS_EPROTO) {
		ps_error("refusing to start: %s", err);
		return rc;
	}
	rc = ps__reshard_load(s, from, err, sizeof(err));
	if (!rc) {
		s->ckpt_loaded = 1;
		s->ckpt_last_ok = ps_now_s();
		rc = ps__members_load(s, err, sizeof(err));
	}
	if (rc) {
		ps_error("refusing to start: %s", err);
		return rc;
	}
	if (!s->cfg->replicas) {
		rc = ps__reshard_marker_write(s, from, err, sizeof(err));
		if (rc) {
			ps_error("refusing to start: %s", err);
			return rc;
		}
		return 2;
	}
	rc = ps__srv_write_checkpoint(s, "re-shard", &bytes, &secs, err, sizeof(err));
	if (rc) {
		ps_error("refusing to start: the re-sharded state's checkpoint: %s", err);
		return rc;
	}
	return 1;
}

int ps_server_init_from(struct ps_server *s, const struct ps_config *cfg, int shard,
			int replica, uv_loop_t *loop, const struct ps_reshard_from *from)
{
	const struct ps_transport_ops *ops;
	struct ps_transport_cbs cbs = {
		.on_accept = ps__srv_on_accept,
		.on_frame = ps__srv_on_frame,
		.on_close = ps__srv_on_close,
	};
	struct ps_wire_limits hs = {
		.max_frame = PS_WIRE_HANDSHAKE_MAX, .max_meta = PS_WIRE_HANDSHAKE_MAX,
		.max_queue = cfg->limits.max_write_queue,
		.max_queue_total = cfg->limits.max_queued_bytes,
	};
	const char *host = listen_host(cfg, shard, replica);
	const struct ps_endpoint *addr;
	char err[1200], bound[PS_HOST_MAX + 16];
	char path_buf[1100], marker_dir[PATH_MAX];
	struct ps_reshard_from marked;
	int rc, resharded = 0;

	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->shard = shard;
	s->replica = replica;
	s->loop = loop;
	s->started = ps_now_s();
	addr = ps_config_replica_addr(cfg, shard, replica);
	ops = ps_transport_for(cfg, err, sizeof(err), &rc);
	if (!ops) {
		ps_error("%s", err);
		return rc;
	}
	rc = ps_shardmap_init_placed(&s->map, cfg, PS_PLACE_GREEDY);
	if (rc)
		return rc;
	s->old_place_hash = s->map.hash;
	ps_shardmap_free(&s->map);
	rc = ps_shardmap_init(&s->map, cfg);
	if (rc)
		return rc;
	rc = ps_store_init(&s->store, cfg, &s->map, shard);
	if (rc)
		goto err_free_map;
	s->store.errors = &s->c.errors; /* clocks refused as not finite count there */
	s->finished = calloc((size_t)cfg->nworkers, sizeof(*s->finished));
	s->connected = calloc((size_t)cfg->nworkers, sizeof(*s->connected));
	s->live = malloc((size_t)cfg->nworkers);
	s->gone_since = calloc((size_t)cfg->nworkers, sizeof(*s->gone_since));
	s->dedup = calloc((size_t)cfg->nworkers, sizeof(*s->dedup));
	s->stop_held = calloc((size_t)cfg->nworkers, sizeof(*s->stop_held));
	s->seen = calloc((size_t)(s->store.nslots ? s->store.nslots : 1), sizeof(*s->seen));
	rc = ps__rows_init(s);
	if (rc)
		goto err_free_store;
	ps_auth_random((uint8_t *)&s->boot_id, sizeof(s->boot_id));
	if (!s->finished || !s->connected || !s->live || !s->gone_since || !s->dedup || !s->stop_held ||
	    !s->seen) {
		rc = -ENOMEM;
		goto err_free_store;
	}
	/* every rank is waited for until it has been seen to leave */
	memset(s->live, 1, (size_t)cfg->nworkers);
	rc = ps__members_init(s); /* ranks that join later are not */
	if (rc)
		goto err_free_store;
	s->store.live = s->live;
	s->store.finished = s->finished;
	if (cfg->security.auth) {
		rc = ps_auth_load_secret(cfg, s->secret, err, sizeof(err));
		if (!rc && cfg->replicas)
			rc = ps_auth_load_repl_key(cfg, s->secret, s->repl_key, err, sizeof(err));
		ps_auth_reader_key_path(cfg, path_buf, sizeof(path_buf));
		if (!rc && path_buf[0]) {
			rc = ps_auth_load_reader_key(cfg, s->secret, s->reader_key, err, sizeof(err));
			s->have_reader_key = !rc;
		}
		if (rc) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		}
	} else {
		ps_warn("security.auth is false: any process that reaches %s:%d may push and pull",
			cfg->shards[shard].host, cfg->shards[shard].port);
	}
	if (from && !cfg->checkpoint.dir[0]) {
		ps_error("refusing to start: --reshard-from needs checkpoint.dir in the config (the "
			 "new shards' checkpoints go there)");
		rc = PS_ECONFIG;
		goto err_free_store;
	}
	if (cfg->checkpoint.dir[0]) {
		ps_checkpoint_path(cfg->checkpoint.dir, shard, s->ckpt_path, sizeof(s->ckpt_path));
		if (replica) /* the backup's own file: both may share a folder */
			snprintf(s->ckpt_path + strlen(s->ckpt_path) - 5,
				 sizeof(s->ckpt_path) - strlen(s->ckpt_path) + 5, "-r1.ckpt");
		/* found out now, not when the checkpoint at stop fails */
		rc = ps_checkpoint_check_dir(cfg->checkpoint.dir, s->ckpt_path, err, sizeof(err));
		if (rc) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		}
		/* a re-shard whose first checkpoint was not written: its marker
		 * names the old files, taken again (the same state) */
		rc = from || replica ? 0 : ps__reshard_marker_read(s, &marked, marker_dir,
								     sizeof(marker_dir), err,
								     sizeof(err));
		if (rc < 0) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		}
		if (rc) {
			ps_warn("%s: a re-shard from %d shards did not write this shard's first "
				"checkpoint: taking the old checkpoints in %s again", s->reshard_marker,
				marked.nshards, marked.dir);
			from = &marked;
		}
		rc = from ? start_reshard(s, from) : 0;
		if (rc < 0)
			goto err_free_store;
		resharded = rc;
		rc = rc ? 0 : ps_checkpoint_load(s, s->ckpt_path, err, sizeof(err));
		if (s->ckpt_loaded) {
			/* re-sharded */
		} else if (rc == -ENOENT) {
			ps_info("no checkpoint at %s: starting from the seed", s->ckpt_path);
		} else if (rc) {
			ps_error("refusing to start: %s", err);
			goto err_free_store;
		} else {
			rc = ps_checkpoint_load_deltas(s, s->ckpt_path, err, sizeof(err));
			if (rc < 0) {
				ps_error("refusing to start: %s", err);
				goto err_free_store;
			}
			s->ckpt_loaded = 1;
			s->ckpt_last_ok = ps_now_s();
			rc = ps__members_load(s, err, sizeof(err));
			if (rc) {
				ps_error("refusing to start: %s", err);
				goto err_free_store;
			}
			ps_info("resumed from %s%s%.0d%s: clock %" PRIu64, s->ckpt_path,
				rc ? " and " : "", rc, rc ? " incremental checkpoints" : "",
				ps__srv_resume_clock(s));
		}
	}
	/* SIGINT and SIGTERM caught before the shard listens: one that comes
	 * once a peer can connect (a launcher that stops what it saw
	 * listening) stops it cleanly, its checkpoint written, at the loop's
	 * first turn, not by the signal's default action during the rest of
	 * this set-up */
	uv_signal_init(loop, &s->sigint);
	uv_signal_init(loop, &s->sigterm);
	uv_signal_init(loop, &s->sigusr1);
	s->sigint.data = s->sigterm.data = s->sigusr1.data = s;
	uv_signal_start(&s->sigint, on_signal, SIGINT);
	uv_signal_start(&s->sigterm, on_signal, SIGTERM);
	uv_signal_start(&s->sigusr1, on_precopy, SIGUSR1);
	rc = ops->create(loop, &cbs, &hs, s, &s->transport);
	if (rc)
		goto err_close_signals;
	rc = ops->listen(s->transport, host, addr->port);
	if (rc) {
		ps_error("cannot listen on %s:%d%s: %s%s", host, addr->port,
			 cfg->listen_any ? " (cluster.listen_any)" : "", ps_strerror(rc),
			 listen_hint(rc));
		goto err_destroy_transport;
	}
	if (!ops->bound_addr || ops->bound_addr(s->transport, bound, sizeof(bound)))
		snprintf(bound, sizeof(bound), "%s:%d", host, addr->port);
	if (cfg->replicas) {
		rc = ps__repl_init(s, replica);
		if (rc)
			goto err_destroy_transport;
	}
	if (cfg->stats.http[0]) {
		/* shard k serves its metrics on the configured port + k, its
		 * backup on port + shards + k, unless stats.port_per_shard is
		 * off (a host each); the loader checked the address */
		struct ps_endpoint ep = { .port = 0 };
		const char *why;
		int port = 0;

		int off = cfg->stats.port_per_shard ? shard + replica * cfg->nshards : 0;

		if (ps_endpoint_parse(cfg->stats.http, &ep, &why) ||
		    (port = ep.port + off) > 65535) {
			ps_error("stats.http '%s': shard %d would serve on port %d, outside 1..65535",
				 cfg->stats.http, shard, ep.port + off);
			rc = -EINVAL;
			goto err_destroy_transport;
		}
		rc = ps_metrics_http_start(s, ep.host, port, &s->http);
		if (rc)
			goto err_destroy_transport;
	}
	uv_timer_init(loop, &s->ckpt_timer);
	s->ckpt_timer.data = s;
	if (s->ckpt_path[0] && cfg->checkpoint.every_s > 0)
		uv_timer_start(&s->ckpt_timer, ps__srv_on_ckpt_timer,
			       (uint64_t)cfg->checkpoint.every_s * 1000,
			       (uint64_t)cfg->checkpoint.every_s * 1000);
	uv_timer_init(loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, ps__srv_on_tick, 200, 200);
	/* the address bound, so a name that resolved to loopback (a hosts
	 * entry of 127.0.1.1) shows in the log */
	ps_info("shard %d of %d listening on %s (%s[%d] %s:%d%s): %d slices, %.1f MiB, %s, "
		"%s, map %016" PRIx64, shard, cfg->nshards, bound, replica ? "backups" : "servers",
		shard, addr->host, addr->port, cfg->listen_any ? ", cluster.listen_any" : "",
		s->store.nslots, (double)s->map.shard_bytes[shard] / 1048576.0,
		cfg->consistency == PS_SYNC ? "sync" : "async", ps_optim_name(cfg->optim.kind),
		s->map.hash);
	/* the re-sharded state's own checkpoint, now that it serves */
	if (resharded == 2 && ps__srv_ckpt_start_full(s, "re-shard"))
		ps_warn("the re-sharded state's checkpoint did not start: the next one writes "
			"it; until then %s names the old checkpoints", s->reshard_marker);
	return 0;

err_destroy_transport:
	ps__repl_stop(s);
	s->transport->ops->destroy(s->transport);
	s->transport = NULL;
err_close_signals:
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigusr1, NULL);
	uv_run(loop, UV_RUN_NOWAIT);
	ps__repl_free(s);
err_free_store:
	free(s->finished);
	free(s->connected);
	free(s->live);
	free(s->gone_since);
	free(s->dedup);
	free(s->stop_held);
	free(s->seen);
	ps__members_free(s);
	ps__rows_free(s);
	ps_store_free(&s->store);
err_free_map:
	ps_shardmap_free(&s->map);
	/* declared tensors or tables adopted from a checkpoint before its load
	 * failed: the shard's own config copy (s->cfg points to it; the caller
	 * uses s no more) */
	free(s->decl_cfg);
	s->decl_cfg = NULL;
	return rc;
}

void ps_server_stop(struct ps_server *s)
{
	if (s->stopping)
		return;
	s->stopping = 1;
	uv_close((uv_handle_t *)&s->ckpt_timer, NULL);
	ps_metrics_http_stop(s->http);
	s->http = NULL;
	uv_close((uv_handle_t *)&s->tick, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigusr1, NULL);
	ps__repl_stop(s);
	s->transport->ops->destroy(s->transport);
}

void ps_server_free(struct ps_server *s)
{
	struct ps_waiting_pull *p;

	while ((p = s->waiting)) {
		s->waiting = p->next;
		free(p);
	}
	free(s->finished);
	free(s->connected);
	free(s->live);
	free(s->gone_since);
	free(s->dedup);
	free(s->stop_held);
	free(s->seen);
	ps__members_free(s);
	ps__repl_free(s);
	ps__rows_free(s);
	ps_store_free(&s->store);
	ps_shardmap_free(&s->map);
	free(s->decl_cfg);
	s->decl_cfg = NULL;
}
