/* check_dataset.c - IDX loading and the per-worker batcher.
 *
 * The real Fashion-MNIST (Debian's dataset-fashion-mnist package) is loaded
 * and checked against its known shape, class balance and pixel statistics;
 * without it those cases are skipped with a printed reason. Hostile files,
 * each written both plain and gzip-compressed, must be refused with a
 * message naming the file and the fault, without crash or leak (run under
 * SANITIZE=address,undefined to see the latter). The batcher must give
 * disjoint, equal, covering parts in a reproducible per-epoch order.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include "dataset.h"
#include "ps_err.h"
#include "test_util.h"

#ifndef FMNIST
#define FMNIST "/usr/share/datasets/fashion-mnist"
#endif

static char g_dir[64];   /* temporary directory for the hostile files */

/* ---- building IDX files ------------------------------------------------ */

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* An image file: header for n images of r x c, then data bytes of pixels
 * (pixel k is k * 7 mod 256); caller frees. */
static uint8_t *images_file(uint32_t magic, uint32_t n, uint32_t r, uint32_t c, size_t data,
			    size_t *len)
{
	uint8_t *b = malloc(16 + data + 1);

	ck_assert_ptr_nonnull(b);
	put_be32(b, magic);
	put_be32(b + 4, n);
	put_be32(b + 8, r);
	put_be32(b + 12, c);
	for (size_t k = 0; k < data; k++)
		b[16 + k] = (uint8_t)(k * 7);
	*len = 16 + data;
	return b;
}

/* A label file: header for n labels, then data labels i % classes. */
static uint8_t *labels_file(uint32_t magic, uint32_t n, size_t data, int classes, size_t *len)
{
	uint8_t *b = malloc(8 + data + 1);

	ck_assert_ptr_nonnull(b);
	put_be32(b, magic);
	put_be32(b + 4, n);
	for (size_t k = 0; k < data; k++)
		b[8 + k] = (uint8_t)(k % (size_t)classes);
	*len = 8 + data;
	return b;
}

/* Writes len bytes as g_dir/name, gzip-compressed (name + ".gz") when gz;
 * the path goes to path (512 bytes). */
static void put_file(const char *name, const void *data, size_t len, int gz, char *path)
{
	snprintf(path, 512, "%s/%s%s", g_dir, name, gz ? ".gz" : "");
	if (gz) {
		gzFile g = gzopen(path, "wb");
		ck_assert_ptr_nonnull(g);
		ck_assert_int_eq(len ? gzwrite(g, data, (unsigned)len) : 0, (int)len);
		ck_assert_int_eq(gzclose(g), Z_OK);
	} else {
		FILE *f = fopen(path, "wb");
		ck_assert_ptr_nonnull(f);
		ck_assert_uint_eq(fwrite(data, 1, len, f), len);
		ck_assert_int_eq(fclose(f), 0);
	}
}

/* Writes raw bytes (already compressed or deliberately broken). */
static void put_raw(const char *name, const void *data, size_t len, char *path)
{
	put_file(name, data, len, 0, path);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	rewind(f);
	b = malloc(*len + 64);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(fread(b, 1, *len, f), *len);
	fclose(f);
	return b;
}

/* A valid pair of 5 images of 3x4 and 5 labels, named PREFIX-images/labels. */
static void put_valid(const char *prefix, int gz, char *img, char *lbl)
{
	char name[128];
	size_t len;
	uint8_t *b;

	b = images_file(0x803, 5, 3, 4, 60, &len);
	snprintf(name, sizeof(name), "%s-images", prefix);
	put_file(name, b, len, gz, img);
	free(b);
	b = labels_file(0x801, 5, 5, 10, &len);
	snprintf(name, sizeof(name), "%s-labels", prefix);
	put_file(name, b, len, gz, lbl);
	free(b);
}

/* Loading must fail with rc (or any negative code when rc is 0), an error
 * that starts with the culprit's path (when one is given) and contains
 * want, and an empty set. */
