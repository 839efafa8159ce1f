/* reshard.c - a new shard takes what it owns from the checkpoints of a
 * cluster with another number of shards (reshard.h).
 *
 * Each old shard j is rebuilt in a scratch struct ps_server of the old
 * map (this config with N shards, of the placement its files were made
 * with) and loaded by ps_checkpoint_load and ps_checkpoint_load_deltas,
 * so its file gets every check a restart gives it; then what the new map
 * gives this shard is copied out and the scratch shard freed before the
 * next is read: memory is this shard plus one old one plus the rows
 * moving in. A staged start (the pre-copy, reshard_stage.c) loads every
 * old shard's scratch shard before the stop, merges their rows into this
 * shard's tables then (reshard_rows.c), and hands the scratch shards,
 * brought up to the stop, to the merge here (ps__reshard_merge), which
 * takes the dense state and the rest from them and applies only the
 * stop's changed rows to the tables: memory is then this shard twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reshard.h"
#include "reshard_int.h"
#include "rows.h"
#include "rows_wire.h"
#include "server.h"
#include "server_int.h"

#define FAIL(code, ...) do { snprintf(err, errlen, __VA_ARGS__); rc = (code); goto out; } while (0)

/* A shard of the old map, set up only to load its checkpoint; its tables
 * keep only the rows shard keep of keep_n (the new map) will own, so a
 * new shard inserts its share of each old file's rows, not all of them. */
int ps__reshard_old_open(struct ps_server *o, const struct ps_config *cfg, int shard, int placement,
		    int keep, int keep_n)
{
	int nw = cfg->nworkers, rc;

	memset(o, 0, sizeof(*o));
	o->cfg = cfg;
	o->shard = shard;
	rc = ps_shardmap_init_placed(&o->map, cfg, placement);
	if (rc)
		return rc;
	rc = ps_store_init(&o->store, cfg, &o->map, shard);
	if (rc)
		return rc;
	o->store.errors = &o->c.errors;
	o->finished = calloc((size_t)nw, sizeof(*o->finished));
	o->live = malloc((size_t)nw);
	o->seen = calloc((size_t)(o->store.nslots ? o->store.nslots : 1), sizeof(*o->seen));
	if (!o->finished || !o->live || !o->seen)
		return -ENOMEM;
	memset(o->live, 1, (size_t)nw);
	o->store.live = o->live;
	o->store.finished = o->finished;
	rc = ps__rows_init(o);
	if (!rc && o->rows) {
		/* tables declared at run time, made by the file's load, too */
		o->rows->keep_shard = keep;
		o->rows->keep_nshards = keep_n;
	}
	for (int t = 0; !rc && o->rows && t < o->rows->ntables; t++) {
		o->rows->t[t].tb.keep_shard = keep;
		o->rows->t[t].tb.keep_nshards = keep_n;
	}
	return rc;
}

void ps__reshard_old_close(struct ps_server *o)
{
	free(o->finished);
	free(o->live);
	free(o->seen);
	ps__rows_free(o);
	ps_store_free(&o->store);
	ps_shardmap_free(&o->map);
	free(o->decl_cfg);
	memset(o, 0, sizeof(*o));
}

/* Whether old shard j's admission filters may count ids that are shard
 * k's now. Jump hashing moves rows from n to n + 1 shards only onto the
 * new ones, and from n to m < n only off the removed ones; from the
 * placement before it, any shard may hold anything. */
static int filter_source(int j, int k, int old_n, int new_n, int old_placement)
{
	if (old_placement != PS_PLACE_HRW)
		return 1;
	if (new_n >= old_n)
		return k < old_n ? j == k : 1;
	return j == k || j >= new_n;
}

/* The membership file of the old cluster (any old shard's: it holds facts
 * the whole cluster agreed on; that beside old shard 0's checkpoint
 * ckpt0) becomes this shard's, so ps__members_load takes it back. 0 when
 * there is none. */
