/* npz.c - NumPy .npz writer (npz.h): zip members stored uncompressed, each
 * an .npy array (format 1.0: magic, a header dict padded to a multiple of
 * 64 bytes, then the raw little-endian elements).
 */
#define _GNU_SOURCE /* mkostemp */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "npz.h"

#define BUF_BYTES (1u << 20)
#define MAX_MEMBERS (1u << 20)
#define U32_MAX64 0xffffffffull

struct member {
	char *name;
	uint64_t off, size;     /* local header offset, stored bytes */
	uint32_t crc;
};

struct ps_npz {
	int fd;
	char path[4096], tmp[4200];
	uint8_t *buf;
	size_t nbuf;
	uint64_t pos;           /* bytes written or buffered so far */
	struct member *m;
	size_t nm, cap;
	int open_member;        /* a member is begun */
	uLong crc;
	int err;                /* first error (-errno), sticky */
};

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v); put16(p + 2, (uint16_t)(v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

static int write_all(int fd, const uint8_t *b, size_t n)
{
	while (n) {
		ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int flush(struct ps_npz *z)
{
	int rc = z->err ? z->err : write_all(z->fd, z->buf, z->nbuf);

	z->nbuf = 0;
	if (rc && !z->err)
		z->err = rc;
	return rc;
}

/* Appends raw bytes (no CRC). */
static int raw(struct ps_npz *z, const void *p, size_t n)
{
	if (z->err)
		return z->err;
	z->pos += n;
	if (z->nbuf + n <= BUF_BYTES) {
		memcpy(z->buf + z->nbuf, p, n);
		z->nbuf += n;
		return 0;
	}
	if (flush(z))
		return z->err;
	if (n >= BUF_BYTES) {
		int rc = write_all(z->fd, p, n);
		if (rc)
			z->err = rc;
		return rc;
	}
	memcpy(z->buf, p, n);
	z->nbuf = n;
	return 0;
}

int ps__npz_open(struct ps_npz **zp, const char *path, char *err, size_t errlen)
{
	struct ps_npz *z = calloc(1, sizeof(*z));

	if (!z || !(z->buf = malloc(BUF_BYTES))) {
		free(z);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (snprintf(z->path, sizeof(z->path), "%s", path) >= (int)sizeof(z->path) ||
	    snprintf(z->tmp, sizeof(z->tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(z->tmp)) {
		snprintf(err, errlen, "%s: path too long", path);
		free(z->buf);
		free(z);
		return -ENAMETOOLONG;
	}
	z->fd = mkostemp(z->tmp, O_CLOEXEC);
	if (z->fd < 0) {
		int rc = -errno;
		snprintf(err, errlen, "cannot create %s: %s", z->tmp, strerror(errno));
		free(z->buf);
		free(z);
		return rc;
	}
	/* mkostemp makes it 0600; the export is a plain output file */
	fchmod(z->fd, 0644);
	*zp = z;
	return 0;
}

int ps__npz_begin(struct ps_npz *z, const char *name)
{
	uint8_t h[30 + 20];
	size_t nl = strlen(name);
	struct member *m;

	if (z->err)
		return z->err;
	if (z->open_member || nl == 0 || nl > 0xffff - 64 || z->nm >= MAX_MEMBERS)
		return z->err = -EINVAL;
	if (z->nm == z->cap) {
		size_t cap = z->cap ? z->cap * 2 : 64;
		struct member *nm = realloc(z->m, cap * sizeof(*nm));
		if (!nm)
			return z->err = -ENOMEM;
		z->m = nm;
		z->cap = cap;
	}
	m = &z->m[z->nm];
	if (!(m->name = strdup(name)))
		return z->err = -ENOMEM;
	z->nm++;
	m->off = z->pos;
	m->size = 0;
	z->crc = crc32(0L, Z_NULL, 0);
	z->open_member = 1;
	/* local header; CRC and sizes are patched by ps__npz_end (the sizes
	 * in the zip64 extra field, so any size fits) */
	memset(h, 0, sizeof(h));
	put32(h, 0x04034b50);
	put16(h + 4, 45);               /* version needed: zip64 */
	put16(h + 6, 0x0800);           /* names are UTF-8 */
	put16(h + 8, 0);                /* stored */
	put16(h + 10, 0);               /* 00:00:00 */
	put16(h + 12, 0x0021);          /* 1980-01-01 */
	put32(h + 18, 0xffffffffu);
	put32(h + 22, 0xffffffffu);
	put16(h + 26, (uint16_t)nl);
	put16(h + 28, 20);
	if (raw(z, h, 30) || raw(z, name, nl))
		return z->err;
	put16(h + 30, 0x0001);
	put16(h + 32, 16);
	return raw(z, h + 30, 20);
}

int ps__npz_write(struct ps_npz *z, const void *p, size_t n)
{
	if (z->err)
		return z->err;
	if (!z->open_member)
		return z->err = -EINVAL;
	z->crc = crc32_z(z->crc, p, n);
	z->m[z->nm - 1].size += n;
	return raw(z, p, n);
}

int ps__npz_end(struct ps_npz *z)
{
	struct member *m;
	uint8_t b[16];
	size_t nl;

	if (z->err)
		return z->err;
	if (!z->open_member)
		return z->err = -EINVAL;
	m = &z->m[z->nm - 1];
	m->crc = (uint32_t)z->crc;
	z->open_member = 0;
	if (flush(z))
		return z->err;
	nl = strlen(m->name);
	put32(b, m->crc);
	if (pwrite(z->fd, b, 4, (off_t)(m->off + 14)) != 4)
		return z->err = -errno ? -errno : -EIO;
	put64(b, m->size);
	put64(b + 8, m->size);
	if (pwrite(z->fd, b, 16, (off_t)(m->off + 30 + nl + 4)) != 16)
		return z->err = -errno ? -errno : -EIO;
	return 0;
}

int ps__npz_begin_npy(struct ps_npz *z, const char *name, const char *descr,
		      const int64_t *dims, int ndims)
{
	char hdr[512], shape[256];
	size_t sl = 0, hl, total;
	int rc;

	shape[0] = '\0';
	for (int i = 0; i < ndims; i++)
		sl += (size_t)snprintf(shape + sl, sizeof(shape) - sl, "%" PRId64 "%s", dims[i],
				       ndims == 1 ? "," : i + 1 < ndims ? ", " : "");
	hl = (size_t)snprintf(hdr + 10, sizeof(hdr) - 10,
			      "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr,
			      shape);
	/* padded with spaces so that magic + header is a multiple of 64 */
	total = (10 + hl + 1 + 63) / 64 * 64;
	memset(hdr + 10 + hl, ' ', total - 10 - hl - 1);
	hdr[total - 1] = '\n';
	memcpy(hdr, "\x93NUMPY\x01\x00", 8);
	put16((uint8_t *)hdr + 8, (uint16_t)(total - 10));
	rc = ps__npz_begin(z, name);
	return rc ? rc : ps__npz_write(z, hdr, total);
}

int ps__npz_add_npy(struct ps_npz *z, const char *name, const char *descr,
		    const int64_t *dims, int ndims, const void *data, size_t bytes)
{
	int rc = ps__npz_begin_npy(z, name, descr, dims, ndims);

	if (!rc && bytes)
		rc = ps__npz_write(z, data, bytes);
	return rc ? rc : ps__npz_end(z);
}

/* The central directory and its end records. */
static int finish(struct ps_npz *z)
{
	uint64_t cd_off = z->pos, cd_size;
	uint8_t h[46 + 28], e[56 + 20 + 22];

	for (size_t i = 0; i < z->nm; i++) {
		const struct member *m = &z->m[i];
		size_t nl = strlen(m->name), xl = 0;
		int big = m->size >= U32_MAX64, far = m->off >= U32_MAX64;

		memset(h, 0, sizeof(h));
		put32(h, 0x02014b50);
		put16(h + 4, 45 | (3 << 8));    /* made by: unix, zip64 */
		put16(h + 6, 45);
		put16(h + 8, 0x0800);
		put16(h + 14, 0x0021);
		put32(h + 16, m->crc);
		put32(h + 20, big ? 0xffffffffu : (uint32_t)m->size);
		put32(h + 24, big ? 0xffffffffu : (uint32_t)m->size);
		put16(h + 28, (uint16_t)nl);
		put32(h + 38, 0100644u << 16);  /* a regular file, rw-r--r-- */
		put32(h + 42, far ? 0xffffffffu : (uint32_t)m->off);
		if (big || far) {
			uint8_t *x = h + 46;
			put16(x, 0x0001);
			xl = 4;
			if (big) {
				put64(x + xl, m->size);
				put64(x + xl + 8, m->size);
				xl += 16;
			}
			if (far) {
				put64(x + xl, m->off);
				xl += 8;
			}
			put16(x + 2, (uint16_t)(xl - 4));
		}
		put16(h + 30, (uint16_t)xl);
		if (raw(z, h, 46) || raw(z, m->name, nl) || (xl && raw(z, h + 46, xl)))
			return z->err;
	}
	cd_size = z->pos - cd_off;
	memset(e, 0, sizeof(e));
	if (z->nm >= 0xffff || cd_off >= U32_MAX64 || cd_size >= U32_MAX64) {
		uint64_t z64 = z->pos;
		put32(e, 0x06064b50);
		put64(e + 4, 44);
		put16(e + 12, 45 | (3 << 8));
		put16(e + 14, 45);
		put64(e + 24, z->nm);
		put64(e + 32, z->nm);
		put64(e + 40, cd_size);
		put64(e + 48, cd_off);
		put32(e + 56, 0x07064b50);
		put64(e + 64, z64);
		put32(e + 72, 1);
		if (raw(z, e, 76))
			return z->err;
		memset(e, 0, sizeof(e));
	}
	put32(e, 0x06054b50);
	put16(e + 8, z->nm >= 0xffff ? 0xffff : (uint16_t)z->nm);
	put16(e + 10, z->nm >= 0xffff ? 0xffff : (uint16_t)z->nm);
	put32(e + 12, cd_size >= U32_MAX64 ? 0xffffffffu : (uint32_t)cd_size);
	put32(e + 16, cd_off >= U32_MAX64 ? 0xffffffffu : (uint32_t)cd_off);
	if (raw(z, e, 22) || flush(z))
		return z->err;
	return 0;
}

int ps__npz_close(struct ps_npz *z, int keep, char *err, size_t errlen)
{
	int rc = 0;

	if (keep) {
		if (z->open_member)
			z->err = -EINVAL;
		rc = z->err ? z->err : finish(z);
		if (!rc && fsync(z->fd))
			rc = -errno;
		if (rc)
			snprintf(err, errlen, "cannot write %s: %s", z->tmp, strerror(-rc));
	}
	if (close(z->fd) && keep && !rc) {
		rc = -errno;
		snprintf(err, errlen, "cannot write %s: %s", z->tmp, strerror(errno));
	}
	if (keep && !rc && rename(z->tmp, z->path)) {
		rc = -errno;
		snprintf(err, errlen, "cannot rename %s to %s: %s", z->tmp, z->path, strerror(errno));
	}
	if (!keep || rc)
		unlink(z->tmp);
	for (size_t i = 0; i < z->nm; i++)
		free(z->m[i].name);
	free(z->m);
	free(z->buf);
	free(z);
	return rc;
}