static void expect_fail_in(const char *culprit, const char *img, const char *lbl, int classes,
			   int rc, const char *want)
{
	struct ps_dataset d;
	char err[1024] = "";
	int got = ps_dataset_load(&d, img, lbl, classes, err, sizeof(err));

	if (culprit)
		ck_assert_msg(strncmp(err, culprit, strlen(culprit)) == 0 &&
			      strncmp(err + strlen(culprit), ": ", 2) == 0,
			      "error '%s' does not start with '%s: '", err, culprit);

	ck_assert_msg(got < 0, "%s / %s loaded; expected error '%s'", img, lbl, want);
	if (rc)
		ck_assert_msg(got == rc, "rc %d (%s), expected %d; err: %s", got, ps_strerror(got), rc,
			      err);
	ck_assert_msg(strstr(err, want), "error '%s' lacks '%s'", err, want);
	ck_assert_int_eq(d.n, 0);
	ck_assert_ptr_null(d.images);
	ck_assert_ptr_null(d.labels);
	ps_dataset_free(&d);
}

static void expect_fail(const char *img, const char *lbl, int classes, int rc, const char *want)
{
	expect_fail_in(NULL, img, lbl, classes, rc, want);
}

/* ---- the real Fashion-MNIST -------------------------------------------- */

static double cpu_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_real(const char *split, int n, int per_class)
{
	struct ps_dataset d;
	char err[1024];
	int hist[10] = { 0 }, lo = 255, hi = 0;
	double t0 = cpu_seconds(), t;

	ck_assert_msg(ps_dataset_load_dir(&d, FMNIST, split, 10, err, sizeof(err)) == 0, "%s", err);
	t = cpu_seconds() - t0;
	printf("%s: %d images loaded in %.3f s of CPU time\n", split, d.n, t);
	if (!SANITIZED)
		ck_assert_msg(t < 1.0, "loading %s took %.3f s", split, t);
	ck_assert_int_eq(d.n, n);
	ck_assert_int_eq(d.rows, 28);
	ck_assert_int_eq(d.cols, 28);
	ck_assert_int_eq(d.classes, 10);
	for (int i = 0; i < d.n; i++)
		hist[d.labels[i]]++;
	for (int c = 0; c < 10; c++)
		ck_assert_msg(hist[c] == per_class, "class %d has %d images", c, hist[c]);
	for (size_t k = 0; k < (size_t)d.n * 784; k++) {
		lo = d.images[k] < lo ? d.images[k] : lo;
		hi = d.images[k] > hi ? d.images[k] : hi;
	}
	ck_assert_int_eq(lo, 0);
	ck_assert_int_eq(hi, 255);
	ck_assert_int_eq(d.labels[0], 9);   /* both splits start with an ankle boot */
	ps_dataset_free(&d);
	ck_assert_ptr_null(d.images);
}

START_TEST(test_real_train)
{
	check_real("train", 60000, 6000);
}
END_TEST

START_TEST(test_real_test)
{
	check_real("t10k", 10000, 1000);
}
END_TEST

/* The normalization constants are the training set's mean and deviation,
 * so normalized training pixels have mean 0 and deviation 1. */
START_TEST(test_real_normalized)
{
	struct ps_dataset d;
	char err[1024];
	double s = 0, s2 = 0, mean, sd;
	float *x = malloc(1000 * 784 * sizeof(float));
	int32_t y[1000];

	ck_assert_ptr_nonnull(x);
	ck_assert_msg(ps_dataset_load_dir(&d, FMNIST, "train", 10, err, sizeof(err)) == 0, "%s", err);
	for (int first = 0; first < d.n; first += 1000) {
		ps_dataset_fill(&d, first, 1000, x, y);
		for (int k = 0; k < 1000 * 784; k++) {
			s += x[k];
			s2 += (double)x[k] * x[k];
		}
		for (int k = 0; k < 1000; k++)
			ck_assert_int_eq(y[k], d.labels[first + k]);
	}
	mean = s / (d.n * 784.0);
	sd = sqrt(s2 / (d.n * 784.0) - mean * mean);
	ck_assert_msg(fabs(mean) < 0.001, "mean %f", mean);
	ck_assert_msg(fabs(sd - 1) < 0.001, "deviation %f", sd);
	ps_dataset_free(&d);
	free(x);
}
END_TEST

