/* dataset.c - reading IDX image/label files (gzip or plain) with every
 * header field checked, and the per-worker shuffling batcher.
 *
 * Plain files are checked against their size on disk before anything is
 * allocated. Gzip files cannot tell their decompressed size up front, so
 * their buffer grows with the data that really arrives: a header promising
 * terabytes costs no more memory than the bytes the file actually holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "dataset.h"
#include "ps_err.h"

#define IMAGES_MAGIC 0x00000803u
#define LABELS_MAGIC 0x00000801u
#define READ_CHUNK   (1 << 26)   /* bytes per gzread call (it takes an int) */
#define GROW_START   (1 << 20)   /* first buffer size for gzip data */

/* Formats the reason for a failure into err (when there is one); returns rc. */
__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* What one IDX file must look like and what its header said. */
struct idx {
	const char *path;
	uint32_t magic;          /* expected */
	const char *kind;        /* "image" or "label", for messages */
	int ndims;               /* 3 for images, 1 for labels */
	uint32_t dims[3];        /* from the header */
	size_t hdr;              /* header bytes: 4 + 4 * ndims */
	size_t bytes;            /* data bytes the header promises */
	uint8_t *data;
};

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* "60000 images of 28x28 (47040000 bytes)" or "60000 labels (60000 bytes)". */
static void describe_promise(const struct idx *f, char *buf, size_t len)
{
	if (f->ndims == 3)
		snprintf(buf, len, "%u images of %ux%u (%zu bytes)", f->dims[0], f->dims[1],
			 f->dims[2], f->bytes);
	else
		snprintf(buf, len, "%u labels (%zu bytes)", f->dims[0], f->bytes);
}

/* Turns a gzip stream error into a message; 0 when there is none (a
 * premature end, Z_BUF_ERROR, shows up as a short read instead). */
static int check_gz(gzFile gz, const struct idx *f, int saved_errno, char *err, size_t errlen)
{
	int zerr;
	const char *msg = gzerror(gz, &zerr);
	const char *sep;

	if (zerr == Z_OK || zerr == Z_BUF_ERROR)
		return 0;
	if (zerr == Z_ERRNO)
		return fail(err, errlen, saved_errno ? -saved_errno : -EIO, "%s: read error: %s",
			    f->path, strerror(saved_errno ? saved_errno : EIO));
	if (zerr == Z_MEM_ERROR)
		return fail(err, errlen, -ENOMEM, "%s: out of memory while decompressing", f->path);
	/* zlib prefixes its message with "<fd:N>: " for gzdopen streams. */
	if (strncmp(msg, "<fd:", 4) == 0 && (sep = strstr(msg, ": ")))
		msg = sep + 2;
	return fail(err, errlen, -EBADMSG, "%s: corrupt gzip data: %s", f->path, msg);
}

/* Reads up to len bytes, fewer only at end of stream; stores the count in
 * *got. Returns 0 or a negative code with err set. */
static int read_full(gzFile gz, const struct idx *f, uint8_t *buf, size_t len, size_t *got,
		     char *err, size_t errlen)
{
	*got = 0;
	while (*got < len) {
		size_t want = len - *got < READ_CHUNK ? len - *got : READ_CHUNK;
		int n, rc;

		errno = 0;
		n = gzread(gz, buf + *got, (unsigned)want);
		rc = check_gz(gz, f, errno, err, errlen);
		if (rc)
			return rc;
		if (n < 0)
			return fail(err, errlen, -EIO, "%s: read error", f->path);
		if (n == 0)
			break;
		*got += (size_t)n;
	}
	return 0;
}

/* " (gzip stream cut off: ...)" after a short read that zlib blames on
 * the compressed stream ending early, "" otherwise. */
static const char *cut_note(gzFile gz)
{
	int zerr;

	gzerror(gz, &zerr);
	return zerr == Z_BUF_ERROR ? " (gzip stream cut off: unexpected end of file)" : "";
}

/* Reports a short data section: how much the header promised and how much
 * there is, and zlib's word when the gzip stream itself was cut off. */
static int truncated(gzFile gz, const struct idx *f, size_t have, char *err, size_t errlen)
{
	char promise[128];

	describe_promise(f, promise, sizeof(promise));
	return fail(err, errlen, -EBADMSG, "%s: truncated: header promises %s, file has only %zu%s",
		    f->path, promise, have, cut_note(gz));
}

