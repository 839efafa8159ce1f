/* checkpoint.c - a shard's state on disk (checkpoint.h).
 *
 * Layout: a fixed header (struct ckpt_hdr), then, for a config without a
 * model, the ndeclared tensors the workers declared (struct ckpt_decl, in
 * declaration order: the shard rebuilds its map from them before anything
 * else is read, server/declare.c), then per owned slice, in slot
 * order, a struct ckpt_slot followed by count floats of weights and nstate
 * times count floats of optimizer state, then nworkers uint64 finished
 * clocks, then a uint32 CRC-32 (zlib) of every byte before it.
 *
 * The records are declared in ckpt_format.h (shared with ps-export).
 *
 * Version 2 (magic PSCKPT02 / PSDELTA2), written when the declared tensors
 * have optimizer groups (ps_client_declare_groups): each ckpt_decl holds
 * its tensor's group, the list is followed by a struct ckpt_groups and
 * ngroups struct ckpt_group, and each slice's state is the nstate arrays
 * of its own group's rule. Version 1 files (no groups) are written and
 * read as before.
 *
 * Versions 3 and 4 (magic PSCKPT03 / PSDELTA3, PSCKPT04 / PSDELTA4),
 * written when the shard has embedding tables declared at run time
 * (ps_client_declare_tables, server/decl_tables.c): version 3 is version 1
 * and version 4 is version 2 with, after the declared tensors and groups
 * (right after the header when there are none) and before the slices, the
 * declared tables' section: a struct ckpt_tables_head and ntables struct
 * ckpt_table_decl, the declared tables in declaration order (layout and
 * code in decl_tables.c). So the version's bit 0 (version - 1) says
 * optimizer groups and bit 1 declared tables. The tables' rows follow the
 * finished clocks as for the config's tables (table_ckpt.c), the config's
 * tables first, then the declared ones in this order.
 *
 * Versions 5..8 are versions 1..4 of a state that went through a re-shard
 * (bit 2, CKPT_V_EPOCH): a struct ckpt_map with its map epoch follows the
 * finished clocks, before the tables' rows. A file without it loads as
 * epoch 0, and a shard of epoch 0 writes versions 1..4 as before.
 */
#define _GNU_SOURCE /* mkostemp */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "checkpoint.h"
#include "ckpt_format.h"
#include "ps_err.h"
#include "optim_group.h"
#include "ps_log.h"
#include "server.h"
#include "server_int.h"
#include "table_ckpt.h"
#include "wire.h"

void ps_checkpoint_path(const char *dir, int shard, char *buf, size_t len)
{
	snprintf(buf, len, "%s/shard-%d.ckpt", dir, shard);
}

/* The file version s's state takes: 1..8 (see the head of this file). */
static int file_version(const struct ps_server *s)
{
	return 1 + (s->cfg->ngroups ? CKPT_V_GROUPS : 0) + (s->cfg->ndecl_tables ? CKPT_V_TABLES : 0) +
	       (s->map_epoch ? CKPT_V_EPOCH : 0);
}

/* The magic of version v, full or incremental (8 bytes, no NUL). */
static void magic_of(int v, int delta, char out[8])
{
	char b[9];

	snprintf(b, sizeof(b), "%s%d", delta ? "PSDELTA" : "PSCKPT0", v);
	memcpy(out, b, 8);
}

static void fill_hdr(const struct ps_server *s, struct ckpt_hdr *h)
{
	memset(h, 0, sizeof(*h));
	magic_of(file_version(s), 0, h->magic);
	h->endian = CKPT_ENDIAN;
	h->shard = s->shard;
	h->map_hash = s->map.hash;
	h->optimizer = (uint32_t)s->cfg->optim.kind;
	h->nstate = (uint32_t)s->store.opt->nstate;
	h->nworkers = (uint32_t)s->cfg->nworkers;
	h->consistency = (uint32_t)s->cfg->consistency;
	h->nslots = (uint32_t)s->store.nslots;
	h->ndeclared = s->cfg->declare ? (uint32_t)s->cfg->ntensors : 0;
}

/* Bytes of the declared tensors' list (and of their groups). */
static size_t dense_decl_size(const struct ps_server *s)
{
	if (!s->cfg->declare)
		return 0;
	return (size_t)s->cfg->ntensors * sizeof(struct ckpt_decl) +
	       (s->cfg->ngroups ? sizeof(struct ckpt_groups) +
				  (size_t)s->cfg->ngroups * sizeof(struct ckpt_group) : 0);
}

/* Bytes between the header and the first slice. */
static size_t decl_size(const struct ps_server *s)
{
	return dense_decl_size(s) + ps__srv_tables_ckpt_size(s);
}

