/* checkpoint.c - a shard's state on disk (checkpoint.h).
 *
 * Layout: a fixed header (struct ckpt_hdr), then per owned slice, in slot
 * order, a struct ckpt_slot followed by count floats of weights and nstate
 * times count floats of optimizer state, then nworkers uint64 finished
 * clocks, then a uint32 CRC-32 (zlib) of every byte before it.
 */
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
#include "ps_err.h"
#include "ps_log.h"
#include "server.h"

#define CKPT_MAGIC "PSCKPT01"
#define CKPT_ENDIAN 0x01020304u

struct ckpt_hdr {
	char magic[8];
	uint32_t endian;
	int32_t shard;
	uint64_t map_hash;
	uint32_t optimizer;
	uint32_t nstate;
	uint32_t nworkers;
	uint32_t consistency;
	uint32_t nslots;
	uint32_t reserved;
};

struct ckpt_slot {
	uint32_t slice;
	uint32_t reserved;
	uint64_t count;
	uint64_t version;
	uint64_t steps;
};

void ps_checkpoint_path(const char *dir, int shard, char *buf, size_t len)
{
	snprintf(buf, len, "%s/shard-%d.ckpt", dir, shard);
}

/* Writer that keeps the CRC of everything written. */
struct out {
	int fd;
	uLong crc;
	uint64_t bytes;
	int err;
};

static void put(struct out *o, const void *p, size_t n)
{
	const char *b = p;

	if (o->err)
		return;
	for (size_t done = 0; done < n;) {
		size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
		ssize_t w = write(o->fd, b + done, chunk);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			o->err = w < 0 ? -errno : -EIO;
			return;
		}
		o->crc = crc32(o->crc, (const Bytef *)b + done, (uInt)w);
		done += (size_t)w;
	}
	o->bytes += n;
}

static void fill_hdr(const struct ps_server *s, struct ckpt_hdr *h)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, CKPT_MAGIC, 8);
	h->endian = CKPT_ENDIAN;
	h->shard = s->shard;
	h->map_hash = s->map.hash;
	h->optimizer = (uint32_t)s->cfg->optim.kind;
	h->nstate = (uint32_t)s->store.opt->nstate;
	h->nworkers = (uint32_t)s->cfg->nworkers;
	h->consistency = (uint32_t)s->cfg->consistency;
	h->nslots = (uint32_t)s->store.nslots;
}

/* Fault injection for the crash tests (tests/it_checkpoint.c): with
 * PS_FAULT_CHECKPOINT=write|fsync|rename in its environment the shard
 * kills itself (SIGKILL, as kill -9 would) half way through writing the
 * file, after its fsync, or after the rename. Never set in production. */
static void fault_point(const char *step)
{
	const char *f = getenv("PS_FAULT_CHECKPOINT");

	if (f && !strcmp(f, step)) {
		ps_error("PS_FAULT_CHECKPOINT=%s: killing this shard at that step", step);
		raise(SIGKILL);
	}
}

int ps_checkpoint_write(struct ps_server *s, const char *path, uint64_t *bytes, char *err,
			size_t errlen)
{
	char tmp[4200], dirbuf[4200];
	struct out o = { .crc = crc32(0L, Z_NULL, 0) };
	struct ckpt_hdr h;
	uint32_t crc;
	int dfd;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	o.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (o.fd < 0) {
		snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		return -errno;
	}
	fill_hdr(s, &h);
	put(&o, &h, sizeof(h));
	for (int k = 0; k < s->store.nslots; k++) {
		const struct ps_slot *sl = &s->store.slots[k];
		struct ckpt_slot cs = { .slice = sl->slice->id, .count = (uint64_t)sl->slice->count,
					.version = sl->version, .steps = sl->steps };
		put(&o, &cs, sizeof(cs));
		if (k == s->store.nslots / 2)
			fault_point("write");
		put(&o, sl->w, (size_t)cs.count * sizeof(float));
		for (int j = 0; j < s->store.opt->nstate; j++)
			put(&o, sl->state[j], (size_t)cs.count * sizeof(float));
	}
	put(&o, s->finished, (size_t)s->cfg->nworkers * sizeof(uint64_t));
	crc = (uint32_t)o.crc;
	put(&o, &crc, sizeof(crc));
	if (!o.err && fsync(o.fd))
		o.err = -errno;
	fault_point("fsync");
	if (close(o.fd) && !o.err)
		o.err = -errno;
	if (!o.err && rename(tmp, path))
		o.err = -errno;
	if (o.err) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(-o.err));
		unlink(tmp);
		return o.err;
	}
	fault_point("rename");
	/* the rename is durable once the folder is synced */
	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	*bytes = o.bytes;
	return 0;
}