/* Four workers over the real training set: equal, disjoint, labels right. */
START_TEST(test_real_batcher)
{
	struct ps_dataset d;
	struct ps_batcher b;
	char err[1024];
	float *x = malloc(64 * 784 * sizeof(float));
	int32_t y[64];
	int total = 0;

	ck_assert_ptr_nonnull(x);
	ck_assert_msg(ps_dataset_load_dir(&d, FMNIST, "train", 10, err, sizeof(err)) == 0, "%s", err);
	for (int r = 0; r < 4; r++) {
		ck_assert_int_eq(ps_batcher_init(&b, &d, r, 4, 64, 0, 42), 0);
		ck_assert_int_eq(ps_batcher_batches(&b), 15000 / 64);
		ps_batcher_epoch(&b, 3);
		for (int n; (n = ps_batcher_next(&b, x, y)) > 0; total += n)
			for (int k = 0; k < n; k++)
				ck_assert(y[k] >= 0 && y[k] < 10);
		ps_batcher_free(&b);
	}
	ck_assert_int_eq(total, 4 * (15000 / 64) * 64);
	ps_dataset_free(&d);
	free(x);
}
END_TEST

/* ---- valid synthetic files --------------------------------------------- */

START_TEST(test_valid_both_formats)
{
	int gz = _i;
	struct ps_dataset d;
	char img[512], lbl[512], err[1024];
	float x[5 * 12];
	int32_t y[5];

	put_valid(gz ? "ok-gz" : "ok-plain", gz, img, lbl);
	ck_assert_msg(ps_dataset_load(&d, img, lbl, 10, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(d.n, 5);
	ck_assert_int_eq(d.rows, 3);
	ck_assert_int_eq(d.cols, 4);
	for (int k = 0; k < 60; k++)
		ck_assert_int_eq(d.images[k], (uint8_t)(k * 7));
	ps_dataset_fill(&d, 1, 4, x, y);
	for (int k = 0; k < 48; k++)
		ck_assert(x[k] == ((float)(uint8_t)((k + 12) * 7) / 255.0f - 0.2860f) / 0.3530f);
	for (int k = 0; k < 4; k++)
		ck_assert_int_eq(y[k], k + 1);
	ps_dataset_free(&d);
	ck_assert_int_eq(d.n, 0);
	ps_dataset_free(&d);   /* twice is harmless */
}
END_TEST

/* load_dir finds SPLIT-*-idx?-ubyte with or without .gz, .gz first. */
START_TEST(test_load_dir_names)
{
	struct ps_dataset d;
	char dir[512], img[512], lbl[512], err[1024];
	size_t len;
	uint8_t *b;

	snprintf(dir, sizeof(dir), "%s/names", g_dir);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	b = images_file(0x803, 5, 3, 4, 60, &len);
	put_file("names/train-images-idx3-ubyte", b, len, 0, img);
	free(b);
	b = labels_file(0x801, 5, 5, 10, &len);
	put_file("names/train-labels-idx1-ubyte", b, len, 1, lbl);
	free(b);
	ck_assert_msg(ps_dataset_load_dir(&d, dir, "train", 10, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(d.n, 5);
	ps_dataset_free(&d);
	/* A broken .gz next to a good plain file: the .gz is the one read. */
	put_raw("names/train-images-idx3-ubyte.gz", "\x1f\x8b", 2, img);
	ck_assert_int_lt(ps_dataset_load_dir(&d, dir, "train", 10, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "names/train-images-idx3-ubyte.gz: truncated header"), "%s", err);
	ck_assert_ptr_null(d.images);
	/* Missing split, missing directory, not a directory. */
	ck_assert_int_eq(ps_dataset_load_dir(&d, dir, "t10k", 10, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "names/t10k-images-idx3-ubyte[.gz]: No such file or directory "
			     "(install Debian's dataset-fashion-mnist package)"), "%s", err);
	ck_assert_int_eq(unlink(lbl), 0);
	unlink(img);
	ck_assert_int_eq(ps_dataset_load_dir(&d, dir, "train", 10, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "names/train-labels-idx1-ubyte[.gz]: No such file"), "%s", err);
	snprintf(dir, sizeof(dir), "%s/absent", g_dir);
	ck_assert_int_eq(ps_dataset_load_dir(&d, dir, "train", 10, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, "/absent: No such file or directory (install Debian's "
			     "dataset-fashion-mnist package)"), "%s", err);
	put_raw("a-file", "x", 1, img);
	ck_assert_int_eq(ps_dataset_load_dir(&d, img, "train", 10, err, sizeof(err)), -ENOTDIR);
	ck_assert_msg(strstr(err, "a-file: Not a directory"), "%s", err);
	ck_assert_int_lt(ps_dataset_load_dir(&d, g_dir, "../x", 10, err, sizeof(err)), 0);
	ck_assert_ptr_null(d.images);
}
END_TEST

/* ---- hostile files, each plain (_i = 0) and gzip (_i = 1) -------------- */

START_TEST(test_wrong_magic)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("magic", gz, img, lbl);
	b = images_file(0x801, 5, 3, 4, 60, &len);
	put_file("magic-labelmagic", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "not an IDX image file: magic 0x00000801, expected 0x00000803 "
		       "(this is a label file)");
	expect_fail_in(img, img, img, 10, -EBADMSG,
		       "not an IDX label file: magic 0x00000803, expected 0x00000801 "
		       "(this is an image file)");
	b = images_file(0xdeadbeef, 5, 3, 4, 60, &len);
	put_file("magic-junk", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "not an IDX image file: magic 0xdeadbeef, expected 0x00000803");
}
END_TEST

START_TEST(test_truncated_header)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("trhdr", gz, img, lbl);
	b = images_file(0x803, 5, 3, 4, 60, &len);
	put_file("trhdr-img10", b, 10, gz, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated header: 10 bytes, an IDX image file header has 16");
	put_file("trhdr-img1", b, 1, gz, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated header: 1 bytes, an IDX image file header has 16");
	free(b);
	b = labels_file(0x801, 5, 5, 10, &len);
	put_file("trhdr-lbl5", b, 5, gz, bad);
	free(b);
	expect_fail_in(bad, img, bad, 10, -EBADMSG,
		       "truncated header: 5 bytes, an IDX label file header has 8");
}
END_TEST

START_TEST(test_truncated_data)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("trdata", gz, img, lbl);
	b = images_file(0x803, 5, 3, 4, 59, &len);
	put_file("trdata-img", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: header promises 5 images of 3x4 (60 bytes), file has only 59");
	b = images_file(0x803, 5, 3, 4, 0, &len);
	put_file("trdata-img0", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: header promises 5 images of 3x4 (60 bytes), file has only 0");
	b = labels_file(0x801, 5, 3, 10, &len);
	put_file("trdata-lbl", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, img, bad, 10, -EBADMSG,
		       "truncated: header promises 5 labels (5 bytes), file has only 3");
}
END_TEST

START_TEST(test_trailing_bytes)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("trail", gz, img, lbl);
	b = images_file(0x803, 5, 3, 4, 61, &len);
	put_file("trail-img", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "trailing data: header promises 5 images of 3x4 (60 bytes), file has");
	b = labels_file(0x801, 5, 6, 10, &len);
	put_file("trail-lbl", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, img, bad, 10, -EBADMSG,
		       "trailing data: header promises 5 labels (5 bytes), file has");
}
END_TEST

/* Headers out of bounds are refused at once; headers in bounds that promise
 * far more than the file holds are refused without allocating the promise
 * (under AddressSanitizer a 167 TB malloc would abort the test). */
START_TEST(test_huge_dims)
{
	static const struct { uint32_t n, r, c; const char *want; } cases[] = {
		{ 5, 5000, 28, "implausible header: images of 5000x28 (sides allowed 1..4096)" },
		{ 5, 28, 4097, "implausible header: images of 28x4097" },
		{ 5, 0, 28, "implausible header: images of 0x28" },
		{ 10000001, 28, 28, "implausible header: 10000001 images (allowed 1..10000000)" },
		{ 0xffffffffu, 0xffffffffu, 0xffffffffu, "implausible header: 4294967295 images" },
		{ 0, 28, 28, "implausible header: 0 images" },
	};
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("huge", gz, img, lbl);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		b = images_file(0x803, cases[i].n, cases[i].r, cases[i].c, 60, &len);
		put_file("huge-img", b, len, gz, bad);
		free(b);
		expect_fail_in(bad, bad, lbl, 10, PS_ETOOBIG, cases[i].want);
	}
	b = labels_file(0x801, 20000000, 5, 10, &len);
	put_file("huge-lbl", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, img, bad, 10, PS_ETOOBIG, "implausible header: 20000000 labels");

	b = images_file(0x803, 10000000, 4096, 4096, 0, &len);
	put_file("huge-max", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: header promises 10000000 images of 4096x4096 "
		       "(167772160000000 bytes), file has only 0");
	/* 3 MiB of real data: the gzip buffer grows past its first size. */
	b = images_file(0x803, 10000000, 28, 28, 3 << 20, &len);
	put_file("huge-some", b, len, gz, bad);
	free(b);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: header promises 10000000 images of 28x28 "
		       "(7840000000 bytes), file has only 3145728");
}
END_TEST

START_TEST(test_count_mismatch)
{
	int gz = _i;
	char img[512], lbl[512], bad[512], want[1200];
	size_t len;
	uint8_t *b;

	put_valid("count", gz, img, lbl);
	b = labels_file(0x801, 4, 4, 10, &len);
	put_file("count-lbl4", b, len, gz, bad);
	free(b);
	snprintf(want, sizeof(want), "%s has 5 images but %s has 4 labels", img, bad);
	expect_fail(img, bad, 10, PS_ESHAPE, want);
}
END_TEST

START_TEST(test_label_out_of_range)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *b;

	put_valid("range", gz, img, lbl);
	b = labels_file(0x801, 5, 5, 10, &len);
	b[8 + 3] = 10;
	put_file("range-lbl", b, len, gz, bad);
	expect_fail_in(bad, img, bad, 10, -EBADMSG,
		       "label 10 at index 3 is out of range (10 classes: 0..9)");
	b[8 + 3] = 255;
	put_file("range-lbl", b, len, gz, bad);
	expect_fail_in(bad, img, bad, 10, -EBADMSG, "label 255 at index 3 is out of range");
	free(b);
	/* The same labels are fine with more classes; 4 is too few. */
	expect_fail_in(lbl, img, lbl, 4, -EBADMSG, "label 4 at index 4 is out of range (4 classes: 0..3)");
	expect_fail_in(lbl, img, lbl, 0, -EINVAL, "0 classes asked for");
	expect_fail_in(lbl, img, lbl, 257, -EINVAL, "257 classes asked for");
}
END_TEST

START_TEST(test_empty_file)
{
	int gz = _i;
	char img[512], lbl[512], bad[512];

	put_valid("empty", gz, img, lbl);
	put_file("empty-file", "", 0, gz, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "empty file (expected an IDX image file)");
	expect_fail_in(bad, img, bad, 10, -EBADMSG, "empty file (expected an IDX label file)");
}
END_TEST

START_TEST(test_directory_and_missing)
{
	char img[512], lbl[512], dir[512], missing[512];

	put_valid("dir", 0, img, lbl);
	snprintf(dir, sizeof(dir), "%s/a-directory", g_dir);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	expect_fail_in(dir, dir, lbl, 10, -EISDIR, "Is a directory, expected an IDX image file");
	expect_fail_in(dir, img, dir, 10, -EISDIR, "Is a directory, expected an IDX label file");
	snprintf(missing, sizeof(missing), "%s/no-such-file", g_dir);
	expect_fail_in(missing, missing, lbl, 10, -ENOENT, "No such file or directory");
	expect_fail_in(missing, img, missing, 10, -ENOENT, "No such file or directory");
	expect_fail(NULL, lbl, 10, -EINVAL, "no image or label file");
}
END_TEST

/* ---- broken gzip streams ----------------------------------------------- */

START_TEST(test_corrupt_gzip)
{
	char img[512], lbl[512], bad[512];
	size_t len;
	uint8_t *z;

	put_valid("gzbad", 1, img, lbl);
	z = slurp(img, &len);
	ck_assert(len > 20 && z[0] == 0x1f && z[1] == 0x8b);

	z[len - 8] ^= 1;                  /* CRC-32 in the trailer */
	put_raw("gzbad-crc.gz", z, len, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "corrupt gzip data: incorrect data check");
	z[len - 8] ^= 1;

	z[len - 1] ^= 1;                  /* length in the trailer */
	put_raw("gzbad-len.gz", z, len, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "corrupt gzip data: incorrect length check");
	z[len - 1] ^= 1;

	uint8_t save = z[10];
	z[10] = 0xff;                     /* first deflate block: type 3 */
	put_raw("gzbad-block.gz", z, len, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "corrupt gzip data: invalid block type");
	z[10] = save;

	z[2] = 9;                         /* compression method */
	put_raw("gzbad-method.gz", z, len, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "corrupt gzip data: unknown compression method");
	z[2] = 8;

	put_raw("gzbad-cut.gz", z, len - 12, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: header promises 5 images of 3x4 (60 bytes), file has only ");
	expect_fail(bad, lbl, 10, -EBADMSG, "(gzip stream cut off: unexpected end of file)");

	put_raw("gzbad-notrailer.gz", z, len - 4, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG,
		       "truncated: gzip stream cut off after the data");

	put_raw("gzbad-hdr.gz", z, 6, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "truncated header: 0 bytes");

	/* A second gzip member carries data past the header's promise. */
	uint8_t *two = malloc(2 * len);
	ck_assert_ptr_nonnull(two);
	memcpy(two, z, len);
	memcpy(two + len, z, len);
	put_raw("gzbad-two.gz", two, 2 * len, bad);
	expect_fail_in(bad, bad, lbl, 10, -EBADMSG, "trailing data");
	free(two);
	free(z);
}
END_TEST

/* ---- normalization and the batcher ------------------------------------- */

START_TEST(test_fill_normalization)
{
	uint8_t pixels[256], labels[2] = { 3, 7 };
	struct ps_dataset d = { .n = 1, .rows = 16, .cols = 16, .classes = 10, .images = pixels,
				.labels = labels };
	float x[256];
	int32_t y[1];

	for (int p = 0; p < 256; p++)
		pixels[p] = (uint8_t)p;
	ps_dataset_fill(&d, 0, 1, x, y);
	for (int p = 0; p < 256; p++)
		ck_assert(x[p] == ((float)p / 255.0f - 0.2860f) / 0.3530f);
	ck_assert_float_eq_tol(x[0], -0.810198f, 1e-5f);
	ck_assert_float_eq_tol(x[255], 2.022663f, 1e-5f);
	ck_assert_int_eq(y[0], 3);
}
END_TEST

/* A data set of n 1x3 images whose pixels spell the image's index, so a
 * batch tells which images it holds. */
static void index_set(struct ps_dataset *d, int n)
{
	d->n = n;
	d->rows = 1;
	d->cols = 3;
	d->classes = 10;
	d->images = malloc((size_t)n * 3);
	d->labels = malloc((size_t)n);
	ck_assert(d->images && d->labels);
	for (int i = 0; i < n; i++) {
		d->images[3 * i] = (uint8_t)i;
		d->images[3 * i + 1] = (uint8_t)(i >> 8);
		d->images[3 * i + 2] = (uint8_t)(i >> 16);
		d->labels[i] = (uint8_t)(i % 10);
	}
}

static int pixel_of(float v)
{
	for (int p = 0; p < 256; p++)
		if (v == ((float)p / 255.0f - 0.2860f) / 0.3530f)
			return p;
	ck_abort_msg("%f is no normalized pixel", v);
	return -1;
}

/* Reads one epoch from b into idx (the image indices in order); returns
 * how many, checking labels and the batch size on the way. */
static int read_epoch(struct ps_batcher *b, int *idx, int max)
{
	float x[64 * 3];
	int32_t y[64];
	int got = 0, n;

	while ((n = ps_batcher_next(b, x, y)) > 0) {
		ck_assert_int_eq(n, b->batch);
		for (int k = 0; k < n; k++) {
			int i = pixel_of(x[3 * k]) | pixel_of(x[3 * k + 1]) << 8 |
				pixel_of(x[3 * k + 2]) << 16;
			ck_assert_int_lt(got, max);
			ck_assert_int_eq(y[k], i % 10);
			idx[got++] = i;
		}
	}
	ck_assert_int_eq(ps_batcher_next(b, x, y), 0);   /* stays at the end */
	return got;
}

START_TEST(test_batcher_partition)
{
	static const struct { int n, workers, batch; long limit; } cases[] = {
		{ 1200, 3, 8, 0 },      /* divides evenly: every image once */
		{ 1000, 3, 7, 0 },      /* 333 each, 47 batches, one image dropped */
		{ 1000, 2, 10, 100 },   /* limit: only images 0..99 */
		{ 1000, 4, 16, 5000 },  /* limit above n: all */
		{ 1000, 1, 64, 0 },
	};
	int *seen = calloc(1000000, sizeof(int)), idx[2000];

	ck_assert_ptr_nonnull(seen);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct ps_dataset d;
		long used = cases[c].limit > 0 && cases[c].limit < cases[c].n ? cases[c].limit
									    : cases[c].n;
		int part = (int)(used / cases[c].workers), batches = part / cases[c].batch, total = 0;

		index_set(&d, cases[c].n);
		memset(seen, 0, (size_t)cases[c].n * sizeof(int));
		for (int r = 0; r < cases[c].workers; r++) {
			struct ps_batcher b;
			ck_assert_int_eq(ps_batcher_init(&b, &d, r, cases[c].workers, cases[c].batch,
							 cases[c].limit, 7), 0);
			ck_assert_int_eq(ps_batcher_batches(&b), batches);
			int got = read_epoch(&b, idx, 2000);
			ck_assert_int_eq(got, batches * cases[c].batch);
			for (int k = 0; k < got; k++) {
				/* Inside this worker's own contiguous part. */
				ck_assert_int_ge(idx[k], r * part);
				ck_assert_int_lt(idx[k], (r + 1) * part);
				seen[idx[k]]++;
			}
			total += got;
			ps_batcher_free(&b);
		}
		for (int i = 0; i < cases[c].n; i++)
			ck_assert_int_le(seen[i], 1);
		if (part % cases[c].batch == 0)
			for (int i = 0; i < part * cases[c].workers; i++)
				ck_assert_int_eq(seen[i], 1);
		ck_assert_int_eq(total, cases[c].workers * batches * cases[c].batch);
		ps_dataset_free(&d);
	}
	free(seen);
}
END_TEST

START_TEST(test_batcher_shuffle)
{
	struct ps_dataset d;
	struct ps_batcher a, b, c;
	int e0[400], e0b[400], e1[400], e1b[400], o[400], sorted = 1;

	index_set(&d, 800);
	ck_assert_int_eq(ps_batcher_init(&a, &d, 1, 2, 8, 0, 1234), 0);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 1, 2, 8, 0, 1234), 0);
	ck_assert_int_eq(ps_batcher_init(&c, &d, 1, 2, 8, 0, 1235), 0);
	/* init starts epoch 0: the same as asking for it. */
	ck_assert_int_eq(read_epoch(&a, e0, 400), 400);
	ps_batcher_epoch(&b, 0);
	ck_assert_int_eq(read_epoch(&b, e0b, 400), 400);
	ck_assert_int_eq(memcmp(e0, e0b, sizeof(e0)), 0);
	/* Another epoch: another order, reproducible. */
	ps_batcher_epoch(&a, 1);
	ck_assert_int_eq(read_epoch(&a, e1, 400), 400);
	ck_assert_int_ne(memcmp(e0, e1, sizeof(e0)), 0);
	ps_batcher_epoch(&b, 1);
	ck_assert_int_eq(read_epoch(&b, e1b, 400), 400);
	ck_assert_int_eq(memcmp(e1, e1b, sizeof(e1)), 0);
	/* Another seed: another order. */
	ps_batcher_epoch(&c, 1);
	ck_assert_int_eq(read_epoch(&c, o, 400), 400);
	ck_assert_int_ne(memcmp(e1, o, sizeof(o)), 0);
	/* Each epoch is a permutation of 400..799, and really shuffled. */
	for (int pass = 0; pass < 2; pass++) {
		int count[400] = { 0 }, *e = pass ? e1 : e0;
		for (int k = 0; k < 400; k++)
			count[e[k] - 400]++;
		for (int k = 0; k < 400; k++)
			ck_assert_int_eq(count[k], 1);
	}
	for (int k = 1; k < 400; k++)
		sorted &= e0[k] > e0[k - 1];
	ck_assert(!sorted);
	/* Restarting an epoch midway starts it over. */
	ps_batcher_epoch(&a, 0);
	ck_assert_int_eq(read_epoch(&a, o, 400), 400);
	ck_assert_int_eq(memcmp(e0, o, sizeof(o)), 0);
	ps_batcher_free(&a);
	ps_batcher_free(&b);
	ps_batcher_free(&c);
	ps_dataset_free(&d);
}
END_TEST