static int copy_members(const struct ps_server *s, const char *ckpt0, char *err, size_t errlen)
{
	char from[PATH_MAX + 32], to[700], tmp[720];
	size_t n = strlen(s->ckpt_path), len = 0, n0 = strlen(ckpt0);
	char *buf = NULL;
	FILE *f;
	int rc = 0;

	/* beside the old shard 0's checkpoint taken (shard-0 or shard-0-r1) */
	snprintf(from, sizeof(from), "%.*s.members", (int)(n0 - 5), ckpt0);
	snprintf(to, sizeof(to), "%.*s.members", (int)(n - 5), s->ckpt_path);
	f = fopen(from, "r");
	if (!f) {
		if (errno == ENOENT) {
			unlink(to); /* an older run's, of another membership */
			return 0;
		}
		snprintf(err, errlen, "%s: %s", from, strerror(errno));
		return -errno;
	}
	buf = malloc(1 << 20);
	if (buf)
		len = fread(buf, 1, 1 << 20, f);
	fclose(f);
	if (!buf || len == 1 << 20) {
		free(buf);
		snprintf(err, errlen, "%s: %s", from, buf ? "over 1 MiB: not a membership file" :
			 "out of memory");
		return buf ? PS_EPROTO : -ENOMEM;
	}
	snprintf(tmp, sizeof(tmp), "%s.reshard", to);
	f = fopen(tmp, "w");
	if (!f || fwrite(buf, 1, len, f) != len || fflush(f) || fsync(fileno(f))) {
		rc = -errno;
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
	}
	if (f && fclose(f) && !rc) {
		rc = -errno;
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
	}
	if (!rc && rename(tmp, to)) {
		rc = -errno;
		snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, to, strerror(errno));
	}
	free(buf);
	return rc;
}

/* The placement old shard 0's file was made with: its map hash is that of
 * this config with n shards under one of them. */
int ps__reshard_find_placement(const struct ps_config *ocfg, const char *path, int n, char *err,
			  size_t errlen)
{
	uint64_t h, want[2] = { 0, 0 };
	int rc = ps_checkpoint_map_hash(path, &h, err, errlen);

	if (rc == -ENOENT)
		snprintf(err, errlen, "%s is missing: re-sharding from %d shards needs every old "
			 "shard's checkpoint, shard-0.ckpt to shard-%d.ckpt", path, n, n - 1);
	if (rc)
		return rc;
	for (int p = PS_PLACE_HRW; p >= PS_PLACE_GREEDY; p--) {
		struct ps_shardmap m;
		rc = ps_shardmap_init_placed(&m, ocfg, p);
		if (rc) {
			snprintf(err, errlen, "cannot build the old shard map: %s", ps_strerror(rc));
			return rc;
		}
		want[p] = m.hash;
		ps_shardmap_free(&m);
		if (h == want[p])
			return p;
	}
	snprintf(err, errlen, "%s: its shard map %016" PRIx64 " is not that of this config with %d "
		 "shards (%016" PRIx64 ", or %016" PRIx64 " as placed before re-sharding): it was "
		 "made for another number of shards, or the model, slice_bytes or tables differ",
		 path, h, n, want[PS_PLACE_HRW], want[PS_PLACE_GREEDY]);
	return PS_ECONFIG;
}

/* How far the state of a loaded old shard has come: its workers' finished
 * clocks, its slices' versions and its tables' versions summed. Each only
 * grows, so of the two files of one pair the larger is the newer state. */
static uint64_t progress_of(const struct ps_server *o)
{
	uint64_t p = 0;

	for (int r = 0; r < o->cfg->nworkers; r++)
		p += o->finished[r];
	for (int k = 0; k < o->store.nslots; k++)
		p += o->store.slots[k].version;
	for (int t = 0; o->rows && t < o->rows->ntables; t++)
		p += o->rows->t[t].tb.version;
	return p;
}

/* Loads old shard j's checkpoint at path (and its incremental ones) into
 * the scratch shard o, as a shard of the old map would; err names the file. */
int ps__reshard_old_load(struct ps_server *o, const struct ps_config *ocfg, int j, int placement,
		    int keep, int keep_n, const char *path, char *err, size_t errlen)
{
	int rc = ps__reshard_old_open(o, ocfg, j, placement, keep, keep_n);

	if (rc) {
		snprintf(err, errlen, "cannot set up old shard %d: %s", j, ps_strerror(rc));
		return rc;
	}
	rc = ps_checkpoint_load(o, path, err, errlen);
	if (rc == -ENOENT)
		snprintf(err, errlen, "%s is missing", path);
	if (rc)
		return rc;
	rc = ps_checkpoint_load_deltas(o, path, err, errlen);
	return rc < 0 ? rc : 0;
}

