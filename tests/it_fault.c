/* it_fault.c - the failure paths no other test reaches: system calls and
 * allocations made to fail by libpsfault.so (tests/fault_inject.c),
 * LD_PRELOADed into real ps-server processes (and into a worker process of
 * this program's own), over real sockets.
 *
 * Checkpoints (one shard, a dense tensor and an embedding table, SGD lr 1,
 * integer gradients: every weight is its exact sum): each write of the
 * checkpoint file failed in turn (the sweep goes on until the fault no
 * longer lands, so every write of the file was failed once), its fsync and
 * its rename failed, a write cut short and one interrupted (both retried:
 * the checkpoint is written), with the writer in a pool thread, in a
 * forked child, and as an incremental checkpoint; for the forked writer
 * also the read-back of the file's CRC cut short. Each time: the request
 * answers the error naming the file and the call's error, the previous
 * checkpoint is byte for byte the same, no temporary file stays, the shard
 * goes on serving exact sums, and a restart after kill -9 loads the
 * previous checkpoint exactly.
 *
 * The restore: each read of the checkpoint at the start failed in turn;
 * the shard refuses to start naming the file (or, where the read was not
 * the checkpoint's, starts), never starts with other values; a start
 * without the fault then loads it exactly.
 *
 * Replication (one shard, its two processes, a table): a joining backup
 * whose write of the snapshot's tables into a memory file is interrupted
 * (it retries: one state transfer, no error) or fails (it says so, the
 * link closes, the next transfer brings it in sync: equal checksums); the
 * primary out of memory copying a declaration (every allocation from the
 * declaration's log line on failed in turn): no crash, the error said,
 * and the pair serving the declaration.
 *
 * The client: with limits.reconnect_timeout_ms 0, a send the socket cannot
 * take at once (sendmsg EAGAIN) is handed to the I/O thread, not failed.
 *
 * Skipped (exit 77 for the program's own reason) in the sanitizer build,
 * whose runtime must be the first library loaded.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NA 3000   /* floats of tensor a */
#define DIM 4
#define NID 40

static char lib[512];         /* libpsfault.so beside this program */
static char self[512];        /* this program */
static char dir[64], cfg_path[64], flog[160], slog[160];
static struct ps_config cfg;

/* ---- the fault library ---- */

/* Starts shard 0 (replica r, or -1 for an unreplicated shard) with the
 * fault spec (NULL: none) armed after the log line after (NULL: at once);
 * its stderr into slog (a replica: LOGDIR/shard0-rR.log), faults made
 * into flog (emptied). */
static pid_t start_faulted(int r, const char *spec, const char *after)
{
	pid_t pid;

	unlink(flog);
	if (spec) {
		setenv("LD_PRELOAD", lib, 1);
		setenv("PS_FAULT", spec, 1);
		setenv("PS_FAULT_LOG", flog, 1);
		if (after)
			setenv("PS_FAULT_AFTER", after, 1);
	}
	setenv("PS_TEST_LOG", "info", 1); /* the markers are info lines */
	pid = r < 0 ? tu_start_server_log(cfg_path, 0, slog)
		    : tu_start_replica(cfg_path, dir, 0, r, 1);
	unsetenv("LD_PRELOAD");
	unsetenv("PS_FAULT");
	unsetenv("PS_FAULT_LOG");
	unsetenv("PS_FAULT_AFTER");
	unsetenv("PS_TEST_LOG");
	return pid;
}

/* The text of file path (static, up to 1 MiB; "" when absent). */
static const char *slurp(const char *path)
{
	static char buf[1 << 20];
	size_t n = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = 0;
	return buf;
}

/* How many times text occurs in file path. */
static int count_in(const char *path, const char *text)
{
	const char *b = slurp(path);
	int n = 0;

	for (const char *p = b; (p = strstr(p, text)); p += strlen(text))
		n++;
	return n;
}

/* The faults made: the lines of flog that name a call. */
static int faults_made(void)
{
	return count_in(flog, " call ");
}

static struct ps_client *connect_retry(const struct ps_config *c, int rank)
{
	struct ps_client *cl = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 100; i++) {
		rc = ps_client_init(&cl, c, rank, err, sizeof(err));
		if (rc != -ECONNREFUSED && rc != PS_ECLOSED)
			break;
		tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "connect: %s (log %s)", err, slog);
	return cl;
}

/* ---- a model with exact sums ---- */

struct model {
	float a[NA], rows[NID * DIM];
	uint64_t clock;
};

