/* reshard_stage.c - a re-shard's staged start (the pre-copy) and the
 * marker of a re-shard not checkpointed yet (reshard.h).
 *
 * The old shards run on; each wrote a full checkpoint on SIGUSR1 (the
 * pre-copy's base, admin.c). A staged new shard loads every old shard's
 * file and incremental ones from checkpoint.dir, as a shard of the old map
 * would (its scratch tables keep only the rows this shard will own),
 * merges their rows into its own tables (reshard_rows.c), and
 * waits, listening to nobody and writing nothing, until the launcher,
 * past the re-shard's commit, sends SIGUSR1. By then the old shards
 * stopped, each writing only an incremental checkpoint on that base, and
 * the launcher moved their files into --reshard-from: each base there is
 * the file loaded (the same inode: moved, not copied) and only the
 * incremental ones after those applied are read; what they changed is
 * then applied to the merged tables. A base that is not (a full
 * checkpoint replaced it meanwhile) is loaded whole again from
 * --reshard-from and the tables merged again whole. Whatever goes wrong
 * after the wait, the start goes on as an unstaged one from
 * --reshard-from: the same state. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "checkpoint.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reshard.h"
#include "reshard_int.h"
#include "server.h"
#include "server_int.h"

/* How long a staged shard waits for the commit: the launcher's own waits
 * for the stop are as long. */
#define STAGE_WAIT_S 600

static void staged_free(struct ps__staged *st)
{
	for (int j = 0; st->o && j < st->n; j++)
		if (st->o[j].cfg)
			ps__reshard_old_close(&st->o[j]);
	free(st->o);
	free(st->base);
	free(st->seq);
	free(st->ocfg);
	memset(st, 0, sizeof(*st));
}

static int same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Loads every old shard's state from dir (checkpoint.dir, where the old
 * shards still write) into st. */
static int stage_load(struct ps_server *s, const struct ps_reshard_from *from, const char *dir,
		      struct ps__staged *st, char *err, size_t errlen)
{
	const struct ps_config *cfg = s->cfg;
	int n = from->nshards, rc;
	char path[PATH_MAX + 32];

	if (cfg->replicas) {
		snprintf(err, errlen, "--reshard-stage: a staged re-shard is not built with "
			 "cluster.replicas: 1 (start without it)");
		return PS_ECONFIG;
	}
	st->n = n;
	st->keep = s->shard;
	st->keep_n = cfg->nshards;
	st->ocfg = malloc(sizeof(*st->ocfg));
	st->o = calloc((size_t)n, sizeof(*st->o));
	st->base = calloc((size_t)n, sizeof(*st->base));
	st->seq = calloc((size_t)n, sizeof(*st->seq));
	if (!st->ocfg || !st->o || !st->base || !st->seq) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(st->ocfg, cfg, sizeof(*st->ocfg));
	st->ocfg->nshards = n;
	snprintf(path, sizeof(path), "%s/shard-0.ckpt", dir);
	st->placement = ps__reshard_find_placement(st->ocfg, path, n, err, errlen);
	if (st->placement < 0)
		return st->placement;
	/* tensors or tables declared at run time come from old shard 0's
	 * file at the commit: not staged */
	rc = ps_checkpoint_load_decl(s, path, err, errlen);
	if (rc)
		return rc;
	if (s->cfg->declare || s->cfg->ndecl_tables) {
		snprintf(err, errlen, "--reshard-stage: %s declares tensors or tables at run time: "
			 "a staged re-shard is not built for them (start without it)", path);
		return PS_ECONFIG;
	}
	for (int j = 0; j < n; j++) {
		struct stat after;

		snprintf(path, sizeof(path), "%s/shard-%d.ckpt", dir, j);
		if (stat(path, &st->base[j])) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(errno));
			return rc;
		}
		rc = ps__reshard_old_open(&st->o[j], st->ocfg, j, st->placement, s->shard, cfg->nshards);
		if (!rc)
			rc = ps_checkpoint_load(&st->o[j], path, err, errlen);
		if (!rc)
			rc = ps_checkpoint_load_deltas_after(&st->o[j], path, 0, 1, err, errlen);
		if (rc < 0)
			return rc;
		st->seq[j] = (uint32_t)rc;
		/* replaced while it was read: the base at the commit differs */
		if (stat(path, &after) || !same_file(&after, &st->base[j]))
			memset(&st->base[j], 0, sizeof(st->base[j]));
	}
	return 0;
}