/* Fault injection for the crash tests (tests/it_checkpoint.c, it_rows.c):
 * with PS_FAULT_CHECKPOINT=write|fsync|rename|retire in its environment
 * the shard kills itself (SIGKILL, as kill -9 would) half way through
 * writing the file, after its fsync, after the rename, or (a full
 * checkpoint replacing a chain of incremental ones) after the first of the
 * old chain's files is removed. Never set in production. */
static void fault_point(const char *step)
{
	const char *f = getenv("PS_FAULT_CHECKPOINT");

	if (f && !strcmp(f, step)) {
		ps_error("PS_FAULT_CHECKPOINT=%s: killing this shard at that step", step);
		raise(SIGKILL);
	}
}

/* Versions, step counts and finished clocks a checkpoint may hold stay
 * under PS_MAX_CLOCK (wire.h). */
#define CKPT_MAX_COUNT PS_MAX_CLOCK

/* The dense part's bytes, with the map epoch's record or without. */
static size_t image_size_v(const struct ps_server *s, int with_epoch)
{
	size_t n = sizeof(struct ckpt_hdr) + decl_size(s) + (size_t)s->cfg->nworkers * sizeof(uint64_t) +
		   (with_epoch ? sizeof(struct ckpt_map) : 0);

	for (int k = 0; k < s->store.nslots; k++)
		n += sizeof(struct ckpt_slot) + (size_t)s->store.slots[k].slice->count *
			sizeof(float) * (size_t)(1 + s->store.slots[k].opt->nstate);
	return n;
}

static size_t image_size(const struct ps_server *s)
{
	return image_size_v(s, s->map_epoch != 0);
}

/* Allocates img (len bytes) and copies the dense state into its start
 * (image_size bytes). */
static int snapshot_dense(const struct ps_server *s, struct ps_ckpt_image *img, size_t len,
			  char *err, size_t errlen)
{
	size_t pos;
	struct ckpt_hdr h;
	uint8_t *b;

	img->len = len;
	img->crc = 0;
	img->buf = b = malloc(img->len);
	if (!b) {
		snprintf(err, errlen, "out of memory for a %zu-byte checkpoint image", img->len);
		return -ENOMEM;
	}
	fill_hdr(s, &h);
	memcpy(b, &h, sizeof(h));
	pos = sizeof(h);
	for (uint32_t i = 0; i < h.ndeclared; i++, pos += sizeof(struct ckpt_decl)) {
		const struct ps_tensor_cfg *t = &s->cfg->tensors[i];
		struct ckpt_decl d;

		memset(&d, 0, sizeof(d));
		memcpy(d.name, t->name, sizeof(d.name));
		d.ndims = t->ndims;
		d.group = s->cfg->ngroups ? t->group : 0;
		memcpy(d.dims, t->dims, sizeof(d.dims));
		memcpy(b + pos, &d, sizeof(d));
	}
	if (h.ndeclared && s->cfg->ngroups) {
		struct ckpt_groups gh = { .ngroups = (uint32_t)s->cfg->ngroups };

		memcpy(b + pos, &gh, sizeof(gh));
		pos += sizeof(gh);
		for (int g = 0; g < s->cfg->ngroups; g++, pos += sizeof(struct ckpt_group)) {
			const struct ps_optim_cfg *o = &s->cfg->groups[g];
			struct ckpt_group cg = {
				.kind = (uint32_t)o->kind, .nesterov = (uint32_t)o->nesterov,
				.average = (uint32_t)o->average, .lr = o->lr, .momentum = o->momentum,
				.dampening = o->dampening, .beta1 = o->beta1, .beta2 = o->beta2,
				.eps = o->eps, .weight_decay = o->weight_decay, .lr_decay = o->lr_decay,
				.initial_accumulator = o->initial_accumulator,
			};
			memcpy(b + pos, &cg, sizeof(cg));
		}
	}
	if (s->cfg->ndecl_tables) {
		ps__srv_tables_ckpt_put(s, b + pos);
		pos += ps__srv_tables_ckpt_size(s);
	}
	for (int k = 0; k < s->store.nslots; k++) {
		const struct ps_slot *sl = &s->store.slots[k];
		struct ckpt_slot cs = { .slice = sl->slice->id, .count = (uint64_t)sl->slice->count,
					.version = sl->version, .steps = sl->steps };
		size_t n = (size_t)cs.count * sizeof(float);
		memcpy(b + pos, &cs, sizeof(cs));
		pos += sizeof(cs);
		memcpy(b + pos, sl->w, n);
		pos += n;
		for (int j = 0; j < sl->opt->nstate; j++, pos += n)
			memcpy(b + pos, sl->state[j], n);
	}
	memcpy(b + pos, s->finished, (size_t)s->cfg->nworkers * sizeof(uint64_t));
	pos += (size_t)s->cfg->nworkers * sizeof(uint64_t);
	if (s->map_epoch) {
		struct ckpt_map cm = { .epoch = s->map_epoch };
		memcpy(b + pos, &cm, sizeof(cm));
	}
	return 0;
}