static float dgrad(int i, uint64_t k)
{
	return (float)((int)((i * 7 + (int)k * 3) % 9) - 4);
}

static float rgrad(int id, int j, uint64_t k)
{
	return (float)((int)((id * 5 + j * 3 + (int)k * 7) % 9) - 4);
}

/* One sync clock of worker c (the only one): rows, then the dense push
 * ending the clock; m follows. */
static void train_clock(struct ps_client *c, struct model *m)
{
	static float g[NA], rg[NID * DIM];
	uint64_t ids[NID];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };
	int64_t q;

	for (int i = 0; i < NID; i++) {
		ids[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
		for (int j = 0; j < DIM; j++) {
			rg[i * DIM + j] = rgrad(i, j, m->clock);
			m->rows[i * DIM + j] -= rg[i * DIM + j];
		}
	}
	for (int i = 0; i < NA; i++) {
		g[i] = dgrad(i, m->clock);
		m->a[i] -= g[i];
	}
	ck_assert_msg(ps_client_push_rows(c, "e", m->clock, ids, NID, rg, 0) == 0, "push rows: %s",
		      ps_client_error(c));
	q = ps_client_push(c, m->clock, &t, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "push: %s", ps_client_error(c));
	m->clock++;
}

/* The shard's weights and rows equal m's, exactly. */
static void check_exact(struct ps_client *c, const struct model *m, const char *what)
{
	static float a[NA], rows[NID * DIM];
	uint64_t ids[NID];
	struct ps_tensor t = { .name = "a", .data = a, .count = NA };
	int64_t q = ps_client_pull(c, m->clock, &t, 1);

	ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "%s: pull: %s", what, ps_client_error(c));
	for (int i = 0; i < NA; i++)
		ck_assert_msg(a[i] == m->a[i], "%s: a[%d] is %g, expected %g (log %s)", what, i, a[i],
			      m->a[i], slog);
	for (int i = 0; i < NID; i++)
		ids[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
	ck_assert_msg(ps_client_pull_rows(c, "e", m->clock, ids, NID, rows) == 0, "%s: pull rows: %s",
		      what, ps_client_error(c));
	for (int i = 0; i < NID * DIM; i++)
		ck_assert_msg(rows[i] == m->rows[i], "%s: row %d element %d is %g, expected %g", what,
			      i / DIM, i % DIM, rows[i], m->rows[i]);
}

/* ---- checkpoints ---- */

static void write_cfg(const char *extra)
{
	char yaml[2048], err[512];
	int port = tu_free_port();

	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  workers: 1\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n%s"
		 "limits:\n  request_timeout_ms: 20000\n",
		 tu_transport_yaml(), tu_host(), port, NA, DIM, dir, extra);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
}

