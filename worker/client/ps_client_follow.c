/* ps_client_follow.c - a worker that keeps running across a re-shard
 * (docs/elastic.md, "Re-sharding while the workers run"), and the
 * monitor's request that stops the shards for one (ps_client_stop_at).
 *
 * $PS_CONFIG_FOLLOW names a small file holding the path of the cluster's
 * current config (one line; relative to the file's folder when
 * relative). ps-local.sh writes it for the workers it starts and
 * rewrites it when it re-shards; anyone else can do the same. Without it
 * nothing here runs and a worker refused for another shard map fails as
 * before.
 *
 * The shards stop at a clock B (server/stop.c): the pushes for B and later
 * are refused with PS_ERESHARD and kept here, unacknowledged; then the
 * shards exit and the worker reconnects. While every shard is lost the
 * I/O thread's tick reads the pointer file; when it names another config
 * (or the same one rewritten) which differs from the config this client
 * first had in cluster.servers only, the client takes it: a new shard map,
 * new connections (the old ones are all gone), and every request still
 * waiting cut again for the new map under the same id:
 *
 *   - a push none of whose parts was acknowledged is cut again from the
 *     bytes its slices were encoded into (ps_client_recut.c: an
 *     error-feedback residual is not counted twice): it was refused
 *     (clock >= B) everywhere, so it was applied nowhere, and the new
 *     shards, starting from the checkpoints at B, apply it once;
 *   - a push with some part acknowledged was for a clock below B, which
 *     every old shard closed before its checkpoint: it is in the new
 *     shards' state, and completes;
 *     (A push below B whose acknowledgements were all lost as the old
 *     shards exited is built again too; a new shard's HelloReply clock,
 *     B, says it holds that clock, and the part completes there unsent:
 *     ps_client_conn.c.)
 *   - a pull is asked again of the new owners of its slices;
 *   - row pushes and pulls the same way (ps_client_rows.c): a row push
 *     none of whose parts was acknowledged is built again from its parts
 *     as sent (the caller's ids and gradients were copied at the call),
 *     one with a part acknowledged was for a clock below B and completes,
 *     and a row pull asks its rows not answered yet of their new owners;
 *   - any other request in flight fails with PS_EMAP, and the call that
 *     made it starts it again on the new map (the caller sees none of
 *     it): a declaration of tensors or tables is built again for the new
 *     map and sent to every new shard (ps_client_declare.c), a stats or
 *     checkpoint request is asked again of the new map's shard of that
 *     index (ps_client_req.c; one the new map lacks fails with PS_EMAP),
 *     a join or leave starts again from the first new shard
 *     (ps_client_members.c).
 *
 * Refused here, with the reason in the log and in the error the requests
 * end with once the reconnects time out: a config that differs in more
 * than cluster.servers (the key named) and one that does not load.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "codec.h"
#include "ps_time.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_log.h"

/* The config path the pointer file names now ("" on error, with why). */
static int read_pointer(const char *ptr, char *out, size_t len, char *why, size_t wl)
{
	FILE *f = fopen(ptr, "r");
	char line[1024], *e;

	out[0] = 0;
	if (!f) {
		snprintf(why, wl, "$PS_CONFIG_FOLLOW: cannot read %s: %m", ptr);
		return -errno;
	}
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	for (e = line + strlen(line); e > line && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ');)
		*--e = 0;
	if (!line[0]) {
		snprintf(why, wl, "$PS_CONFIG_FOLLOW: %s is empty: it holds the path of the "
			 "cluster's current config", ptr);
		return PS_ECONFIG;
	}
	if (line[0] != '/' && strrchr(ptr, '/'))
		snprintf(out, len, "%.*s/%s", (int)(strrchr(ptr, '/') - ptr), ptr, line);
	else
		snprintf(out, len, "%s", line);
	return 0;
}

static int64_t mtime_ns(const char *path)
{
	struct stat st;

	if (stat(path, &st))
		return -1;
	return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

int ps__client_follow_init(struct ps_client *c, char *err, size_t errlen)
{
	const char *ptr = getenv("PS_CONFIG_FOLLOW");
	char why[1200];

	if (c->rank < 0 || !ptr || !ptr[0])
		return 0;
	if (read_pointer(ptr, c->follow_cur, sizeof(c->follow_cur), why, sizeof(why))) {
		snprintf(err, errlen, "%s", why);
		return PS_ECONFIG;
	}
	c->follow_path = strdup(ptr);
	c->file_cfg = malloc(sizeof(*c->file_cfg));
	if (!c->follow_path || !c->file_cfg)
		return -ENOMEM;
	*c->file_cfg = *c->cfg;
	c->follow_mtime_ns = mtime_ns(c->follow_cur);
	return 0;
}

/* A declaration replaced the client's own config (c->mu held): the old
 * copy is kept until ps_client_free, as other threads may still read it.
 * It joins the configs a followed re-shard replaced; out of memory for
 * that list it takes old_cfg's slot, and only when that is taken too (a
 * third replacement, out of memory) is it left unfreed: never freed early. */
void ps__client_retire_cfg(struct ps_client *c, struct ps_config *old)
{
	struct ps_config **ret;

	if (!old)
		return;
	ret = realloc(c->retired, sizeof(*ret) * (size_t)(c->nretired + 1));
	if (ret) {
		c->retired = ret;
		c->retired[c->nretired++] = old;
	} else if (!c->old_cfg) {
		c->old_cfg = old;
	}
}

void ps__client_follow_free(struct ps_client *c)
{
	for (int i = 0; i < c->nretired; i++)
		free(c->retired[i]);
	free(c->retired);
	free(c->file_cfg);
	free(c->follow_path);
}

int ps__client_config_diff(const struct ps_config *a, const struct ps_config *b, char *key,
			   size_t len)
{
	char *da = NULL, *db = NULL;
	size_t la = 0, lb = 0;
	FILE *fa = open_memstream(&da, &la), *fb = open_memstream(&db, &lb);
	int diff = 0;

	if (!fa || !fb) {
		if (fa)
			fclose(fa);
		if (fb)
			fclose(fb);
		free(da);
		free(db);
		snprintf(key, len, "(out of memory)");
		return 1;
	}
	ps_config_dump(a, fa);
	ps_config_dump(b, fb);
	/* a memory stream whose last realloc fails closes with 0 and a NULL
	 * buffer (glibc): compared below, that would crash */
	int closed = (fclose(fa) == 0) & (fclose(fb) == 0);
	if (!closed || !da || !db) {
		free(da);
		free(db);
		snprintf(key, len, "(out of memory)");
		return 1;
	}
	const char *sec = "";
	int nsec = 0;
	for (char *pa = da, *pb = db; pa && pb && *pa && *pb;) {
		char *ea = strchr(pa, '\n'), *eb = strchr(pb, '\n');
		size_t na = ea ? (size_t)(ea - pa) : strlen(pa), nb = eb ? (size_t)(eb - pb) : strlen(pb);
		if (na != nb || memcmp(pa, pb, na)) {
			/* named as SECTION.KEY: VALUE, the dump's nesting undone */
			const char *l = pb;
			while (*l == ' ' && l < pb + nb)
				l++;
			snprintf(key, len, "%.*s%s%.*s", l > pb ? nsec : 0, sec, l > pb ? "." : "",
				 (int)(nb - (size_t)(l - pb) < 200 ? nb - (size_t)(l - pb) : 200), l);
			diff = 1;
			break;
		}
		if (nb && pb[0] != ' ' && pb[nb - 1] == ':') {
			sec = pb; /* a section's line: "optimizer:" */
			nsec = (int)nb - 1;
		}
		pa = ea ? ea + 1 : NULL;
		pb = eb ? eb + 1 : NULL;
	}
	if (!diff && strcmp(da, db)) {
		snprintf(key, len, "(the end of the config)");
		diff = 1;
	}
	free(da);
	free(db);
	return diff;
}

/* Loads the config at path and checks it differs from c->file_cfg in
 * cluster.servers only (train.* aside): a new config of the client's (its declared
 * tensors and tables kept) in *out, or a code with why. */
static int load_new(struct ps_client *c, const char *path, struct ps_config **out, char *why,
		    size_t wl)
{
	struct ps_config *n = malloc(sizeof(*n)), *nc = NULL;
	char err[600], key[256];
	int rc;

	if (!n)
		return -ENOMEM;
	rc = ps_config_load(n, path, err, sizeof(err));
	if (rc) {
		snprintf(why, wl, "the re-shard's config %s does not load: %s", path, err);
		goto out_free;
	}
	/* compared with the servers of the first config: what else differs */
	struct ps_config cmp = *n;
	cmp.nshards = c->file_cfg->nshards;
	memcpy(cmp.shards, c->file_cfg->shards, sizeof(cmp.shards));
	cmp.nbackups = c->file_cfg->nbackups;
	memcpy(cmp.backups, c->file_cfg->backups, sizeof(cmp.backups));
	snprintf(cmp.path, sizeof(cmp.path), "%s", c->file_cfg->path);
	/* and the train section: this worker's own loop, which its command
	 * line may have set (ps-worker --epochs, --batch, --limit, --device)
	 * and which the new config does not change (it takes the servers) */
	cmp.train = c->file_cfg->train;
	if (ps__client_config_diff(c->file_cfg, &cmp, key, sizeof(key))) {
		rc = PS_ECONFIG;
		snprintf(why, wl, "the re-shard's config %.400s differs from %.400s in more "
			 "than cluster.servers (first: '%.120s'): a re-shard changes "
			 "cluster.servers only", path, c->file_cfg->path, key);
		goto out_free;
	}
	nc = malloc(sizeof(*nc));
	if (!nc) {
		rc = -ENOMEM;
		goto out_free;
	}
	*nc = *c->cfg; /* declared tensors and tables kept */
	nc->nshards = n->nshards;
	memcpy(nc->shards, n->shards, sizeof(nc->shards));
	nc->nbackups = n->nbackups;
	memcpy(nc->backups, n->backups, sizeof(nc->backups));
	snprintf(nc->path, sizeof(nc->path), "%s", n->path);
	*out = nc;
out_free:
	free(n);
	return rc;
}

/* nc becomes cur (the client's config, its declared tensors and tables)
 * with nc's servers. */
static void take_servers(struct ps_config *nc, const struct ps_config *cur)
{
	struct ps_config *n = malloc(sizeof(*n));

	if (!n)
		return; /* load_new's copy, which is the same but for a declaration
			 * completed in these microseconds */
	*n = *cur;
	n->nshards = nc->nshards;
	memcpy(n->shards, nc->shards, sizeof(n->shards));
	n->nbackups = nc->nbackups;
	memcpy(n->backups, nc->backups, sizeof(n->backups));
	snprintf(n->path, sizeof(n->path), "%s", nc->path);
	*nc = *n;
	free(n);
}

/* Cuts r, waiting, again for the new map (c->cfg, c->map); or completes
 * or fails it (see the top). Its parts are replaced in every case, so
 * that r->nparts == c->cfg->nshards. 1 when it is sent again. c->mu held. */
static int recut(struct ps_client *c, struct req *r, struct part *old, int nold)
{
	int acked = 0, rc = 0;
	char rwhy[300] = "";

	for (int k = 0; k < nold; k++)
		acked |= old[k].meta && !old[k].waiting;
	r->pending = 0;
	if (r->done)
		return 0;
	if ((r->kind == REQ_PUSH || r->kind == REQ_PUSH_ROWS) && acked) {
		r->done = 1; /* for a clock below the stop: in the new shards' state */
		return 0;
	}
	r->recut = 1;
	if (r->kind == REQ_PUSH)
		rc = ps__client_push_recut(c, r, old, nold);
	else if (r->kind == REQ_PULL)
		rc = ps__client_pull_parts(c, r);
	else if (r->kind == REQ_PUSH_ROWS || r->kind == REQ_PULL_ROWS)
		rc = ps__client_rows_recut(c, r, old, nold, rwhy, sizeof(rwhy));
	else
		rc = PS_EMAP;
	if (!rc)
		for (int k = 0; k < r->nparts; k++)
			r->pending += r->parts[k].waiting;
	/* a new request for the new shards: its full time from now */
	r->deadline = ps_now_s() + c->cfg->limits.request_timeout_ms / 1000.0;
	if (rc || !r->pending) {
		r->status = rc;
		if (rc && !r->why) {
			char why[500];
			snprintf(why, sizeof(why), "the shards were re-sharded (%d now) while this "
				 "request was in flight%s%.300s", c->cfg->nshards,
				 rc == PS_EMAP ? ": its call starts it again on the new map" :
				 rwhy[0] ? ": " : "", rc == PS_EMAP ? "" : rwhy);
			r->why = strdup(why);
		}
		r->done = 1;
		return 0;
	}
	return 1;
}

/* Takes the new config nc (c->mu held, maplock held for writing; every
 * shard lost with no connection). 0, or a code with nothing changed. */
static int switch_map(struct ps_client *c, struct ps_config *nc, char *why, size_t wl)
{
	struct ps_shardmap nm;
	struct shard_conn *nsh;
	struct ps_config **ret;
	int old_n = c->cfg->nshards, npush = 0, npull = 0, nfail = 0, rc;
	uint64_t done = UINT64_MAX;
	double now = ps_now_s();

	rc = ps_shardmap_init(&nm, nc);
	if (rc) {
		snprintf(why, wl, "cannot build the shard map of %s: %s", nc->path, ps_strerror(rc));
		return rc;
	}
	nsh = calloc((size_t)nc->nshards, sizeof(*nsh));
	ret = realloc(c->retired, sizeof(*ret) * (size_t)(c->nretired + 1));
	if (!nsh || !ret) {
		free(nsh);
		if (ret)
			c->retired = ret;
		ps_shardmap_free(&nm);
		return -ENOMEM;
	}
	c->retired = ret;
	/* every request gets its parts for the new shard count */
	int nreq = 0;
	for (struct req *r = c->reqs; r; r = r->next)
		nreq++;
	struct part **newparts = calloc((size_t)(nreq ? nreq : 1), sizeof(*newparts));
	if (!newparts) {
		free(nsh);
		ps_shardmap_free(&nm);
		return -ENOMEM;
	}
	for (int i = 0; i < nreq; i++)
		if (!(newparts[i] = calloc((size_t)nc->nshards, sizeof(struct part)))) {
			for (int j = 0; j < i; j++)
				free(newparts[j]);
			free(newparts);
			free(nsh);
			ps_shardmap_free(&nm);
			return -ENOMEM;
		}
	/* the point of no return: the new config and map */
	for (int k = 0; k < old_n; k++) {
		if (c->shards[k].done_clock < done)
			done = c->shards[k].done_clock;
		free(c->shards[k].hello);
	}
	free(c->shards);
	c->shards = nsh;
	for (int k = 0; k < nc->nshards; k++) {
		/* lost, to be dialed now: requests are sent again once ready;
		 * gen 1 so that a failed attempt is retried (will_retry) and
		 * the parts (gen 0) count as not sent on it */
		nsh[k].state = SH_RETRY;
		nsh[k].retry_at = now;
		nsh[k].lost_at = now;
		nsh[k].backoff = 0.1;
		nsh[k].gen = 1;
		nsh[k].done_clock = done == UINT64_MAX ? 0 : done;
	}
	/* the config replaced, when the client's own: other threads may
	 * still read it (the caller's stays the caller's) */
	c->retired[c->nretired++] = c->own_cfg == c->cfg ? c->own_cfg : NULL;
	c->own_cfg = nc;
	c->cfg = nc;
	ps_shardmap_free(&c->map);
	c->map = nm;
	c->nready = c->nfailed = 0;
	int i = 0;
	for (struct req *r = c->reqs; r; r = r->next, i++) {
		struct part *old = r->parts;
		int nold = r->nparts;
		r->parts = newparts[i];
		r->nparts = nc->nshards;
		if (recut(c, r, old, nold))
			r->kind == REQ_PUSH || r->kind == REQ_PUSH_ROWS ? npush++ : npull++;
		else if (r->status)
			nfail++;
		for (int k = 0; k < nold; k++) {
			free(old[k].meta);
			free(old[k].iov);
			free(old[k].enc);
		}
		free(old);
	}
	free(newparts);
	/* frames a waiting thread read off the old connections: gone with
	 * them (their shard numbers are of the old map) */
	while (c->deferred) {
		struct deferred *d = c->deferred;
		c->deferred = d->next;
		ps_frame_release(d->f);
		free(d);
	}
	c->deferred_tail = &c->deferred;
	/* nothing queued stays for the old map: every part is sent on the
	 * new connections once they are ready (resend) */
	for (struct req *r = c->sendq_head; r; r = r->send_next)
		r->queued = 0;
	c->sendq_head = c->sendq_tail = NULL;
	c->reshards++;
	ps_warn("re-shard: following %s: %d shard(s), were %d; %d push(es) and %d pull(s) "
		"waiting are sent again on the new map%s", nc->path, nc->nshards, old_n, npush,
		npull, nfail ? " (other requests in flight are started again by their calls)" :
		"");
	pthread_cond_broadcast(&c->cv);
	return 0;
}

void ps__client_follow_tick(struct ps_client *c)
{
	char path[1024], why[1200];
	struct ps_config *nc = NULL;
	int64_t mt;
	int lost = 1, rc;

	if (!c->follow_path)
		return;
	pthread_mutex_lock(&c->mu);
	for (int k = 0; k < c->cfg->nshards && lost; k++)
		lost = c->shards[k].lost_at > 0 && c->shards[k].state == SH_RETRY &&
		       !c->shards[k].conn;
	pthread_mutex_unlock(&c->mu);
	if (!lost || c->stopping)
		return;
	if (read_pointer(c->follow_path, path, sizeof(path), why, sizeof(why)))
		goto refused;
	mt = mtime_ns(path);
	if (!strcmp(path, c->follow_cur) && mt == c->follow_mtime_ns)
		return; /* the same config: the shards are restarting, or not there yet */
	rc = load_new(c, path, &nc, why, sizeof(why));
	if (rc)
		goto refused;
	pthread_rwlock_wrlock(&c->maplock); /* no push or pull is being built */
	pthread_mutex_lock(&c->mu);
	/* the client's config now, with the new servers: a declaration may
	 * have replaced it since load_new copied it */
	take_servers(nc, c->cfg);
	lost = !c->stopping;
	for (int k = 0; k < c->cfg->nshards && lost; k++)
		lost = c->shards[k].lost_at > 0 && c->shards[k].state == SH_RETRY &&
		       !c->shards[k].conn;
	rc = lost ? switch_map(c, nc, why, sizeof(why)) : 1;
	pthread_mutex_unlock(&c->mu);
	pthread_rwlock_unlock(&c->maplock);
	if (rc) {
		free(nc);
		if (rc == 1)
			return; /* a shard came back meanwhile: looked at again next tick */
		goto refused;
	}
	snprintf(c->follow_cur, sizeof(c->follow_cur), "%s", path);
	c->follow_mtime_ns = mt;
	c->follow_refused[0] = 0;
	return;

refused:
	if (strcmp(why, c->follow_refused)) {
		ps_error("re-shard: not followed: %s", why);
		snprintf(c->follow_refused, sizeof(c->follow_refused), "%s", why);
	}
}

/* ---- the calls that start a request again on the new map ---- */

uint64_t ps__client_reshards(struct ps_client *c)
{
	uint64_t n;

	pthread_mutex_lock(&c->mu);
	n = c->reshards;
	pthread_mutex_unlock(&c->mu);
	return n;
}

int ps__client_again_on_new_map(struct ps_client *c, const char *what, uint64_t gen,
				double *since)
{
	double now = ps_now_s(), limit = c->cfg->limits.reconnect_timeout_ms > 0 ?
					     c->cfg->limits.reconnect_timeout_ms / 1000.0 : 60.0;
	uint64_t now_gen;
	int n;

	pthread_mutex_lock(&c->mu);
	now_gen = c->reshards;
	n = c->cfg->nshards;
	pthread_mutex_unlock(&c->mu);
	if (now_gen == gen)
		return 0;
	if (!*since)
		*since = now;
	if (now - *since > limit)
		return 0;
	ps_warn("worker %d: the shards were re-sharded during %s: it starts again on the new map "
		"(%d shard(s))", c->rank, what, n);
	return 1;
}

/* ---- the monitor's side: a shard's stop (server/stop.c) ---- */

/* The stop request; with check, a commit only if the shard's declared
 * tensors and tables are decl. */
static int stop_at(struct ps_client *c, int shard, uint64_t clock, unsigned flags, int check,
		   uint64_t decl, struct ps_shard_stats *out, size_t size)
{
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct ps_shard_stats *full = out;
	struct req *r;
	int64_t id;
	int rc;

	if (!out || size < offsetof(struct ps_shard_stats, uptime_s) || shard < 0 ||
	    shard >= c->cfg->nshards || (!clock && !(flags & PS_STOP_CANCEL)))
		return -EINVAL;
	if (size != sizeof(*out) && !(full = calloc(1, sizeof(*full))))
		return -ENOMEM;
	r = ps__client_req_new(c, REQ_STATS);
	if (!r) {
		rc = -ENOMEM;
		goto out_copy;
	}
	r->stats = full;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.stop_at = flags & PS_STOP_CANCEL ? 0 : clock;
	m.stop_commit = (flags & PS_STOP_COMMIT) != 0;
	m.stop_cancel = (flags & PS_STOP_CANCEL) != 0;
	m.stop_decl_check = check != 0;
	m.stop_decl = decl;
	if (ps__client_pack_part(&r->parts[shard], &m.base)) {
		ps__client_req_free(c, r);
		rc = -ENOMEM;
		goto out_copy;
	}
	id = ps__client_submit_built(c, 0, r);
	rc = id < 0 ? (int)id : ps_client_wait(c, id);
out_copy:
	if (full != out) {
		/* the program's struct, of another build's size */
		memcpy(out, full, size < sizeof(*full) ? size : sizeof(*full));
		if (size > sizeof(*full))
			memset((char *)out + sizeof(*full), 0, size - sizeof(*full));
		free(full);
	}
	return rc;
}

int ps_client_stop_at_sized(struct ps_client *c, int shard, uint64_t clock, unsigned flags,
			    struct ps_shard_stats *out, size_t size)
{
	return stop_at(c, shard, clock, flags, 0, 0, out, size);
}

int ps__client_stop_commit(struct ps_client *c, int shard, uint64_t clock, uint64_t decl,
			   struct ps_shard_stats *out)
{
	return stop_at(c, shard, clock, PS_STOP_COMMIT, 1, decl, out, sizeof(*out));
}
