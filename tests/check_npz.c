/* check_npz.c - the .npz writer of ps-export (worker/npz.c), read back by
 * NumPy and Python's zipfile, the readers users open exports with:
 *  - 70,000 members, more than a zip's 16-bit count holds: the zip64 end
 *    records must name them all, every CRC must hold, and the members read
 *    back with NumPy must hold what was written;
 *  - a failed export leaves nothing behind: no file, no temporary file;
 *  - the reasons of a path too long and of a folder that is not there.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include "npz.h"
#include "test_util.h"

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/ps-npz-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	tu_rmtree(dir);
}

/* How many entries dir holds. */
static int entries(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

#define NMEMBERS 70000

/* n little-endian bytes at p */
static uint64_t le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

START_TEST(test_zip64_member_count)
{
	char path[128], err[256], name[32], cmd[1024];
	struct ps_npz *z;

	snprintf(path, sizeof(path), "%s/many.npz", dir);
	ck_assert_msg(ps__npz_open(&z, path, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < NMEMBERS; i++) {
		float v[2] = { (float)i, -(float)i / 2 };
		int64_t dims[1] = { 2 };

		snprintf(name, sizeof(name), "m%05d.npy", i);
		ck_assert_int_eq(ps__npz_add_npy(z, name, "<f4", dims, 1, v, sizeof(v)), 0);
	}
	ck_assert_msg(ps__npz_close(z, 1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(entries(), 1);
	/* Debian's python3 (python3-numpy, which make test installs), not the
	 * first on PATH: zipfile reads the zip64 end records (the 16-bit
	 * count says 0xffff) and checks every CRC; NumPy reads the members */
	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/python3 -c \"import sys, zipfile, numpy as np\n"
		 "z = zipfile.ZipFile('%s')\n"
		 "n = z.namelist()\n"
		 "assert len(n) == %d, len(n)\n"
		 "assert n[0] == 'm00000.npy' and n[-1] == 'm%05d.npy', (n[0], n[-1])\n"
		 "bad = z.testzip()\n"
		 "assert bad is None, bad\n"
		 "f = np.load('%s')\n"
		 "for i in (0, 1, 65534, 65535, 65536, %d):\n"
		 "    a = f['m%%05d' %% i]\n"
		 "    assert a.dtype == np.float32 and a.tolist() == [i, -i / 2], (i, a)\n"
		 "\"",
		 path, NMEMBERS, NMEMBERS - 1, path, NMEMBERS - 1);
	ck_assert_msg(system(cmd) == 0, "Python's zipfile or NumPy did not read %s as written "
		      "(%d members)", path, NMEMBERS);

	/* the end records, which zipfile reads only in part: the zip64 end
	 * record (56 bytes), its locator (20) and the classic end (22) */
	uint8_t e[98];
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fseek(f, -98, SEEK_END), 0);
	long end64 = ftell(f);
	ck_assert_int_eq(fread(e, 1, sizeof(e), f), sizeof(e));
	fclose(f);
	ck_assert_uint_eq(le(e, 4), 0x06064b50);
	ck_assert_uint_eq(le(e + 4, 8), 44);            /* the record's size after 12 */
	ck_assert_uint_eq(le(e + 24, 8), NMEMBERS);     /* entries on this disk */
	ck_assert_uint_eq(le(e + 32, 8), NMEMBERS);     /* entries in all */
	ck_assert_uint_eq(le(e + 40, 8) + le(e + 48, 8), (uint64_t)end64); /* the directory ends here */
	ck_assert_uint_eq(le(e + 56, 4), 0x07064b50);
	ck_assert_uint_eq(le(e + 64, 8), (uint64_t)end64); /* where the zip64 record is */
	ck_assert_uint_eq(le(e + 72, 4), 1);
	ck_assert_uint_eq(le(e + 76, 4), 0x06054b50);
	ck_assert_uint_eq(le(e + 84, 2), 0xffff);      /* the 16-bit counts: see zip64 */
	ck_assert_uint_eq(le(e + 86, 2), 0xffff);
}
END_TEST

START_TEST(test_failed_export_leaves_nothing)
{
	char path[128], err[256];
	struct ps_npz *z;
	int64_t dims[1] = { 3 };
	float v[3] = { 1, 2, 3 };

	snprintf(path, sizeof(path), "%s/failed.npz", dir);
	ck_assert_msg(ps__npz_open(&z, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps__npz_add_npy(z, "a.npy", "<f4", dims, 1, v, sizeof(v)), 0);
	ck_assert_int_eq(entries(), 1); /* the temporary file */
	ck_assert_int_eq(ps__npz_close(z, 0, err, sizeof(err)), 0);
	ck_assert_msg(entries() == 0, "a failed export left %d file(s) in %s", entries(), dir);

	/* a member begun and never ended: the file is not kept */
	ck_assert_msg(ps__npz_open(&z, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps__npz_begin_npy(z, "b.npy", "<f4", dims, 1), 0);
	ck_assert_int_eq(ps__npz_write(z, v, sizeof(v)), 0);
	ck_assert_int_eq(ps__npz_close(z, 1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "failed.npz.tmp.") && strstr(err, strerror(EINVAL)),
		      "the reason does not name the file: '%s'", err);
	ck_assert_msg(entries() == 0, "an unfinished member left %d file(s) in %s", entries(),
		      dir);
}
END_TEST

/* Writes that fail: a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored, as a
 * full disk would) stops a member that does not fit, and the export's
 * close names the temporary file and the reason, and leaves nothing; a
 * path that is a folder cannot take the finished file (the rename), which
 * is named with both paths, and the folder is left as it was. Each in a
 * child process, whose limits the test's own files do not share. */
START_TEST(test_write_failures_named)
{
	char path[128], err[512], want[300];
	static float v[64 * 1024];   /* 256 KiB */
	int64_t dims[1] = { 64 * 1024 };
	struct ps_npz *z;

	snprintf(path, sizeof(path), "%s/big.npz", dir);
	pid_t pid = tu_fork();
	if (pid == 0) {
		struct rlimit rl = { 100 * 1024, 100 * 1024 };
		signal(SIGXFSZ, SIG_IGN);
		if (setrlimit(RLIMIT_FSIZE, &rl) || ps__npz_open(&z, path, err, sizeof(err)))
			_exit(2);
		int a = ps__npz_add_npy(z, "w.npy", "<f4", dims, 1, v, sizeof(v));
		int c = ps__npz_close(z, 1, err, sizeof(err));
		/* a: the member's write failed (or the close will say so) */
		_exit(c == -EFBIG && (a == 0 || a == -EFBIG) && strstr(err, "big.npz.tmp.") &&
		      strstr(err, strerror(EFBIG)) && !strncmp(err, "cannot write ", 13) ? 0 : 3);
	}
	ck_assert_int_eq(tu_wait_child(pid), 0);
	ck_assert_msg(entries() == 0, "a failed write left %d file(s) in %s", entries(), dir);

	/* the finished file's place is a folder */
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_msg(ps__npz_open(&z, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps__npz_add_npy(z, "w.npy", "<f4", dims, 1, v, 64), 0);
	ck_assert_int_eq(ps__npz_close(z, 1, err, sizeof(err)), -EISDIR);
	snprintf(want, sizeof(want), " to %s: %s", path, strerror(EISDIR));
	ck_assert_msg(!strncmp(err, "cannot rename ", 14) && strstr(err, "big.npz.tmp.") &&
		      strstr(err, want), "'%s'", err);
	ck_assert_msg(entries() == 1, "%d entries in %s, expected the folder alone", entries(),
		      dir);
	ck_assert_int_eq(rmdir(path), 0);
}
END_TEST

START_TEST(test_open_refusals)
{
	char path[5000], err[6000], want[200];
	struct ps_npz *z = NULL;

	snprintf(path, sizeof(path), "%s/no/such/folder/x.npz", dir);
	ck_assert_int_eq(ps__npz_open(&z, path, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "cannot create %s/no/such/folder/x.npz.tmp.", dir);
	ck_assert_msg(strstr(err, want) && strstr(err, ": No such file or directory"),
		      "'%s'", err);
	memset(path, 'a', sizeof(path) - 1);
	path[sizeof(path) - 1] = '\0';
	ck_assert_int_eq(ps__npz_open(&z, path, err, sizeof(err)), -ENAMETOOLONG);
	ck_assert_msg(strlen(err) > 14 && !strcmp(err + strlen(err) - 15, ": path too long"),
		      "'%s'", err);
	ck_assert_ptr_null(z);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("npz");
	TCase *tc = tcase_create("npz");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_zip64_member_count);
	TU_ADD(tc, test_failed_export_leaves_nothing);
	TU_ADD(tc, test_open_refusals);
	TU_ADD(tc, test_write_failures_named);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