/* Reads and checks the header; fills f->dims, f->hdr and f->bytes. */
static int read_header(gzFile gz, struct idx *f, char *err, size_t errlen)
{
	uint8_t h[16];
	size_t got, bytes = 1;
	uint32_t magic;
	int rc;

	f->hdr = 4 + 4 * (size_t)f->ndims;
	rc = read_full(gz, f, h, f->hdr, &got, err, errlen);
	if (rc)
		return rc;
	if (got == 0 && !*cut_note(gz))
		return fail(err, errlen, -EBADMSG, "%s: empty file (expected an IDX %s file)",
			    f->path, f->kind);
	if (got < f->hdr)
		return fail(err, errlen, -EBADMSG,
			    "%s: truncated header: %zu bytes, an IDX %s file header has %zu%s",
			    f->path, got, f->kind, f->hdr, cut_note(gz));
	magic = be32(h);
	if (magic != f->magic)
		return fail(err, errlen, -EBADMSG,
			    "%s: not an IDX %s file: magic 0x%08x, expected 0x%08x%s", f->path,
			    f->kind, magic, f->magic,
			    magic == IMAGES_MAGIC ? " (this is an image file)" :
			    magic == LABELS_MAGIC ? " (this is a label file)" : "");
	for (int i = 0; i < f->ndims; i++)
		f->dims[i] = be32(h + 4 + 4 * i);
	if (f->dims[0] < 1 || f->dims[0] > PS_DATASET_MAX_IMAGES)
		return fail(err, errlen, PS_ETOOBIG,
			    "%s: implausible header: %u %ss (allowed 1..%d)", f->path, f->dims[0],
			    f->kind, PS_DATASET_MAX_IMAGES);
	for (int i = 1; i < f->ndims; i++)
		if (f->dims[i] < 1 || f->dims[i] > PS_DATASET_MAX_SIDE)
			return fail(err, errlen, PS_ETOOBIG,
				    "%s: implausible header: images of %ux%u (sides allowed 1..%d)",
				    f->path, f->dims[1], f->dims[2], PS_DATASET_MAX_SIDE);
	/* Within the limits this cannot overflow 64 bits, but size_t may be 32. */
	for (int i = 0; i < f->ndims; i++)
		if (__builtin_mul_overflow(bytes, (size_t)f->dims[i], &bytes))
			return fail(err, errlen, PS_ETOOBIG,
				    "%s: implausible header: data size overflows", f->path);
	f->bytes = bytes;
	return 0;
}

/* Reads the data of a plain file whose size on disk is size: checked
 * exactly against the header before allocating. */
static int read_data_plain(gzFile gz, struct idx *f, off_t size, char *err, size_t errlen)
{
	char promise[128];
	size_t have = (size_t)size - f->hdr, got;
	int rc;

	describe_promise(f, promise, sizeof(promise));
	if (have < f->bytes)
		return truncated(gz, f, have, err, errlen);
	if (have > f->bytes)
		return fail(err, errlen, -EBADMSG,
			    "%s: trailing data: header promises %s, file has %zu", f->path, promise,
			    have);
	f->data = malloc(f->bytes);
	if (!f->data)
		return fail(err, errlen, -ENOMEM, "%s: out of memory for %s", f->path, promise);
	rc = read_full(gz, f, f->data, f->bytes, &got, err, errlen);
	if (rc)
		goto err_free_data;
	if (got < f->bytes) {   /* the file shrank under us */
		rc = truncated(gz, f, got, err, errlen);
		goto err_free_data;
	}
	return 0;

err_free_data:
	free(f->data);
	f->data = NULL;
	return rc;
}

/* Reads the data of a gzip stream, growing the buffer with what arrives. */
static int read_data_gz(gzFile gz, struct idx *f, char *err, size_t errlen)
{
	size_t cap = 0, have = 0, got;
	uint8_t *buf = NULL, *nbuf;
	int rc;

	for (;;) {
		if (have == cap) {
			size_t ncap = cap ? cap * 2 : GROW_START;
			if (ncap > f->bytes || ncap < cap)
				ncap = f->bytes;
			nbuf = realloc(buf, ncap);
			if (!nbuf) {
				rc = fail(err, errlen, -ENOMEM, "%s: out of memory after %zu bytes",
					  f->path, have);
				goto err_free_buf;
			}
			buf = nbuf;
			cap = ncap;
		}
		rc = read_full(gz, f, buf + have, cap - have, &got, err, errlen);
		if (rc)
			goto err_free_buf;
		have += got;
		if (have == f->bytes)
			break;
		if (have < cap) {
			rc = truncated(gz, f, have, err, errlen);
			goto err_free_buf;
		}
	}
	f->data = buf;
	return 0;

err_free_buf:
	free(buf);
	return rc;
}