/* Waits for the commit (SIGUSR1) for STAGE_WAIT_S at most. The caller
 * made this process die with its launcher (parent: PR_SET_PDEATHSIG),
 * which is undone here. 0, or a negative code with err (SIGTERM or
 * SIGINT came first, the time ran out, the launcher is gone). */
static int stage_wait(pid_t parent, char *err, size_t errlen)
{
	struct timespec ts = { 1, 0 };
	sigset_t set, old;
	int sig = -1, t = 0, gone = 0;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, &old);
	/* a second at a time: the launcher is checked for too */
	while (t < STAGE_WAIT_S) {
		if (getppid() != parent) {
			gone = 1;
			break;
		}
		sig = sigtimedwait(&set, NULL, &ts);
		if (sig > 0 || (errno != EAGAIN && errno != EINTR))
			break;
		t += errno == EAGAIN;
	}
	prctl(PR_SET_PDEATHSIG, 0);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (sig == SIGUSR1)
		return 0;
	if (gone)
		snprintf(err, errlen, "the launcher that started this staged shard (pid %d) is gone: "
			 "a staged shard writes nothing; stopping", (int)parent);
	else if (sig > 0)
		snprintf(err, errlen, "%s came before the re-shard's commit: a staged shard writes "
			 "nothing; stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	else if (t >= STAGE_WAIT_S)
		snprintf(err, errlen, "no commit (SIGUSR1) within %d s of staging; stopping",
			 STAGE_WAIT_S);
	else
		snprintf(err, errlen, "waiting for the commit: %s", strerror(errno));
	return -ECANCELED;
}

/* After the commit: each scratch shard brought up to the stop from the
 * files in from->dir. 0, or a negative code with err: the caller loads
 * from from->dir unstaged. */
static int stage_finish(struct ps__staged *st, const struct ps_reshard_from *from, char *err,
			size_t errlen)
{
	char path[PATH_MAX + 32];
	struct stat now;
	int rc;

	for (int j = 0; j < st->n; j++) {
		struct ps_server *o = &st->o[j];

		snprintf(path, sizeof(path), "%s/shard-%d.ckpt", from->dir, j);
		if (stat(path, &now) || !same_file(&now, &st->base[j])) {
			ps_warn("re-shard: %s is not the full checkpoint staged (a newer one replaced "
				"it): loading it whole", path);
			st->reloaded = 1; /* the merge is made again whole (reshard.c) */
			ps__reshard_old_close(o);
			rc = ps__reshard_old_load(o, st->ocfg, j, st->placement, st->keep, st->keep_n, path, err,
				      errlen);
			if (rc)
				return rc;
			continue;
		}
		rc = ps_checkpoint_load_deltas_after(o, path, st->seq[j], 0, err, errlen);
		if (rc < 0)
			return rc;
		st->seq[j] += (uint32_t)rc;
	}
	return 0;
}