/* With cluster.replicas: 1 each old shard was a pair, and each process
 * wrote its own checkpoint: shard-J.ckpt (replica 0) and shard-J-r1.ckpt
 * (replica 1). Both hold every acknowledged push when the pair was whole
 * at the stop; a process that was down wrote an older one, or none. The
 * newer state is taken (progress_of; equal: replica 0's, as a cold start
 * of the pair would serve it), into path. 0, or a negative code. */
static int pick_pair_file(struct ps_server *o, const struct ps_config *ocfg, const char *dir,
			  int j, int placement, int keep, int keep_n, char *path, size_t plen, char *err, size_t errlen)
{
	char f[2][PATH_MAX + 32];
	uint64_t p[2] = { 0, 0 };
	struct stat st;
	int have[2], rc;

	snprintf(f[0], sizeof(f[0]), "%s/shard-%d.ckpt", dir, j);
	snprintf(f[1], sizeof(f[1]), "%s/shard-%d-r1.ckpt", dir, j);
	for (int r = 0; r < 2; r++)
		have[r] = !lstat(f[r], &st);
	if (have[0] && have[1]) {
		for (int r = 0; r < 2; r++) {
			rc = ps__reshard_old_load(o, ocfg, j, placement, keep, keep_n, f[r], err, errlen);
			if (rc)
				return rc;
			p[r] = progress_of(o);
			ps__reshard_old_close(o);
		}
		ps_info("old shard %d: both processes of its pair wrote a checkpoint (%s: %" PRIu64
			", %s: %" PRIu64 " clocks and versions summed): taking %s", j, f[0], p[0],
			f[1], p[1], f[p[1] > p[0]]);
	} else if (have[1]) {
		ps_warn("old shard %d: only replica 1 wrote a checkpoint (%s): taking it", j, f[1]);
	}
	const char *take = f[have[0] && p[1] <= p[0] ? 0 : 1];
	if (strlen(take) >= plen)
		return -ENAMETOOLONG;
	memcpy(path, take, strlen(take) + 1);
	return 0;
}

/* The folder d, resolved, into out: 0, or the errno of realpath with out
 * "" (the caller names it: errno may change before it reads it). */
static int resolve(const char *d, char *out)
{
	if (realpath(d, out))
		return 0;
	out[0] = '\0';
	return errno;
}


/* Merges into s what it owns of the old shards' states: each loaded from
 * from->dir in turn, or, with pre, the scratch shards a staged start
 * loaded already (pre->o, of placement pre->placement). */
int ps__reshard_merge(struct ps_server *s, const struct ps_reshard_from *from,
			 struct ps__staged *pre, char *err, size_t errlen)
{
	const struct ps_config *cfg = s->cfg;
	int n = from->nshards, nw = cfg->nworkers, placement, rc = 0, nt = 0;
	struct ps_config *ocfg = malloc(sizeof(*ocfg));
	struct ps_server *scratch = calloc(1, sizeof(*scratch)), *o = scratch;
	struct ps__gathered *g = calloc(PS_MAX_TABLES, sizeof(*g));
	uint64_t *fin = calloc((size_t)nw, sizeof(*fin)), slices = 0, rows = 0;
	uint64_t mslices = 0, mbytes = 0, mrows = 0; /* moved in from another shard index */
	uint8_t *got = NULL;
	uint64_t rows_staged[PS_MAX_TABLES] = { 0 };
	char (*paths)[PATH_MAX + 32] = NULL; /* the file taken of each old shard */
	char path[PATH_MAX + 32], first[PATH_MAX + 32], a[PATH_MAX], b[PATH_MAX];
	double wall = 0, t0 = ps_now_s();
	uint64_t clock0 = 0, epoch0 = 0;
	int staged = 0; /* pre's premerge is brought up to the stop */