/* Opens, checks and reads one IDX file into f->data (caller frees). */
static int read_idx(struct idx *f, char *err, size_t errlen)
{
	struct stat st;
	gzFile gz;
	uint8_t probe;
	size_t got;
	int fd, rc;

	fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, errlen, -errno, "%s: %s", f->path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = fail(err, errlen, -errno, "%s: %s", f->path, strerror(errno));
		close(fd);
		return rc;
	}
	if (S_ISDIR(st.st_mode)) {
		close(fd);
		return fail(err, errlen, -EISDIR, "%s: %s, expected an IDX %s file", f->path,
			    strerror(EISDIR), f->kind);
	}
	gz = gzdopen(fd, "rb");
	if (!gz) {
		close(fd);
		return fail(err, errlen, -ENOMEM, "%s: cannot start reading (out of memory)",
			    f->path);
	}
	gzbuffer(gz, 1 << 17);
	rc = read_header(gz, f, err, errlen);
	if (rc)
		goto err_close;
	if (gzdirect(gz) && S_ISREG(st.st_mode))
		rc = read_data_plain(gz, f, st.st_size, err, errlen);
	else
		rc = read_data_gz(gz, f, err, errlen);
	if (rc)
		goto err_close;
	/* Anything after the promised data is an error: a file with more than
	 * its header says is not the file we think. Reading on to the end also
	 * makes zlib check the gzip trailer (CRC-32 and length); zlib itself
	 * ignores non-gzip bytes after the last gzip member, as gzip -d does. */
	rc = read_full(gz, f, &probe, 1, &got, err, errlen);
	if (!rc && got) {
		char promise[128];
		describe_promise(f, promise, sizeof(promise));
		rc = fail(err, errlen, -EBADMSG, "%s: trailing data: header promises %s, file has more",
			  f->path, promise);
	} else if (!rc && *cut_note(gz)) {
		rc = fail(err, errlen, -EBADMSG,
			  "%s: truncated: gzip stream cut off after the data, before its checksum "
			  "(unexpected end of file)", f->path);
	}
	if (rc)
		goto err_free_data;
	gzclose(gz);
	return 0;

err_free_data:
	free(f->data);
	f->data = NULL;
err_close:
	gzclose(gz);
	return rc;
}

int ps_dataset_load(struct ps_dataset *d, const char *images_path, const char *labels_path,
		    int classes, char *err, size_t errlen)
{
	struct idx im = { .path = images_path, .magic = IMAGES_MAGIC, .kind = "image", .ndims = 3 };
	struct idx lb = { .path = labels_path, .magic = LABELS_MAGIC, .kind = "label", .ndims = 1 };
	int rc;

	memset(d, 0, sizeof(*d));
	if (!images_path || !labels_path)
		return fail(err, errlen, -EINVAL, "dataset: no image or label file given");
	if (classes < 1 || classes > 256)
		return fail(err, errlen, -EINVAL,
			    "%s: %d classes asked for; byte labels allow 1..256", labels_path, classes);
	rc = read_idx(&im, err, errlen);
	if (rc)
		return rc;
	rc = read_idx(&lb, err, errlen);
	if (rc)
		goto err_free_images;
	if (im.dims[0] != lb.dims[0]) {
		rc = fail(err, errlen, PS_ESHAPE, "%s has %u images but %s has %u labels",
			  images_path, im.dims[0], labels_path, lb.dims[0]);
		goto err_free_labels;
	}
	for (uint32_t i = 0; i < lb.dims[0]; i++)
		if (lb.data[i] >= classes) {
			rc = fail(err, errlen, -EBADMSG,
				  "%s: label %u at index %u is out of range (%d classes: 0..%d)",
				  labels_path, (unsigned)lb.data[i], i, classes, classes - 1);
			goto err_free_labels;
		}
	d->n = (int)im.dims[0];
	d->rows = (int)im.dims[1];
	d->cols = (int)im.dims[2];
	d->classes = classes;
	d->images = im.data;
	d->labels = lb.data;
	return 0;

err_free_labels:
	free(lb.data);
err_free_images:
	free(im.data);
	return rc;
}

/* Finds DIR/NAME.gz or DIR/NAME; path gets the one to read. */
static int find_file(const char *dir, const char *name, char *path, size_t len, char *err,
		     size_t errlen)
{
	struct stat st;

	if ((size_t)snprintf(path, len, "%s/%s.gz", dir, name) >= len)
		return fail(err, errlen, -ENAMETOOLONG, "%s/%s: %s", dir, name,
			    strerror(ENAMETOOLONG));
	if (stat(path, &st) == 0 || errno != ENOENT)
		return 0;                        /* read_idx reports other errors */
	snprintf(path, len, "%s/%s", dir, name);
	if (stat(path, &st) == 0 || errno != ENOENT)
		return 0;
	return fail(err, errlen, -ENOENT,
		    "%s/%s[.gz]: No such file or directory (install Debian's dataset-fashion-mnist "
		    "package)", dir, name);
}