int ps__reshard_load(struct ps_server *s, const struct ps_reshard_from *from, char *err,
		     size_t errlen)
{
	struct ps__staged st = { 0 };
	double t0 = ps_now_s(), t1;
	pid_t parent;
	int rc;

	if (!from->stage)
		return ps__reshard_merge(s, from, NULL, err, errlen);
	/* staged, it dies with its launcher (its parent, pid from->stage):
	 * nothing of it is left behind */
	parent = (pid_t)from->stage;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent) {
		snprintf(err, errlen, "--reshard-stage %d: that process, which must be this shard's "
			 "parent (the launcher), is not: gone already?", (int)parent);
		return -ECANCELED;
	}
	rc = stage_load(s, from, s->cfg->checkpoint.dir, &st, err, errlen);
	t1 = ps_now_s();
	if (!rc)
		rc = ps__reshard_premerge(s, &st, err, errlen);
	if (rc) {
		prctl(PR_SET_PDEATHSIG, 0);
		staged_free(&st);
		return rc;
	}
	ps_warn("re-shard staged: the %d old shards' checkpoints loaded from %s in %.2f s, "
		"their rows merged in %.2f s; waiting for the commit (SIGUSR1), for %d s at most",
		st.n, s->cfg->checkpoint.dir, t1 - t0, ps_now_s() - t1, STAGE_WAIT_S);
	rc = stage_wait(parent, err, errlen);
	if (rc) {
		staged_free(&st);
		return rc;
	}
	t1 = ps_now_s();
	rc = stage_finish(&st, from, err, errlen);
	if (!rc) {
		ps_info("re-shard: the stop's incremental checkpoints applied in %.3f s",
			ps_now_s() - t1);
		rc = ps__reshard_merge(s, from, &st, err, errlen);
		staged_free(&st);
		return rc;
	}
	ps_warn("re-shard: the staged state cannot be brought up to the stop (%s): loading "
		"%s whole", err, from->dir);
	rc = st.premerged ? ps__reshard_reset_tables(s) : 0;
	staged_free(&st);
	if (rc) {
		snprintf(err, errlen, "out of memory");
		return rc;
	}
	return ps__reshard_merge(s, from, NULL, err, errlen);
}

/* ---- the marker of a re-shard not checkpointed yet ---- */

void ps__reshard_marker_path(const struct ps_server *s, char *buf, size_t len)
{
	size_t n = strlen(s->ckpt_path);

	snprintf(buf, len, "%.*s.reshard", (int)(n > 5 ? n - 5 : n), s->ckpt_path);
}

int ps__reshard_marker_write(struct ps_server *s, const struct ps_reshard_from *from,
			     char *err, size_t errlen)
{
	char path[sizeof(s->reshard_marker)], tmp[sizeof(path) + 8], dir[PATH_MAX];
	FILE *f;
	int rc = 0, fd;

	ps__reshard_marker_path(s, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (!realpath(from->dir, dir)) {
		snprintf(err, errlen, "%s: %s", from->dir, strerror(errno));
		return -errno;
	}
	f = fopen(tmp, "w");
	if (!f || fprintf(f, "%d %s\n", from->nshards, dir) < 0 || fflush(f) || fsync(fileno(f)))
		rc = -errno;
	if (f && fclose(f) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc) {
		snprintf(err, errlen, "cannot write %s: %s", path, strerror(-rc));
		unlink(tmp);
		return rc;
	}
	fd = open(s->cfg->checkpoint.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	snprintf(s->reshard_marker, sizeof(s->reshard_marker), "%s", path);
	return 0;
}

int ps__reshard_marker_read(struct ps_server *s, struct ps_reshard_from *from, char *dirbuf,
			    size_t dirlen, char *err, size_t errlen)
{
	char path[sizeof(s->reshard_marker)], line[PATH_MAX + 32];
	FILE *f;
	int n = 0, off = 0;

	ps__reshard_marker_path(s, path, sizeof(path));
	f = fopen(path, "r");
	if (!f) {
		if (errno == ENOENT)
			return 0;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (!fgets(line, sizeof(line), f) || sscanf(line, "%d %n", &n, &off) != 1 || n < 1 ||
	    n > PS_MAX_SHARDS || !off || line[off] != '/' || strlen(line + off) >= dirlen) {
		fclose(f);
		snprintf(err, errlen, "%s: not a re-shard marker ('SHARDS /DIR' on one line): "
			 "damaged? It names the old checkpoints of a re-shard whose first checkpoint "
			 "was not written; remove it only if this shard's state is in %s", path,
			 s->ckpt_path);
		return PS_EPROTO;
	}
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	snprintf(dirbuf, dirlen, "%s", line + off);
	from->dir = dirbuf;
	from->nshards = n;
	from->stage = 0;
	snprintf(s->reshard_marker, sizeof(s->reshard_marker), "%s", path);
	return 1;
}