size_t ps_checkpoint_size(const struct ps_server *s)
{
	return image_size(s) + ps__rows_ckpt_size(s);
}

int ps_checkpoint_snapshot(const struct ps_server *s, struct ps_ckpt_image *img, char *err,
			   size_t errlen)
{
	size_t dense = image_size(s);
	int rc = snapshot_dense(s, img, dense + ps__rows_ckpt_size(s), err, errlen);

	if (!rc)
		ps__rows_ckpt_snapshot(s, img->buf + dense);
	return rc;
}

void ps_checkpoint_delta_path(const char *path, uint32_t seq, char *buf, size_t len)
{
	snprintf(buf, len, "%s.delta-%u", path, seq);
}

int ps_checkpoint_snapshot_delta(const struct ps_server *s, uint32_t seq,
				 struct ps_ckpt_image *img, char *err, size_t errlen)
{
	size_t dense = image_size(s);
	struct ckpt_hdr h;
	int rc;

	/* the dense part is small next to the tables: copied whole, as in a
	 * full file, then the tables' changes in place of the tables */
	rc = snapshot_dense(s, img, dense + ps__rows_delta_size(s), err, errlen);
	if (rc)
		return rc;
	memcpy(&h, img->buf, sizeof(h));
	magic_of(file_version(s), 1, h.magic);
	memcpy(img->buf, &h, sizeof(h));
	ps__rows_delta_snapshot(s, img->buf + dense, seq, s->ckpt_base_crc, s->ckpt_base_len);
	return 0;
}

void ps_checkpoint_image_free(struct ps_ckpt_image *img)
{
	free(img->buf);
	img->buf = NULL;
}

/* Fsyncs the folder holding path, so renames and removals in it are
 * durable; 0 or -errno. */
static int sync_dir_of(const char *path)
{
	char dirbuf[4200];
	int dfd, rc = 0;

	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	if (fsync(dfd))
		rc = -errno;
	close(dfd);
	return rc;
}

/* Writes n bytes, retrying short writes; 0 or -errno. */
static int write_all(int fd, const uint8_t *b, size_t n)
{
	for (size_t done = 0; done < n;) {
		size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
		ssize_t w = write(fd, b + done, chunk);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		done += (size_t)w;
	}
	return 0;
}

int ps_checkpoint_write_image(struct ps_ckpt_image *img, const char *path,
			      uint64_t *bytes, char *err, size_t errlen)
{
	char tmp[4200];
	uint32_t crc = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), img->buf, img->len);
	int fd, rc;

	/* a new file under a fresh name, mode 0600, created exclusively: a
	 * file or symlink planted in a shared folder is never written through */
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "checkpoint path too long: %s", path);
		return -ENAMETOOLONG;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		return rc;
	}
	rc = write_all(fd, img->buf, img->len / 2);
	fault_point("write");
	if (!rc)
		rc = write_all(fd, img->buf + img->len / 2, img->len - img->len / 2);
	if (!rc)
		rc = write_all(fd, (const uint8_t *)&crc, sizeof(crc));
	if (!rc && fsync(fd))
		rc = -errno;
	fault_point("fsync");
	if (close(fd) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (rc) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(-rc));
		unlink(tmp);
		return rc;
	}
	fault_point("rename");
	/* the rename is durable once the folder is synced */
	sync_dir_of(path);
	*bytes = img->len + sizeof(crc);
	img->crc = crc;
	return 0;
}

void ps_checkpoint_retire_deltas(const char *path, uint32_t upto)
{
	char dp[4200];
	uint32_t hi = upto;
	struct stat st;
	int removed = 0;

	/* files past the ones the shard knows of (left by a crash) go too */
	for (;;) {
		ps_checkpoint_delta_path(path, hi + 1, dp, sizeof(dp));
		if (lstat(dp, &st))
			break;
		hi++;
	}
	/* the last first: a crash part way leaves delta-1..k, a chain the
	 * loader finds whole (and sets aside, as it builds on the old file) */
	for (uint32_t n = hi; n >= 1; n--) {
		ps_checkpoint_delta_path(path, n, dp, sizeof(dp));
		if (unlink(dp) == 0) {
			if (!removed++)
				fault_point("retire");
		} else if (errno != ENOENT) {
			ps_warn("%s: cannot remove it (%s); it builds on the checkpoint just "
				"replaced, so the next start sets it aside", dp, strerror(errno));
		}
	}
	if (removed && sync_dir_of(path))
		ps_warn("%s: cannot sync its folder after removing the old incremental "
			"checkpoints: %s", path, strerror(errno));
}