START_TEST(test_batcher_edges)
{
	struct ps_dataset d, empty = { 0 };
	struct ps_batcher b;
	float x[64 * 3];
	int32_t y[64];

	index_set(&d, 100);
	ck_assert_int_eq(ps_batcher_init(&b, &d, -1, 2, 8, 0, 1), -EINVAL);
	ck_assert_ptr_null(b.order);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 2, 2, 8, 0, 1), -EINVAL);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 0, 0, 8, 0, 1), -EINVAL);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 0, 2, 0, 0, 1), -EINVAL);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 0, 2, 8, -1, 1), -EINVAL);
	ck_assert_int_eq(ps_batcher_init(&b, NULL, 0, 2, 8, 0, 1), -EINVAL);
	ck_assert_int_eq(ps_batcher_init(&b, &empty, 0, 2, 8, 0, 1), -EINVAL);
	/* An empty batcher is inert. */
	ck_assert_int_eq(ps_batcher_next(&b, x, y), 0);
	ck_assert_int_eq(ps_batcher_batches(&b), 0);
	ps_batcher_free(&b);
	/* Parts smaller than a batch, or empty: no batches, no failure. */
	ck_assert_int_eq(ps_batcher_init(&b, &d, 1, 2, 64, 0, 1), 0);
	ck_assert_int_eq(ps_batcher_batches(&b), 0);
	ck_assert_int_eq(ps_batcher_next(&b, x, y), 0);
	ps_batcher_free(&b);
	ck_assert_int_eq(ps_batcher_init(&b, &d, 2, 3, 1, 2, 1), 0);
	ck_assert_int_eq(ps_batcher_batches(&b), 0);
	ps_batcher_epoch(&b, 5);
	ck_assert_int_eq(ps_batcher_next(&b, x, y), 0);
	ps_batcher_free(&b);
	ps_batcher_free(&b);
	ps_dataset_free(&d);
}
END_TEST

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int main(void)
{
	Suite *s = suite_create("dataset");
	TCase *files = tcase_create("files");
	TCase *batch = tcase_create("batcher");
	struct stat st;
	int failed;

	strcpy(g_dir, "/tmp/ps-dataset-XXXXXX");
	if (!mkdtemp(g_dir)) {
		perror("mkdtemp");
		return 1;
	}
	if (stat(FMNIST, &st) == 0 && S_ISDIR(st.st_mode)) {
		TCase *real = tcase_create("fashion-mnist");
		tcase_set_timeout(real, 60);
		tcase_add_test(real, test_real_train);
		tcase_add_test(real, test_real_test);
		tcase_add_test(real, test_real_normalized);
		tcase_add_test(real, test_real_batcher);
		suite_add_tcase(s, real);
	} else {
		tu_skip_cases(4, "check_dataset fashion-mnist (4 cases): %s missing "
			      "(install Debian's dataset-fashion-mnist package)", FMNIST);
	}
	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(files, 60);
	tcase_add_loop_test(files, test_valid_both_formats, 0, 2);
	tcase_add_test(files, test_load_dir_names);
	tcase_add_loop_test(files, test_wrong_magic, 0, 2);
	tcase_add_loop_test(files, test_truncated_header, 0, 2);
	tcase_add_loop_test(files, test_truncated_data, 0, 2);
	tcase_add_loop_test(files, test_trailing_bytes, 0, 2);
	tcase_add_loop_test(files, test_huge_dims, 0, 2);
	tcase_add_loop_test(files, test_count_mismatch, 0, 2);
	tcase_add_loop_test(files, test_label_out_of_range, 0, 2);
	tcase_add_loop_test(files, test_empty_file, 0, 2);
	tcase_add_test(files, test_directory_and_missing);
	tcase_add_test(files, test_corrupt_gzip);
	suite_add_tcase(s, files);
	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(batch, 60);
	tcase_add_test(batch, test_fill_normalization);
	tcase_add_test(batch, test_batcher_partition);
	tcase_add_test(batch, test_batcher_shuffle);
	tcase_add_test(batch, test_batcher_edges);
	suite_add_tcase(s, batch);
	failed = tu_run_suite(s);
	nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return failed ? 1 : 0;
}