static void make_dir(void)
{
	strcpy(dir, "/tmp/ps-test-fault-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(flog, sizeof(flog), "%s/faults.log", dir);
	snprintf(slog, sizeof(slog), "%s/shard.log", dir);
}

/* The bytes of the checkpoint files of dir (names sorted, then contents):
 * a fingerprint to compare. */
static uint64_t dir_fingerprint(int *ntmp)
{
	char cmd[256];
	uint64_t h = 1469598103934665603ull;
	FILE *p;
	int ch;

	snprintf(cmd, sizeof(cmd), "cd %s && ls | grep -v '\\.log$' | sort", dir);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	char name[256];
	*ntmp = 0;
	while (fgets(name, sizeof(name), p)) {
		char path[400];
		FILE *f;
		name[strcspn(name, "\n")] = 0;
		if (strstr(name, ".tmp."))
			(*ntmp)++;
		for (char *s = name; *s; s++)
			h = (h ^ (uint8_t)*s) * 1099511628211ull;
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if ((f = fopen(path, "r"))) {
			while ((ch = fgetc(f)) != EOF)
				h = (h ^ (uint8_t)ch) * 1099511628211ull;
			fclose(f);
		}
	}
	pclose(p);
	return h;
}

enum outcome { FAILS, WRITTEN };

struct ckpt_fault {
	const char *spec;
	enum outcome expect;
	const char *err;       /* in the reply's error when it fails */
};

/* One run: the shard (with spec armed after its first checkpoint) trains
 * 2 clocks, checkpoints, trains 1, checkpoints again (where the fault
 * lands), trains 1; then kill -9 and a start without faults, which must
 * hold the second checkpoint's state (or the first's where it failed).
 * Returns whether the fault landed. */
static int forked; /* the config's checkpoints are written by a child */

static int ckpt_run(const struct ckpt_fault *f)
{
	static struct model m, at1, at2;
	struct ps_shard_stats st;
	struct ps_client *c;
	uint64_t before, after;
	int ntmp, landed;
	pid_t pid;

	memset(&m, 0, sizeof(m));
	pid = start_faulted(-1, f->spec, "checkpoint (on request): ");
	c = connect_retry(&cfg, 0);
	train_clock(c, &m);
	train_clock(c, &m);
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	ck_assert_msg(st.checkpoint_status == 0, "%s: the first checkpoint: %s", f->spec,
		      st.checkpoint_error);
	at1 = m;
	before = dir_fingerprint(&ntmp);
	train_clock(c, &m);
	ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
	landed = faults_made() > 0;
	after = dir_fingerprint(&ntmp);
	ck_assert_msg(ntmp == 0, "%s: %d temporary file(s) left in %s", f->spec, ntmp, dir);
	if (!landed) {
		ck_assert_msg(st.checkpoint_status == 0, "%s: no fault made, yet: %s", f->spec,
			      st.checkpoint_error);
	} else if (f->expect == FAILS) {
		ck_assert_msg(st.checkpoint_status < 0, "%s: the fault landed (%s) and the checkpoint "
			      "was reported written", f->spec, slurp(flog));
		/* a forked writer's reason is in its log line; the reply says
		 * the writer failed */
		const char *why = forked && !strstr(f->spec, "pread") ? slurp(slog)
								      : st.checkpoint_error;
		ck_assert_msg(strstr(why, dir) && strstr(why, f->err), "%s: the error does not name "
			      "the file and '%s': %s", f->spec, f->err, why);
		if (forked && !strstr(f->spec, "pread"))
			ck_assert_msg(strstr(st.checkpoint_error, "checkpoint writer"), "%s: %s",
				      f->spec, st.checkpoint_error);
		ck_assert_msg(count_in(slog, "checkpoint (on request) failed: ") == 1,
			      "%s: the shard's log does not say it (%s)", f->spec, slog);
		if (!strstr(f->spec, "pread"))
			ck_assert_msg(before == after, "%s: the previous checkpoint changed", f->spec);
	} else {
		ck_assert_msg(st.checkpoint_status == 0, "%s: the fault is retried, yet: %s", f->spec,
			      st.checkpoint_error);
	}
	at2 = st.checkpoint_status == 0 || strstr(f->spec, "pread") ? m : at1;
	/* serving on, exact */
	train_clock(c, &m);
	check_exact(c, &m, f->spec);
	ps_client_free(c);
	kill(pid, SIGKILL);
	ck_assert_int_eq(tu_wait_child(pid), 128 + SIGKILL);

	/* a restart: the last checkpoint written, exactly */
	pid = start_faulted(-1, NULL, NULL);
	c = connect_retry(&cfg, 0);
	ck_assert_uint_eq(ps_client_clock(c), at2.clock);
	check_exact(c, &at2, "after the restart");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	tu_rmtree(dir);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	return landed;
}

/* _i: 0 the writer in a pool thread, 1 a forked writer, 2 incremental */
START_TEST(test_ckpt_faults)
{
	static const char *extra[] = { "", "  fork_bytes: 1\n", "  incremental: 3\n" };
	static const struct ckpt_fault once[] = {
		{ "fsync:1:EIO:file", FAILS, "Input/output error" },
		{ "rename:1:ENOSPC", FAILS, "No space left on device" },
		{ "write:1:short:file", WRITTEN, NULL },
		{ "write:2:EINTR:file", WRITTEN, NULL },
		{ "pread:1:short:file", FAILS, "cannot read back" },
	};
	char spec[64];
	int n;

	make_dir();
	write_cfg(extra[_i]);
	forked = _i == 1;
	/* every write of the file failed in turn, until none is left */
	for (n = 1; n <= 10; n++) {
		struct ckpt_fault f = { spec, FAILS, "Input/output error" };
		snprintf(spec, sizeof(spec), "write:%d:EIO:file", n);
		if (!ckpt_run(&f))
			break;
	}
	printf("test_ckpt_faults:%d: %d writes failed in turn\n", _i, n - 1);
	ck_assert_msg(n > 2 && n <= 10, "the checkpoint's writes: %d failed in turn (expected "
		      "the half, the rest and the CRC at least)", n - 1);
	for (size_t i = 0; i < sizeof(once) / sizeof(once[0]); i++) {
		if (strstr(once[i].spec, "pread") && _i != 1)
			continue; /* the read-back is the forked writer's */
		ck_assert_msg(ckpt_run(&once[i]), "%s: the fault never landed (%s)", once[i].spec,
			      slog);
	}
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* Whether a connection to port on the loopback is taken now. */
static int port_open(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Each read of the checkpoint at the start failed in turn (pread: EIO,
 * then cut short). */
START_TEST(test_restore_faults)
{
	static struct model m;
	struct ps_shard_stats st;
	struct ps_client *c;
	char spec[64];
	int n, refused = 0, refused_delta = 0;
	pid_t pid;

	make_dir();
	write_cfg(_i ? "  incremental: 3\n" : "");
	memset(&m, 0, sizeof(m));
	pid = start_faulted(-1, NULL, NULL);
	c = connect_retry(&cfg, 0);
	for (int k = 0; k < 2; k++) {
		train_clock(c, &m);
		ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
	}
	ps_client_free(c);
	kill(pid, SIGKILL);
	tu_wait_child(pid);
	if (_i) {
		char cmd[160];
		snprintf(cmd, sizeof(cmd), "ls %s | grep -q 'delta-1$'", dir);
		ck_assert_msg(system(cmd) == 0, "no incremental checkpoint in %s", dir);
	}

	for (n = 1; n <= 80; n++) {
		int landed = 0;
		for (int how = 0; how < 2; how++) {
			snprintf(spec, sizeof(spec), "pread:%d:%s:file", n, how ? "short" : "EIO");
			pid = start_faulted(-1, spec, NULL);
			/* it refuses to start, or starts: whichever, within the deadline */
			double t0 = ps_now_s();
			int rc = -1, ws = 0, up = 0;
			while (ps_now_s() - t0 < 10 * tu_time_scale()) {
				if (waitpid(pid, &ws, WNOHANG) == pid) {
					rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
					break;
				}
				if ((up = port_open(cfg.shards[0].port)))
					break;
				tu_sleep_ms(20);
			}
			ck_assert_msg(rc >= 0 || up, "%s: the shard neither started nor ended (log %s)",
				      spec, slog);
			landed |= faults_made() > 0;
			if (rc >= 0) {
				ck_assert_msg(rc == 1, "%s: the shard ended with %d (log %s)", spec, rc,
					      slog);
				ck_assert_msg(strstr(slurp(slog), dir) && how == 0, "%s: the refusal "
					      "does not name the checkpoint: %s", spec, slurp(slog));
				refused++;
				refused_delta += strstr(slurp(slog), ".delta-1") != NULL;
				continue;
			}
			/* started: then with the checkpoint's state, exactly */
			c = connect_retry(&cfg, 0);
			ck_assert_uint_eq(ps_client_clock(c), m.clock);
			check_exact(c, &m, spec);
			ps_client_free(c);
			/* not SIGTERM: its checkpoint would replace the chain */
			kill(pid, SIGKILL);
			tu_wait_child(pid);
		}
		if (!landed)
			break; /* past the last read */
	}
	printf("test_restore_faults:%d: %d reads failed in turn, %d refusals (%d naming the "
	       "incremental file)\n", _i, n - 1, refused, refused_delta);
	ck_assert_msg(!_i || refused_delta > 0, "no read of the incremental file was failed");
	ck_assert_msg(n <= 80, "more than 79 reads");
	ck_assert_msg(refused > 0, "no read failed at the start made the shard refuse (%d reads)",
		      n - 1);
	/* a start without the fault: the checkpoint, exactly */
	pid = start_faulted(-1, NULL, NULL);
	c = connect_retry(&cfg, 0);
	check_exact(c, &m, "without a fault");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

int main(int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	(void)argc;
	(void)argv;
	if (SANITIZED) {
		printf("it_fault: skipped: the sanitizer's runtime must be the first library "
		       "loaded, before libpsfault.so\n");
		return 77;
	}
	if (n <= 0)
		return 1;
	self[n] = 0;
	snprintf(lib, sizeof(lib), "%s/libpsfault.so", dirname(strdup(self)));
	if (access(lib, R_OK)) {
		fprintf(stderr, "it_fault: %s is missing (make %s)\n", lib, lib);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);

	Suite *s = suite_create("fault");
	TCase *tc = tcase_create("fault");
	tcase_set_timeout(tc, 300);
	TU_ADD_LOOP(tc, test_ckpt_faults, 0, 3);
	TU_ADD_LOOP(tc, test_restore_faults, 0, 2); /* _i 1: a chain of incremental ones */
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