/* Reads the whole file; NULL with errno set on failure. */
static uint8_t *slurp(const char *path, size_t *len)
{
	struct stat st;
	uint8_t *b;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) || !(b = malloc(st.st_size ? (size_t)st.st_size : 1))) {
		int e = errno ? errno : ENOMEM;
		close(fd);
		errno = e;
		return NULL;
	}
	for (size_t got = 0; got < (size_t)st.st_size;) {
		ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int e = r < 0 ? errno : EIO;
			free(b);
			close(fd);
			errno = e;
			return NULL;
		}
		got += (size_t)r;
	}
	close(fd);
	*len = (size_t)st.st_size;
	return b;
}

#define FAIL(code, ...) do { snprintf(err, errlen, __VA_ARGS__); rc = (code); goto out; } while (0)

int ps_checkpoint_load(struct ps_server *s, const char *path, char *err, size_t errlen)
{
	struct ckpt_hdr h, want;
	size_t len = 0, pos, need;
	uint8_t *b = slurp(path, &len);
	int nstate = s->store.opt->nstate, rc = 0;
	uint32_t crc;

	if (!b) {
		if (errno == ENOENT)
			return -ENOENT;
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		return -errno;
	}
	if (len < sizeof(h) + sizeof(crc))
		FAIL(PS_EPROTO, "%s: %zu bytes, too short for a checkpoint (truncated?)", path, len);
	memcpy(&h, b, sizeof(h));
	if (memcmp(h.magic, CKPT_MAGIC, 8))
		FAIL(PS_EPROTO, "%s: not a ps-server checkpoint (bad magic)", path);
	if (h.endian != CKPT_ENDIAN)
		FAIL(PS_EPROTO, "%s: written on a machine of the other byte order", path);
	memcpy(&crc, b + len - sizeof(crc), sizeof(crc));
	if ((uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(len - sizeof(crc))) != crc)
		FAIL(PS_EPROTO, "%s: checksum mismatch: the file is damaged (or truncated)", path);
	fill_hdr(s, &want);
	if (h.shard != want.shard)
		FAIL(PS_ECONFIG, "%s: belongs to shard %d, this is shard %d", path, h.shard,
		     want.shard);
	if (h.map_hash != want.map_hash)
		FAIL(PS_ECONFIG, "%s: made with another configuration: shard map %016" PRIx64
		     " there, %016" PRIx64 " here (servers, tensors or slice_bytes changed)",
		     path, h.map_hash, want.map_hash);
	if (h.optimizer != want.optimizer || h.nstate != want.nstate)
		FAIL(PS_ECONFIG, "%s: made with optimizer %s, the config says %s", path,
		     ps_optim_name((enum ps_optim_kind)h.optimizer),
		     ps_optim_name(s->cfg->optim.kind));
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
	/* Check every slot's place before copying anything. */
	pos = sizeof(h);
	for (int k = 0; k < s->store.nslots; k++) {
		struct ckpt_slot cs;
		const struct ps_slot *sl = &s->store.slots[k];

		if (len - sizeof(crc) - pos < sizeof(cs))
			FAIL(PS_EPROTO, "%s: ends inside slice %d", path, k);
		memcpy(&cs, b + pos, sizeof(cs));
		if (cs.slice != sl->slice->id || cs.count != (uint64_t)sl->slice->count)
			FAIL(PS_ECONFIG, "%s: slice %d is id %u of %" PRIu64 " values, expected id %u "
			     "of %" PRId64, path, k, cs.slice, cs.count, sl->slice->id,
			     sl->slice->count);
		pos += sizeof(cs);
		need = (size_t)cs.count * sizeof(float) * (size_t)(1 + nstate);
		if (len - sizeof(crc) - pos < need)
			FAIL(PS_EPROTO, "%s: ends inside slice %d", path, k);
		pos += need;
	}
	need = (size_t)s->cfg->nworkers * sizeof(uint64_t);
	if (len - sizeof(crc) - pos != need)
		FAIL(PS_EPROTO, "%s: %zu bytes where the worker clocks should be, expected %zu",
		     path, len - sizeof(crc) - pos, need);
	/* Everything checked: restore. */
	pos = sizeof(h);
	for (int k = 0; k < s->store.nslots; k++) {
		struct ps_slot *sl = &s->store.slots[k];
		struct ckpt_slot cs;
		size_t n;

		memcpy(&cs, b + pos, sizeof(cs));
		pos += sizeof(cs);
		n = (size_t)cs.count * sizeof(float);
		memcpy(sl->w, b + pos, n);
		pos += n;
		for (int j = 0; j < nstate; j++, pos += n)
			memcpy(sl->state[j], b + pos, n);
		sl->version = cs.version;
		sl->steps = cs.steps;
	}
	memcpy(s->finished, b + pos, need);
out:
	free(b);
	return rc;
}