	if (!ocfg || !scratch || !g || !fin)
		FAIL(-ENOMEM, "out of memory");
	if (n < 1 || n > PS_MAX_SHARDS)
		FAIL(PS_ECONFIG, "--reshard-shards %d: expected 1..%d", n, PS_MAX_SHARDS);
	int e = resolve(from->dir, a);
	resolve(cfg->checkpoint.dir, b);
	if (e)
		FAIL(-e, "--reshard-from %s: %s", from->dir, strerror(e));
	if (!strcmp(a, b))
		FAIL(PS_ECONFIG, "--reshard-from %s is checkpoint.dir itself: the old checkpoints "
		     "must lie in a folder of their own, which the new shards do not write to "
		     "(ps-local.sh CONFIG reshard NEW_CONFIG moves them there)", from->dir);
	memcpy(ocfg, cfg, sizeof(*ocfg));
	ocfg->nshards = n;
	paths = calloc((size_t)n, sizeof(*paths));
	if (!paths)
		FAIL(-ENOMEM, "out of memory");
	/* every old file there before any is read: a missing one is told
	 * first, not after minutes of loading the others. With replicas
	 * either process's file of a pair will do (pick_pair_file). */
	for (int j = 0; j < n; j++) {
		struct stat st;
		snprintf(paths[j], sizeof(paths[j]), "%s/shard-%d.ckpt", from->dir, j);
		snprintf(path, sizeof(path), "%s/shard-%d-r1.ckpt", from->dir, j);
		if (cfg->replicas && lstat(paths[j], &st) && !lstat(path, &st))
			memcpy(paths[j], path, sizeof(path));
		else if (lstat(paths[j], &st) && cfg->replicas)
			FAIL(-ENOENT, "%s is missing, and so is %s: re-sharding from %d pairs needs "
			     "a checkpoint of every old shard (either process's) in %s", paths[j],
			     path, n, from->dir);
		else if (lstat(paths[j], &st))
			FAIL(-ENOENT, "%s is missing: re-sharding from %d shards needs every old "
			     "shard's checkpoint, shard-0.ckpt to shard-%d.ckpt in %s", paths[j], n,
			     n - 1, from->dir);
	}
	placement = pre ? pre->placement : ps__reshard_find_placement(ocfg, paths[0], n, err, errlen);
	if (placement < 0) {
		rc = placement;
		goto out;
	}
	for (int j = 0; cfg->replicas && j < n; j++) {
		rc = pick_pair_file(o, ocfg, from->dir, j, placement, s->shard, s->cfg->nshards,
				    paths[j], sizeof(paths[j]),
				    err, errlen);
		if (rc)
			goto out;
	}
	snprintf(first, sizeof(first), "%s", paths[0]);
	/* the tensors and tables workers declared at run time, as the old
	 * shards had them: this shard's map is built from them */
	rc = pre ? 0 : ps_checkpoint_load_decl(s, first, err, errlen);
	if (rc)
		goto out;
	cfg = s->cfg;
	got = calloc((size_t)(s->store.nslots ? s->store.nslots : 1), 1);
	if (!got)
		FAIL(-ENOMEM, "out of memory");
	nt = s->rows ? s->rows->ntables : 0;
	for (int t = 0; t < nt; t++)
		g[t].row_floats = s->rows->t[t].tb.row_floats;
	/* staged: the tables were merged before the stop; what the stop
	 * changed is applied to them, or, when that cannot be, they are
	 * merged again whole (reshard_rows.c) */
	if (pre && pre->premerged && !ps__reshard_apply_possible(pre, nt)) {
		ps_warn("re-shard: the stop's changes cannot be applied to the tables merged while "
			"staged (a dropped id not remembered, or a full checkpoint loaded instead): "
			"merging them again whole");
		pre->premerged = 0;
		rc = ps__reshard_reset_tables(s);
		if (rc)
			FAIL(rc, "out of memory");
	}
	staged = pre && pre->premerged;
	/* staged: every old shard's rows are at hand, so the room for them is
	 * taken at once */
	for (int t = 0; pre && !staged && t < nt; t++) {
		uint64_t want = 0;
		for (int j = 0; j < n; j++)
			if (pre->o[j].rows && t < pre->o[j].rows->ntables)
				want += pre->o[j].rows->t[t].tb.nrows;
		g[t].refs = 1;
		if (ps__gather_grow(&g[t], want))
			FAIL(-ENOMEM, "out of memory gathering %" PRIu64 " rows", want);
	}
	for (int j = 0; j < n; j++) {
		snprintf(path, sizeof(path), "%s", paths[j]);
		o = pre ? &pre->o[j] : scratch;
		if (!pre) {
			rc = ps__reshard_old_load(o, ocfg, j, placement, s->shard, s->cfg->nshards, path, err,
				      errlen);
			if (rc)
				goto out;
		}
		/* one clock for all: the finished clocks of every worker agree */
		if (!j) {
			memcpy(fin, o->finished, (size_t)nw * sizeof(*fin));
			clock0 = ps__srv_resume_clock(o);
			epoch0 = o->map_epoch;
		}
		/* one map: files of two epochs are of two clusters' histories */
		if (o->map_epoch != epoch0)
			FAIL(PS_ECONFIG, "%s is of map epoch %" PRIu64 " (re-sharded that many times), "
			     "%s of epoch %" PRIu64 ": the old checkpoints are of different maps; a "
			     "re-shard needs every old shard's file of the one map they ran", path,
			     o->map_epoch, first, epoch0);
		for (int r = 0; r < nw; r++)
			if (o->finished[r] != fin[r])
				FAIL(PS_ECONFIG, "%s: worker %d finished clock %" PRIu64 " there, %" PRIu64
				     " in %s: the old checkpoints are of different clocks (shard %d at "
				     "%" PRIu64 ", shard 0 at %" PRIu64 "); a re-shard needs all at one: "
				     "stop the old shards with SIGTERM after the workers", path, r,
				     o->finished[r], fin[r], first, j, ps__srv_resume_clock(o), clock0);
		if (o->cfg->ntensors != cfg->ntensors || (o->rows ? o->rows->ntables : 0) != nt)
			FAIL(PS_ECONFIG, "%s: declares %d tensors and %d tables, shard-0.ckpt %d and "
			     "%d", path, o->cfg->ntensors, o->rows ? o->rows->ntables : 0,
			     cfg->ntensors, nt);
		/* dense slices: the same ids in both maps (slicing does not
		 * depend on the shard count) */
		for (int k = 0; k < o->store.nslots; k++) {
			const struct ps_slot *os = &o->store.slots[k];
			int32_t at = s->store.slot_of[os->slice->id];
			struct ps_slot *ns;
			size_t bytes = (size_t)os->slice->count * sizeof(float);

			if (at < 0)
				continue;
			ns = &s->store.slots[at];
			if (ns->slice->count != os->slice->count || ns->opt->nstate != os->opt->nstate)
				FAIL(PS_ECONFIG, "%s: slice %u has %" PRId64 " values and %d state arrays, "
				     "this shard's %" PRId64 " and %d", path, os->slice->id,
				     os->slice->count, os->opt->nstate, ns->slice->count,
				     ns->opt->nstate);
			memcpy(ns->w, os->w, bytes);
			for (int q = 0; q < os->opt->nstate; q++)
				memcpy(ns->state[q], os->state[q], bytes);
			ns->version = os->version;
			ns->steps = os->steps;
			got[at] = 1;
			slices++;
			if (j != s->shard) {
				mslices++;
				mbytes += bytes * (size_t)(1 + os->opt->nstate);
			}
		}
		/* rows: those this shard's hash names, with the time of their
		 * last update (their key: reshard_rows.c); the scratch table kept
		 * only those (old_open) */
		for (int t = 0; t < nt; t++) {
			struct ps_table *ot = &o->rows->t[t].tb, *tb = &s->rows->t[t].tb;
			uint64_t moved = 0;

			if (strcmp(ot->tc->name, tb->tc->name) || ot->row_floats != tb->row_floats)
				FAIL(PS_ECONFIG, "%s: table %d is '%s' of %d floats a row, here '%s' of "
				     "%d", path, t, ot->tc->name, ot->row_floats, tb->tc->name,
				     tb->row_floats);
			if (staged) {
				/* merged already: what it takes from old shard j is all
				 * its scratch table kept */
				moved = j != s->shard ? ot->nrows : 0;
				rows_staged[t] += ot->nrows;
			} else if (ps__gather_rows(&g[t], ot, tb, j, s->shard, cfg->nshards, &moved)) {
				FAIL(-ENOMEM, "out of memory gathering the rows of table '%s'",
				     tb->tc->name);
			}
			mrows += moved;
			mbytes += moved * sizeof(float) * (size_t)tb->row_floats;
			if (ot->version > tb->version)
				tb->version = ot->version;
			if (ot->ckpt_wall > wall)
				wall = ot->ckpt_wall;
			if (j == s->shard) {
				tb->c = ot->c;
				tb->admit.lookups = ot->admit.lookups;
				tb->admit.hits = ot->admit.hits;
				tb->admit.decays += ot->admit.decays;
			}
			if (filter_source(j, s->shard, n, cfg->nshards, placement) &&
			    ps_admit_merge(&tb->admit, &ot->admit))
				FAIL(PS_ECONFIG, "%s: table '%s' has another admission filter "
				     "(filter_ids) than this config's", path, tb->tc->name);
		}
		if (!pre)
			ps__reshard_old_close(o);
	}
	for (int k = 0; k < s->store.nslots; k++)
		if (!got[k])
			FAIL(PS_EPROTO, "slice %u of this shard is in none of the old checkpoints "
			     "(damaged?)", s->store.slots[k].slice->id);
	/* rows in order of their last update: the oldest first, so the
	 * recency list is rebuilt; ages as a checkpoint restore keeps them
	 * (the newest file's time is now) */
	for (int t = 0; t < nt; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		uint64_t total = staged ? rows_staged[t] : g[t].n, dropped = 0;
		double oldest = wall;

		if (staged)
			rc = ps__reshard_apply(s, pre, t, &oldest, &dropped, err, errlen);
		else
			rc = ps__insert_rows(tb, &g[t], n, pre ? pre->o : NULL, t, &oldest, err,
					     errlen);
		if (rc)
			goto out;
		tb->c.evicted += dropped;
		tb->epoch = ps_now_s() - (wall - oldest > 0 ? wall - oldest : 0);
		rows += total;
		tb->ckpt_wall = wall;
		ps_table_clear_changes(tb);
		if (tb->cap && total > tb->cap)
			ps_warn("table '%s': %" PRIu64 " rows moved here, over this shard's cap of %"
				PRIu64 ": the %" PRIu64 " least recently updated dropped, as the cap "
				"does", tb->tc->name, total, tb->cap, total - tb->cap);
	}
	memcpy(s->finished, fin, (size_t)nw * sizeof(*fin));
	rc = copy_members(s, first, err, errlen);
	if (rc)
		goto out;
	/* /metrics and ps-stat show these (docs/elastic.md, "Operations") */
	s->map_epoch = epoch0 + 1;
	s->reshard_in_bytes = mbytes;
	s->reshard_in_slices = mslices;
	s->reshard_in_rows = mrows;
	/* one line the launchers sum up (ps-local.sh, ps-cluster.sh reshard),
	 * at warn so that it is logged at any level but off */
	ps_warn("re-sharded from %d to %d shards out of %s (%s%s): %" PRIu64 " slices, %" PRIu64
		" rows; moved in from another shard: %" PRIu64 " slices, %" PRIu64 " rows, %"
		PRIu64 " bytes; clock %" PRIu64 ", %.2f s; map epoch %" PRIu64, n, cfg->nshards,
		from->dir, placement == PS_PLACE_HRW ? "same placement" : "re-placed from placement 0",
		pre ? ", staged" : "", slices, rows, mslices, mrows, mbytes, clock0,
		ps_now_s() - t0, s->map_epoch);
out:
	if (scratch && scratch->cfg)
		ps__reshard_old_close(scratch);
	for (int t = 0; g && t < PS_MAX_TABLES; t++)
		ps__gather_free(&g[t]);
	free(g);
	free(scratch);
	free(ocfg);
	free(fin);
	free(got);
	free(paths);
	return rc;
}