int ps_dataset_load_dir(struct ps_dataset *d, const char *dir, const char *split, int classes,
			char *err, size_t errlen)
{
	char name[256], images[PATH_MAX], labels[PATH_MAX];
	struct stat st;
	int rc;

	memset(d, 0, sizeof(*d));
	if (!dir || !split || !*split || strchr(split, '/'))
		return fail(err, errlen, -EINVAL, "dataset: bad directory or split name");
	if (stat(dir, &st) < 0)
		return fail(err, errlen, -errno, "%s: %s%s", dir, strerror(errno),
			    errno == ENOENT ? " (install Debian's dataset-fashion-mnist package)" : "");
	if (!S_ISDIR(st.st_mode))
		return fail(err, errlen, -ENOTDIR, "%s: %s", dir, strerror(ENOTDIR));
	snprintf(name, sizeof(name), "%s-images-idx3-ubyte", split);
	rc = find_file(dir, name, images, sizeof(images), err, errlen);
	if (rc)
		return rc;
	snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", split);
	rc = find_file(dir, name, labels, sizeof(labels), err, errlen);
	if (rc)
		return rc;
	return ps_dataset_load(d, images, labels, classes, err, errlen);
}

void ps_dataset_free(struct ps_dataset *d)
{
	free(d->images);
	free(d->labels);
	memset(d, 0, sizeof(*d));
}

/* The 256 normalized values a pixel byte can take. */
static void norm_table(float t[256])
{
	for (int p = 0; p < 256; p++)
		t[p] = ((float)p / 255.0f - PS_DATASET_MEAN) / PS_DATASET_STD;
}

static void fill_one(const struct ps_dataset *d, const float t[256], int idx, float *x, int32_t *y)
{
	size_t pixels = (size_t)d->rows * (size_t)d->cols;
	const uint8_t *src = d->images + (size_t)idx * pixels;

	for (size_t i = 0; i < pixels; i++)
		x[i] = t[src[i]];
	*y = d->labels[idx];
}

void ps_dataset_fill(const struct ps_dataset *d, int first, int count, float *x, int32_t *y)
{
	size_t pixels = (size_t)d->rows * (size_t)d->cols;
	float t[256];

	norm_table(t);
	for (int k = 0; k < count; k++)
		fill_one(d, t, first + k, x + (size_t)k * pixels, y + k);
}

/* splitmix64: one output per call from a 64-bit counter state. */
static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

int ps_batcher_init(struct ps_batcher *b, const struct ps_dataset *d, int rank, int nworkers,
		    int batch, long limit, uint64_t seed)
{
	long used;
	int part;

	memset(b, 0, sizeof(*b));
	if (!d || d->n < 1 || !d->images || nworkers < 1 || rank < 0 || rank >= nworkers ||
	    batch < 1 || limit < 0)
		return -EINVAL;
	used = limit > 0 && limit < d->n ? limit : d->n;
	part = (int)(used / nworkers);
	b->order = malloc(part ? (size_t)part * sizeof(*b->order) : 1);
	if (!b->order)
		return -ENOMEM;
	b->d = d;
	b->batch = batch;
	b->first = rank * part;
	b->count = part;
	b->seed = seed;
	ps_batcher_epoch(b, 0);
	return 0;
}

void ps_batcher_epoch(struct ps_batcher *b, int epoch)
{
	/* The epoch is mixed through splitmix64 once so that neighbouring
	 * (seed, epoch) pairs start unrelated streams. */
	uint64_t e = (uint64_t)(int64_t)epoch, s = b->seed ^ splitmix64(&e);

	for (int i = 0; i < b->count; i++)
		b->order[i] = b->first + i;
	for (int i = b->count - 1; i > 0; i--) {
		/* Multiply-shift maps 64 random bits to 0..i with negligible bias. */
		int j = (int)(((unsigned __int128)splitmix64(&s) * (unsigned)(i + 1)) >> 64);
		int tmp = b->order[i];
		b->order[i] = b->order[j];
		b->order[j] = tmp;
	}
	b->pos = 0;
}

int ps_batcher_next(struct ps_batcher *b, float *x, int32_t *y)
{
	size_t pixels;
	float t[256];

	if (!b->d || b->count - b->pos < b->batch)
		return 0;
	pixels = (size_t)b->d->rows * (size_t)b->d->cols;
	norm_table(t);
	for (int k = 0; k < b->batch; k++)
		fill_one(b->d, t, b->order[b->pos + k], x + (size_t)k * pixels, y + k);
	b->pos += b->batch;
	return b->batch;
}

int ps_batcher_batches(const struct ps_batcher *b)
{
	return b->batch ? b->count / b->batch : 0;
}

void ps_batcher_seek(struct ps_batcher *b, int pos)
{
	b->pos = pos >= 0 && pos <= b->count ? pos : b->count;
}

const int *ps_batcher_peek(const struct ps_batcher *b)
{
	return b->order + b->pos;
}

void ps_batcher_free(struct ps_batcher *b)
{
	free(b->order);
	memset(b, 0, sizeof(*b));
}