int ps_checkpoint_check_dir(const char *dir, const char *path, char *err, size_t errlen)
{
	char tmp[4200], cwd[1024] = "";
	struct stat st;
	int fd, rc;

	if (dir[0] != '/' && getcwd(cwd, sizeof(cwd)))
		snprintf(tmp, sizeof(tmp), " (relative to the shard's working directory %s)", cwd);
	else
		tmp[0] = '\0';
	rc = stat(dir, &st) ? -errno : S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
	if (rc) {
		if (rc == -ENOENT)
			snprintf(err, errlen, "checkpoint.dir %s%s does not exist: create it "
				 "(mkdir -p) or fix checkpoint.dir", dir, tmp);
		else
			snprintf(err, errlen, "checkpoint.dir %s%s: %s", dir, tmp,
				 rc == -ENOTDIR ? "not a folder" : strerror(-rc));
		return rc;
	}
	/* the same kind of file a checkpoint write creates, removed at once */
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "checkpoint path too long: %s", path);
		return -ENAMETOOLONG;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "checkpoint.dir %s: cannot create a file in it (%s), so no "
			 "checkpoint could be written at stop", dir, strerror(errno));
		return rc;
	}
	close(fd);
	unlink(tmp);
	return 0;
}

/* Reads exactly n bytes at offset off; 0 or -1 with errno (EIO at the end). */
static int read_at(int fd, void *p, size_t n, uint64_t off)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

#define FAIL(code, ...) do { snprintf(err, errlen, __VA_ARGS__); rc = (code); goto out; } while (0)

/* Version 2: the optimizer groups at pos (after the declared list), each
 * checked as a worker's would be, and list's (n) group indices in range,
 * into *groups (malloc'd) and *ngroups. */
static int load_groups(struct ps_server *s, int fd, uint64_t pos, uint64_t len,
		       const struct ps_tensor_cfg *list, uint32_t n, struct ps_optim_cfg **groups,
		       int *ngroups, const char *path, char *err, size_t errlen)
{
	struct ckpt_groups gh;
	struct ps_optim_cfg *gs = NULL;
	char why[300];
	int rc = 0;

	if (read_at(fd, &gh, sizeof(gh), pos))
		FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
	pos += sizeof(gh);
	if (gh.ngroups < 1 || gh.ngroups > PS_MAX_GROUPS ||
	    len < pos + (uint64_t)gh.ngroups * sizeof(struct ckpt_group))
		FAIL(PS_EPROTO, "%s: %u optimizer groups: expected 1..%d (damaged?)", path,
		     gh.ngroups, PS_MAX_GROUPS);
	gs = calloc(gh.ngroups, sizeof(*gs));
	if (!gs)
		FAIL(-ENOMEM, "%s: out of memory", path);
	for (uint32_t g = 0; g < gh.ngroups; g++, pos += sizeof(struct ckpt_group)) {
		struct ckpt_group cg;
		struct ps_optim_cfg *o = &gs[g];

		if (read_at(fd, &cg, sizeof(cg), pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		*o = (struct ps_optim_cfg){
			.kind = (enum ps_optim_kind)cg.kind, .nesterov = cg.nesterov != 0,
			.average = cg.average != 0, .lr = cg.lr, .momentum = cg.momentum,
			.dampening = cg.dampening, .beta1 = cg.beta1, .beta2 = cg.beta2, .eps = cg.eps,
			.weight_decay = cg.weight_decay, .lr_decay = cg.lr_decay,
			.initial_accumulator = cg.initial_accumulator,
		};
		if (cg.kind >= PS_OPT_COUNT || cg.nesterov > 1 || cg.average > 1 ||
		    ps_optim_group_check((int)g, o, s->cfg->consistency == PS_ASYNC, why,
					 sizeof(why)))
			FAIL(PS_EPROTO, "%s: optimizer group %u is damaged or does not fit this "
			     "config: %s", path, g, cg.kind >= PS_OPT_COUNT ? "unknown kind" : why);
	}
	for (uint32_t i = 0; i < n; i++)
		if (list[i].group < 0 || (uint32_t)list[i].group >= gh.ngroups)
			FAIL(PS_EPROTO, "%s: declared tensor '%s' has optimizer group %d of %u "
			     "(damaged?)", path, list[i].name, list[i].group, gh.ngroups);
	*groups = gs;
	*ngroups = (int)gh.ngroups;
	gs = NULL;
out:
	free(gs);
	return rc;
}

/* The declared tensors of checkpoint h (h->ndeclared of them): checked
 * whole, then made the shard's tensors when it has none yet (at the start,
 * before any worker declared), else compared with them (an incremental
 * checkpoint after its full one). */
static int load_declared(struct ps_server *s, int fd, const struct ckpt_hdr *h, uint64_t len,
			 int version, const char *path, char *err, size_t errlen)
{
	struct ps_tensor_cfg *list = NULL;
	struct ps_optim_cfg *groups = NULL;
	uint32_t n = h->ndeclared;
	int ngroups = 0;
	char why[300];
	int rc = 0;

	if (!s->cfg->declare)
		FAIL(PS_ECONFIG, "%s: holds %u tensors declared by workers, but the config names its "
		     "model (model.preset, .layers or .tensors)", path, n);
	if (n > PS_MAX_TENSORS || len < sizeof(*h) + (uint64_t)n * sizeof(struct ckpt_decl))
		FAIL(PS_EPROTO, "%s: %u declared tensors: more than %d, or more than the file holds "
		     "(damaged?)", path, n, PS_MAX_TENSORS);
	list = calloc(n ? n : 1, sizeof(*list));
	if (!list)
		FAIL(-ENOMEM, "%s: out of memory", path);
	for (uint32_t i = 0; i < n; i++) {
		struct ckpt_decl d;
		struct ps_tensor_cfg *t = &list[i];

		if (read_at(fd, &d, sizeof(d), sizeof(*h) + (uint64_t)i * sizeof(d)))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		if (!memchr(d.name, 0, sizeof(d.name)) || !d.name[0] || d.ndims < 0 ||
		    d.ndims > PS_MAX_DIMS)
			FAIL(PS_EPROTO, "%s: declared tensor %u is damaged", path, i);
		memcpy(t->name, d.name, sizeof(t->name));
		t->ndims = d.ndims;
		t->count = 1;
		for (int j = 0; j < d.ndims; j++) {
			if (d.dims[j] < 1 || d.dims[j] > (INT64_C(1) << 36) ||
			    t->count > (INT64_C(1) << 36) / d.dims[j])
				FAIL(PS_EPROTO, "%s: declared tensor '%s' has a damaged shape", path,
				     t->name);
			t->dims[j] = d.dims[j];
			t->count *= d.dims[j];
		}
		t->group = d.group;
	}
	if ((version - 1) & CKPT_V_GROUPS) {
		rc = load_groups(s, fd, sizeof(*h) + (uint64_t)n * sizeof(struct ckpt_decl), len,
				 list, n, &groups, &ngroups, path, err, errlen);
		if (rc)
			goto out;
	}
	if (!s->cfg->ntensors) {
		if (n && (rc = ps__srv_declare_adopt(s, list, (int)n, groups, ngroups, NULL, 0, why,
						     sizeof(why))))
			FAIL(rc, "%s: its declared tensors: %s", path, why);
	} else {
		int same = (int)n == s->cfg->ntensors && ngroups == s->cfg->ngroups;
		for (uint32_t i = 0; same && i < n; i++)
			same = !strcmp(list[i].name, s->cfg->tensors[i].name) &&
			       list[i].ndims == s->cfg->tensors[i].ndims &&
			       !memcmp(list[i].dims, s->cfg->tensors[i].dims,
				       sizeof(list[i].dims[0]) * (size_t)list[i].ndims) &&
			       (!ngroups || list[i].group == s->cfg->tensors[i].group);
		for (int g = 0; same && g < ngroups; g++)
			same = !ps_optim_group_diff(g, &s->cfg->groups[g], &groups[g], why,
						    sizeof(why));
		if (!same)
			FAIL(PS_ECONFIG, "%s: declares other tensors or optimizer groups than its "
			     "full checkpoint", path);
	}
out:
	free(list);
	free(groups);
	return rc;
}

/* Loads a full checkpoint (delta 0) or incremental checkpoint delta of
 * the chain: the checks, then the restore, as ps_checkpoint_load says.
 * decl_only: only the tensors and tables it declares (a re-shard gives
 * the new shard those of an old shard's file, reshard.c). */
static int load_file(struct ps_server *s, const char *path, uint32_t delta, int decl_only,
		     char *err, size_t errlen)
{
	enum { CHUNK = 1 << 20 };
	struct ckpt_hdr h, want;
	struct ckpt_map cmap = { 0, 0 };
	struct stat st;
	uint64_t len, pos, need, max_finished = 0, max_version = 0, *fin = NULL;
	int nw = s->cfg->nworkers, rc = 0, fd, version;
	uint8_t *chunk = NULL;
	uLong crc_run = crc32(0L, Z_NULL, 0);
	uint32_t crc;

	/* a link is not followed (it could roll the shard back to another
	 * file) and the open does not wait (a FIFO would block it forever):
	 * only a regular file is read */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		rc = -errno;
		if (errno == ELOOP)
			snprintf(err, errlen, "%s: a symbolic link: a checkpoint is read only from a "
				 "regular file, never through a link (put the file itself there)", path);
		else
			snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		FAIL(PS_EPROTO, "%s: not a regular file (%s): a checkpoint is read only from a "
		     "regular file", path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ?
		     "a folder" : S_ISSOCK(st.st_mode) ? "a socket" : "a device or other");
	len = (uint64_t)st.st_size;
	if (len < sizeof(h) + sizeof(crc))
		FAIL(PS_EPROTO, "%s: %" PRIu64 " bytes, too short for a checkpoint (truncated?)", path,
		     len);
	if (read_at(fd, &h, sizeof(h), 0))
		FAIL(PS_EPROTO, "%s: cannot read its header: %s", path, strerror(errno));
	version = 0;
	for (int v = 1; v <= CKPT_V_MAX && !version; v++) {
		char mg[8];
		magic_of(v, delta != 0, mg);
		if (!memcmp(h.magic, mg, 8))
			version = v;
	}
	if (!version)
		FAIL(PS_EPROTO, "%s: not a ps-server %scheckpoint (bad magic)", path,
		     delta ? "incremental " : "");
	if (h.endian != CKPT_ENDIAN)
		FAIL(PS_EPROTO, "%s: written on a machine of the other byte order", path);
	if (((version - 1) & CKPT_V_GROUPS) && (!h.ndeclared || !s->cfg->declare))
		FAIL(PS_EPROTO, "%s: a version %d checkpoint (optimizer groups) without declared "
		     "tensors (damaged?), or the config names its model", path, version);
	if (h.ndeclared || s->cfg->declare) {
		rc = load_declared(s, fd, &h, len, version, path, err, errlen);
		if (rc)
			goto out;
	}
	if ((version - 1) & CKPT_V_TABLES) {
		/* the declared tensors are the shard's now: the tables follow them */
		rc = ps__srv_tables_ckpt_load(s, fd, sizeof(h) + dense_decl_size(s), len, path, err,
					      errlen);
		if (rc)
			goto out;
	}
	if (decl_only)
		goto out;
	fill_hdr(s, &want);
	/* the map epoch's bit is the file's own (any epoch loads) */
	if (((version - 1) & ~CKPT_V_EPOCH) != ((file_version(s) - 1) & ~CKPT_V_EPOCH))
		FAIL(PS_ECONFIG, "%s: a version %d checkpoint, this shard's tensors %s optimizer "
		     "groups and it %s declared tables (version %d)", path, version,
		     s->cfg->ngroups ? "have" : "have no", s->cfg->ndecl_tables ? "has" : "has no",
		     ((file_version(s) - 1) & ~CKPT_V_EPOCH) + 1 + ((version - 1) & CKPT_V_EPOCH));
	if (h.shard != want.shard)
		FAIL(PS_ECONFIG, "%s: belongs to shard %d, this is shard %d", path, h.shard,
		     want.shard);
	if (h.map_hash != want.map_hash && h.map_hash == s->old_place_hash)
		FAIL(PS_ECONFIG, "%s: made by a build before re-sharding, which placed rows and "
		     "slices otherwise (placement 0, map %016" PRIx64 "): re-place it once with "
		     "`ps-local.sh CONFIG reshard CONFIG` (or ps-cluster.sh; docs/elastic.md)", path,
		     h.map_hash);
	if (h.map_hash != want.map_hash)
		FAIL(PS_ECONFIG, "%s: made with another configuration: shard map %016" PRIx64
		     " there, %016" PRIx64 " here (servers, tensors or slice_bytes changed; "
		     "checkpoints made for another number of shards are loaded by `ps-local.sh "
		     "CONFIG reshard NEW_CONFIG`, docs/elastic.md)", path, h.map_hash, want.map_hash);
	if (h.optimizer != want.optimizer)
		FAIL(PS_ECONFIG, "%s: made with optimizer %s, the config says %s", path,
		     ps_optim_name((enum ps_optim_kind)h.optimizer),
		     ps_optim_name(s->cfg->optim.kind));
	if (h.nstate != want.nstate)
		FAIL(PS_EPROTO, "%s: damaged at offset 28: %u floats of optimizer state a value, "
		     "optimizer %s keeps %u", path, h.nstate, ps_optim_name(s->cfg->optim.kind),
		     want.nstate);
	if (h.nworkers != want.nworkers)
		FAIL(PS_ECONFIG, "%s: made for %u workers, the config says %u", path, h.nworkers,
		     want.nworkers);
	if (h.consistency != want.consistency)
		FAIL(PS_ECONFIG, "%s: made in %s mode, the config says %s", path,
		     h.consistency == PS_SYNC ? "sync" : "async",
		     want.consistency == PS_SYNC ? "sync" : "async");
	if (h.nslots != want.nslots)
		FAIL(PS_ECONFIG, "%s: holds %u slices, this shard owns %u", path, h.nslots,
		     want.nslots);
	/* the header matches this shard, so the file's size is known before
	 * anything big is read or allocated */
	need = image_size_v(s, (version - 1) & CKPT_V_EPOCH) + sizeof(crc);
	/* embedding tables follow, their size known only from their headers
	 * (checked after the checksum) */
	if (s->cfg->ntables ? len < need : len != need)
		FAIL(PS_EPROTO, "%s: %" PRIu64 " bytes, a checkpoint of this shard has %" PRIu64
		     " (truncated or damaged)", path, len, need);
	/* pass 1: the checksum of every byte (64-bit lengths: files over 4 GiB
	 * load), each slot's place, the counts in range; nothing restored */
	chunk = malloc(CHUNK);
	fin = malloc((size_t)nw * sizeof(uint64_t));
	if (!chunk || !fin)
		FAIL(-ENOMEM, "%s: out of memory", path);
	for (pos = 0; pos < len - sizeof(crc);) {
		size_t n = len - sizeof(crc) - pos > CHUNK ? CHUNK : (size_t)(len - sizeof(crc) - pos);
		if (read_at(fd, chunk, n, pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		crc_run = crc32_z(crc_run, chunk, n);
		pos += n;
	}
	if (read_at(fd, &crc, sizeof(crc), pos))
		FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
	if ((uint32_t)crc_run != crc)
		FAIL(PS_EPROTO, "%s: checksum mismatch: the file is damaged (or truncated)", path);
	pos = sizeof(h) + decl_size(s);
	for (int k = 0; k < s->store.nslots; k++) {
		struct ckpt_slot cs;
		const struct ps_slot *sl = &s->store.slots[k];

		if (read_at(fd, &cs, sizeof(cs), pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		if (cs.slice != sl->slice->id || cs.count != (uint64_t)sl->slice->count)
			FAIL(PS_ECONFIG, "%s: slice %d is id %u of %" PRIu64 " values, expected id %u "
			     "of %" PRId64, path, k, cs.slice, cs.count, sl->slice->id,
			     sl->slice->count);
		if (cs.version >= CKPT_MAX_COUNT || cs.steps >= CKPT_MAX_COUNT)
			FAIL(PS_EPROTO, "%s: slice %u has version %" PRIu64 " and %" PRIu64 " steps, "
			     "more than any run makes (damaged?)", path, cs.slice, cs.version,
			     cs.steps);
		if (cs.version > max_version)
			max_version = cs.version;
		pos += sizeof(cs) + cs.count * sizeof(float) * (uint64_t)(1 + sl->opt->nstate);
	}
	if (read_at(fd, fin, (size_t)nw * sizeof(uint64_t), pos))
		FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
	for (int r = 0; r < nw; r++) {
		if (fin[r] >= CKPT_MAX_COUNT)
			FAIL(PS_EPROTO, "%s: worker %d finished clock %" PRIu64 ", more than any run "
			     "makes (damaged?)", path, r, fin[r]);
		if (fin[r] > max_finished)
			max_finished = fin[r];
	}
	if ((version - 1) & CKPT_V_EPOCH) {
		if (read_at(fd, &cmap, sizeof(cmap), pos + (uint64_t)nw * sizeof(uint64_t)))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		if (cmap.epoch >= CKPT_MAX_COUNT)
			FAIL(PS_EPROTO, "%s: map epoch %" PRIu64 ", more re-shards than any run makes "
			     "(damaged?)", path, cmap.epoch);
	}
	/* sync: a slice's version counts the clocks applied. Clock k applies
	 * once every worker pushed it, and a worker pushes clock k only after
	 * it finished k - 1; the push that ends k may come after the apply (a
	 * worker pushing layer by layer ends the clock with its last push), so
	 * a checkpoint written while they train can hold one clock more */
	if (s->cfg->consistency == PS_SYNC && max_version > max_finished + 1)
		FAIL(PS_EPROTO, "%s: a slice is at version %" PRIu64 " but no worker finished "
		     "more than %" PRIu64 " clocks (damaged or edited?)", path, max_version,
		     max_finished);
	if (s->cfg->ntables) {
		char why[300];
		if (delta)
			rc = ps__rows_delta_check(s, fd, need - sizeof(crc), len - sizeof(crc), delta,
						  s->ckpt_base_crc, s->ckpt_base_len, why,
						  sizeof(why));
		else
			rc = ps__rows_ckpt_check(s, fd, need - sizeof(crc), len - sizeof(crc), why,
						 sizeof(why));
		if (rc)
			FAIL(rc, "%s: %s", path, why);
	} else if (delta) {
		FAIL(PS_ECONFIG, "%s: an incremental checkpoint, but the config has no embedding "
		     "tables", path);
	}
	/* pass 2: everything checked, restore */
	pos = sizeof(h) + decl_size(s);
	for (int k = 0; k < s->store.nslots; k++) {
		struct ps_slot *sl = &s->store.slots[k];
		struct ckpt_slot cs;
		size_t n;

		if (read_at(fd, &cs, sizeof(cs), pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		pos += sizeof(cs);
		n = (size_t)cs.count * sizeof(float);
		if (read_at(fd, sl->w, n, pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		pos += n;
		for (int j = 0; j < sl->opt->nstate; j++, pos += n)
			if (read_at(fd, sl->state[j], n, pos))
				FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		sl->version = cs.version;
		sl->steps = cs.steps;
	}
	memcpy(s->finished, fin, (size_t)nw * sizeof(uint64_t));
	s->map_epoch = cmap.epoch;
	if (s->cfg->ntables) {
		char why[300];
		rc = delta ? ps__rows_delta_restore(s, fd, need - sizeof(crc), why, sizeof(why))
			   : ps__rows_ckpt_restore(s, fd, need - sizeof(crc), why, sizeof(why));
		if (rc)
			FAIL(rc, "%s: %s", path, why);
	}
	if (!delta) {
		s->ckpt_have_base = 1;
		s->ckpt_base_crc = crc;
		s->ckpt_base_len = len;
		s->ckpt_seq = 0;
	} else {
		s->ckpt_seq = delta;
	}
out:
	free(chunk);
	free(fin);
	close(fd);
	return rc;
}

int ps_checkpoint_load(struct ps_server *s, const char *path, char *err, size_t errlen)
{
	return load_file(s, path, 0, 0, err, errlen);
}

int ps_checkpoint_load_decl(struct ps_server *s, const char *path, char *err, size_t errlen)
{
	return load_file(s, path, 0, 1, err, errlen);
}

int ps_checkpoint_map_hash(const char *path, uint64_t *hash, char *err, size_t errlen)
{
	struct ckpt_hdr h;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), rc = 0;
	struct stat st;

	if (fd < 0) {
		rc = -errno;
		if (errno != ENOENT)
			snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || read_at(fd, &h, sizeof(h), 0) ||
	    memcmp(h.magic, "PSCKPT0", 7) || h.endian != CKPT_ENDIAN) {
		snprintf(err, errlen, "%s: not a ps-server checkpoint (not a regular file, too short, "
			 "bad magic or the other byte order)", path);
		rc = PS_EPROTO;
	} else {
		*hash = h.map_hash;
	}
	close(fd);
	return rc;
}

/* Renames the incremental checkpoint dp to dp.stale (replacing an older
 * one of that name) and says so; why: the reason. */
static void set_aside(const char *dp, const char *why)
{
	char to[4300];

	snprintf(to, sizeof(to), "%s.stale", dp);
	if (rename(dp, to))
		ps_warn("%s %s; it cannot be set aside as %s (%s), so it is not loaded", dp, why,
			to, strerror(errno));
	else
		ps_warn("%s %s: not loaded, set aside as %s", dp, why, to);
}

int ps_checkpoint_load_deltas(struct ps_server *s, const char *path, char *err, size_t errlen)
{
	return ps_checkpoint_load_deltas_after(s, path, 0, 0, err, errlen);
}

int ps_checkpoint_load_deltas_after(struct ps_server *s, const char *path, uint32_t after,
				    int readonly, char *err, size_t errlen)
{
	char dp[4200];
	struct stat st;
	uint32_t n, applied, aside = 0;
	int rc;

	for (n = after + 1;; n++) {
		ps_checkpoint_delta_path(path, n, dp, sizeof(dp));
		rc = load_file(s, dp, n, 0, err, errlen);
		if (rc == -ENOENT)
			break;
		if (rc == -ESTALE && readonly)
			break; /* another process's folder: its files are left alone */
		if (rc == -ESTALE) {
			/* a crash after a full checkpoint replaced the base, before
			 * the old chain was removed: that chain is history */
			set_aside(dp, "builds on the full checkpoint before the present one (a "
				  "crash came before it was removed)");
			aside++;
			break;
		}
		if (rc)
			return rc;
	}
	applied = n - 1 - after;
	if (readonly)
		return (int)applied;
	/* whatever follows cannot apply without the one before it */
	for (n++;; n++) {
		ps_checkpoint_delta_path(path, n, dp, sizeof(dp));
		if (lstat(dp, &st))
			break;
		set_aside(dp, "follows an incremental checkpoint that is missing or set aside");
		aside++;
	}
	if (aside)
		sync_dir_of(path);
	return (int)applied;
}
