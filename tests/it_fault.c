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

/* ---- the listener ---- */

/* The shard out of memory for a new connection (its first allocation
 * after "listening"): that connection is closed, and the next ones are
 * accepted (libuv watches the listener again only once the connection it
 * offered is accepted: before the fix, no connection was ever accepted
 * again). */
START_TEST(test_accept_oom)
{
	static struct model m;
	struct ps_client *c;
	double t0;
	pid_t pid;

	make_dir();
	write_cfg("");
	memset(&m, 0, sizeof(m));
	pid = start_faulted(-1, "alloc:1", "listening");
	/* tu_wait_listen's connection is the first: closed */
	ck_assert(tu_wait_listen(cfg.shards[0].port));
	t0 = ps_now_s();
	while (!count_in(slog, "out of memory accepting a connection") &&
	       ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(20);
	ck_assert_msg(faults_made() == 1, "the fault did not land: %s", slurp(flog));
	ck_assert_msg(count_in(slog, "out of memory accepting a connection") == 1,
		      "the shard does not say it: %s", slurp(slog));
	/* the next one is served */
	c = connect_retry(&cfg, 0);
	train_clock(c, &m);
	check_exact(c, &m, "after the refused connection");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* ---- the row path ---- */

#define NPULL 30 /* ids of the pulls below: replies of NPULL * DIM floats */

/* The shard out of memory for a row pull's reply (every allocation of the
 * reply's size failed in turn, after the worker connected): the pull is
 * refused with "out of memory", never a crash; the same pull again gets
 * the exact rows, and the shard goes on training exactly. */
START_TEST(test_rows_oom)
{
	static struct model m;
	char spec[64];
	int n, refused = 0;

	make_dir();
	write_cfg("");
	for (n = 1; n <= 8; n++) {
		static float rows[NPULL * DIM];
		uint64_t ids[NPULL];
		struct ps_client *c;
		pid_t pid;
		int rc, tries = 0;

		memset(&m, 0, sizeof(m));
		snprintf(spec, sizeof(spec), "malloc:%d:ENOMEM:=%zu", n, sizeof(rows));
		pid = start_faulted(-1, spec, "worker 0 connected");
		c = connect_retry(&cfg, 0);
		train_clock(c, &m);
		train_clock(c, &m);
		for (int i = 0; i < NPULL; i++)
			ids[i] = (uint64_t)(i + 5) * 0x9e3779b97f4a7c15ull;
		do {
			rc = ps_client_pull_rows(c, "e", m.clock, ids, NPULL, rows);
			if (rc) {
				ck_assert_msg(strstr(ps_client_error(c), "out of memory"), "%s: the pull "
					      "failed: %s", spec, ps_client_error(c));
				refused++;
			}
		} while (rc && ++tries < n + 1);
		ck_assert_msg(rc == 0, "%s: %d pulls refused in a row", spec, tries);
		for (int i = 0; i < NPULL * DIM; i++)
			ck_assert_msg(rows[i] == m.rows[5 * DIM + i], "%s: row %d element %d is %g, "
				      "expected %g", spec, i / DIM + 5, i % DIM, rows[i],
				      m.rows[5 * DIM + i]);
		train_clock(c, &m);
		check_exact(c, &m, spec);
		ps_client_free(c);
		int landed = faults_made() > 0;
		ck_assert_int_eq(tu_stop_server(pid), 0);
		tu_rmtree(dir);
		ck_assert_int_eq(mkdir(dir, 0700), 0);
		if (!landed)
			break;
	}
	printf("test_rows_oom: %d allocations of a reply's size failed in turn, %d pulls "
	       "refused\n", n - 1, refused);
	ck_assert_msg(refused > 0, "no pull was refused for want of memory");
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* ---- replication ---- */

static void write_pair_cfg(const char *model, int request_ms)
{
	char yaml[2048];
	int p0 = tu_low_free_port(0), p1 = tu_low_free_port(p0);

	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n"
		 "  replicas: 1\n  workers: 1\n"
		 "replication:\n  timeout_ms: 1000\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n%s"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: %d\n",
		 tu_transport_yaml(), tu_host(), p0, tu_host(), p1, model, request_ms);
	tu_replica_config(yaml, cfg_path, &cfg, dir, "/tmp/ps-test-fault-XXXXXX");
	snprintf(flog, sizeof(flog), "%s/faults.log", dir);
}

static const char *rlog(int r)
{
	static char path[2][160];

	snprintf(path[r], sizeof(path[r]), "%s/shard0-r%d.log", dir, r);
	return path[r];
}

/* Both processes hold the same weights and tables (checksums), at the
 * same clock and batch (waited for). */
static void assert_in_sync(uint64_t clock, const char *what)
{
	struct ps_shard_stats st[2];
	double t0 = ps_now_s();
	int ok = 0;

	while (!ok && ps_now_s() - t0 < 10 * tu_time_scale()) {
		ok = 1;
		for (int r = 0; r < 2; r++)
			ok = ok && tu_replica_stats(&cfg, 0, r, -1, &st[r]) == 0 &&
			     st[r].worker_clock[0] == clock && st[r].repl_lsn == st[0].repl_lsn;
		if (!ok)
			tu_sleep_ms(20);
	}
	ck_assert_msg(ok, "%s: the two processes do not both stand at clock %llu (logs in %s)",
		      what, (unsigned long long)clock, dir);
	ck_assert_msg(st[0].param_checksum == st[1].param_checksum, "%s: dense checksums %llx and "
		      "%llx", what, (unsigned long long)st[0].param_checksum,
		      (unsigned long long)st[1].param_checksum);
	ck_assert_int_eq(st[0].ntables, 1);
	ck_assert_int_eq(st[1].ntables, 1);
	ck_assert_uint_eq(st[0].tables[0].rows, NID);
	ck_assert_msg(st[0].tables[0].checksum == st[1].tables[0].checksum, "%s: table checksums "
		      "%llx and %llx", what, (unsigned long long)st[0].tables[0].checksum,
		      (unsigned long long)st[1].tables[0].checksum);
}

/* A backup joining a primary with rows; its write of the snapshot's
 * tables to a memory file: _i 0 interrupted, 1 cut short (both retried: one
 * transfer, no error), 2 failed, 3 no memory file (both said, the link
 * closed, the next transfer in sync). Then the primary killed: the backup
 * serves exact sums. */
START_TEST(test_snapshot_faults)
{
	static const char *spec[] = { "write:1:EINTR:file", "write:1:short:file",
				      "write:1:EIO:file", "memfd_create:1:EMFILE" };
	static struct model m;
	struct ps_client *c;
	pid_t p[2];
	int pr, b;

	write_pair_cfg("model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
		       "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n",
		       60000);
	memset(&m, 0, sizeof(m));
	p[0] = start_faulted(0, NULL, NULL);
	p[1] = start_faulted(1, NULL, NULL);
	pr = tu_wait_pair(&cfg, 0, 30);
	ck_assert_msg(pr >= 0, "the pair never formed (logs in %s)", dir);
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	for (int k = 0; k < 2; k++)
		train_clock(c, &m);
	/* the backup leaves; rows change without it; it comes back faulted */
	kill(p[b], SIGKILL);
	tu_wait_child(p[b]);
	train_clock(c, &m);
	unlink(rlog(b));
	p[b] = start_faulted(b, spec[_i], NULL);
	ck_assert_msg(tu_wait_pair(&cfg, 0, 30) == pr, "%s: the backup never got in sync (logs in "
		      "%s)", spec[_i], dir);
	ck_assert_msg(faults_made() == 1, "%s: the fault did not land (%s)", spec[_i],
		      slurp(flog));
	assert_in_sync(m.clock, spec[_i]);
	ck_assert_int_eq(count_in(rlog(b), "state received"), 1);
	if (_i < 2) {
		ck_assert_msg(!count_in(rlog(b), "the snapshot's embedding tables"), "%s: retried, "
			      "yet: %s", spec[_i], slurp(rlog(b)));
	} else {
		ck_assert_msg(count_in(rlog(b), _i == 2 ? "the snapshot's embedding tables: cannot "
					"write them to a memory file (0 of " :
					"the snapshot's embedding tables: cannot make a memory file: "
					"Too many open files"), "%s: the backup does not say why its "
			      "first transfer failed: %s", spec[_i], slurp(rlog(b)));
	}
	train_clock(c, &m);
	check_exact(c, &m, spec[_i]);
	assert_in_sync(m.clock, spec[_i]);
	/* the backup takes over: the same sums */
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	train_clock(c, &m);
	check_exact(c, &m, "a clock after the takeover");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The backup out of memory creating rows a batch brings (the first
 * chunk of the table's rows, 1 MiB, not allocated once it holds the
 * state): it says so, the state is transferred again, and the two
 * processes end with equal checksums; exact after the primary's kill. */
START_TEST(test_backup_rows_oom)
{
	static struct model m;
	struct ps_client *c;
	const char *spec = "malloc:1:ENOMEM:=1048576"; /* PS_TABLE_CHUNK rows of 4 floats */
	pid_t p[2];
	int pr, b;

	write_pair_cfg("model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
		       "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n",
		       60000);
	memset(&m, 0, sizeof(m));
	/* both faulted, armed by the line only a backup writes */
	p[0] = start_faulted(0, spec, "state received");
	p[1] = start_faulted(1, spec, "state received");
	pr = tu_wait_pair(&cfg, 0, 30);
	ck_assert_msg(pr >= 0, "the pair never formed (logs in %s)", dir);
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	for (int k = 0; k < 3; k++)
		train_clock(c, &m);
	ck_assert_msg(faults_made() == 1, "the fault did not land (%s)", slurp(flog));
	ck_assert_msg(count_in(rlog(b), "out of memory creating row"), "the backup does not say it "
		      "could not create a row: %s", slurp(rlog(b)));
	assert_in_sync(m.clock, spec);
	check_exact(c, &m, spec);
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* A backup joining a primary with rows, out of memory at its Nth
 * allocation after its partner answered (N over 1..89, spread, until
 * the join makes fewer allocations): it never
 * crashes; it gets in sync, or ends saying why (then started again
 * without the fault, it does); equal checksums, exact sums. */
START_TEST(test_backup_join_oom)
{
	static const int nth[] = { 1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 21, 27, 34, 44, 55, 70, 89 };
	static struct model m;
	struct ps_client *c;
	char spec[64];
	pid_t p[2];
	int pr, b, ended = 0, landed = 0;

	write_pair_cfg("model:\n  tensors:\n    - {name: a, shape: [3000], init: zeros}\n"
		       "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n",
		       60000);
	memset(&m, 0, sizeof(m));
	p[0] = start_faulted(0, NULL, NULL);
	p[1] = start_faulted(1, NULL, NULL);
	pr = tu_wait_pair(&cfg, 0, 30);
	ck_assert_msg(pr >= 0, "the pair never formed (logs in %s)", dir);
	b = 1 - pr;
	c = connect_retry(&cfg, 0);
	train_clock(c, &m);
	for (size_t i = 0; i < sizeof(nth) / sizeof(nth[0]); i++) {
		int ws = 0;
		kill(p[b], SIGKILL);
		tu_wait_child(p[b]);
		train_clock(c, &m);
		unlink(rlog(b));
		snprintf(spec, sizeof(spec), "alloc:%d", nth[i]);
		/* armed once the backup's dial is answered: OpenSSL's first
		 * EVP_MAC_fetch (at the process's first connection) crashes
		 * inside libcrypto when one of its allocations fails */
		p[b] = start_faulted(b, spec, "replication: joining primary");
		if (tu_wait_pair(&cfg, 0, 20) != pr) {
			ck_assert_msg(waitpid(p[b], &ws, WNOHANG) == p[b], "%s: the backup neither "
				      "joined nor ended (log %s)", spec, rlog(b));
			ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "%s: the backup ended "
				      "with %s %d (log %s)", spec, WIFSIGNALED(ws) ? "signal" : "exit",
				      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws), rlog(b));
			ended++;
			p[b] = start_faulted(b, NULL, NULL);
			ck_assert_msg(tu_wait_pair(&cfg, 0, 20) == pr, "%s: restarted, the backup "
				      "never joined (log %s)", spec, rlog(b));
		}
		ck_assert_msg(waitpid(p[pr], &ws, WNOHANG) == 0, "%s: the primary ended", spec);
		assert_in_sync(m.clock, spec);
		if (!faults_made())
			break; /* past the join's last allocation */
		landed++;
	}
	ck_assert_msg(landed >= 10, "only %d of the joins' faults landed", landed);
	check_exact(c, &m, "after the joins");
	kill(p[pr], SIGKILL);
	tu_wait_child(p[pr]);
	check_exact(c, &m, "after the takeover");
	printf("test_backup_join_oom: %d joins with a failed allocation, %d of them ended by it\n",
	       landed, ended);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(p[b]), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* The primary out of memory gathering a declaration for its backup:
 * every allocation from the declaration's log line on failed in turn. No
 * process crashes, the primary says it and steps down, and the worker's
 * declaration is served (by whichever process is the primary after),
 * with rank 0's values. */
START_TEST(test_declare_oom)
{
	static float w[NA];
	const int64_t shape[] = { NA };
	struct ps_param prm = { "w", 1, shape, w };
	char spec[64];
	int n, said = 0;

	/* a takeover takes 2 s: a request unanswered in 15 s is lost */
	write_pair_cfg("", 15000);
	for (n = 1; n <= 12; n++) {
		struct ps_client *c;
		struct ps_tensor t = { .name = "w", .data = w, .count = NA };
		static float back[NA];
		pid_t p[2];
		int64_t q;
		int rc;

		snprintf(spec, sizeof(spec), "malloc:%d", n);
		/* both faulted: the primary is whichever the election makes */
		p[0] = start_faulted(0, spec, "rank 0 declared");
		p[1] = start_faulted(1, spec, "rank 0 declared");
		ck_assert_msg(tu_wait_pair(&cfg, 0, 30) >= 0, "the pair never formed (%s)", dir);
		for (int i = 0; i < NA; i++)
			w[i] = (float)(i % 11 - 5);
		c = connect_retry(&cfg, 0);
		rc = ps_client_declare(c, &prm, 1);
		ck_assert_msg(rc == 0, "%s: the declaration: %s (logs in %s)", spec,
			      ps_client_error(c), dir);
		t.data = back;
		q = ps_client_pull(c, 0, &t, 1);
		ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "%s: pull: %s", spec,
			      ps_client_error(c));
		ck_assert_msg(memcmp(back, w, sizeof(w)) == 0, "%s: the declared values differ", spec);
		ps_client_free(c);
		for (int r = 0; r < 2; r++) {
			int ws = 0;
			ck_assert_msg(waitpid(p[r], &ws, WNOHANG) == 0, "%s: process %d ended (%s %d; "
				      "log %s)", spec, r, WIFSIGNALED(ws) ? "signal" : "exit",
				      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws), rlog(r));
		}
		said += count_in(rlog(0), "out of memory gathering a declaration") +
			count_in(rlog(1), "out of memory gathering a declaration") > 0;
		int landed = faults_made() > 0;
		for (int r = 0; r < 2; r++)
			ck_assert_int_eq(tu_stop_server(p[r]), 0);
		unlink(rlog(0));
		unlink(rlog(1));
		if (!landed)
			break;
	}
	printf("test_declare_oom: %d allocations failed in turn, %d of them while gathering the "
	       "declaration\n", n - 1, said);
	ck_assert_msg(said > 0, "no failed allocation was the declaration's copy");
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

/* ---- the client ---- */

/* The worker of test_send_eagain, in a process of its own started with
 * libpsfault.so: 3 clocks of dense pushes and pulls, exact; 0 or 1. */
static int eagain_worker(const char *path)
{
	static float g[NA], a[NA], want[NA];
	struct ps_config *wc = calloc(1, sizeof(*wc));
	struct ps_client *c = NULL;
	char err[512];

	if (!wc || ps_config_load(wc, path, err, sizeof(err)) ||
	    ps_client_init(&c, wc, 0, err, sizeof(err))) {
		fprintf(stderr, "worker: %s\n", err);
		return 1;
	}
	for (uint64_t k = 0; k < 3; k++) {
		struct ps_tensor tg = { .name = "a", .data = g, .count = NA };
		struct ps_tensor ta = { .name = "a", .data = a, .count = NA };
		int64_t q;
		for (int i = 0; i < NA; i++) {
			g[i] = dgrad(i, k);
			want[i] -= g[i];
		}
		q = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
		if (q <= 0 || ps_client_wait(c, q)) {
			fprintf(stderr, "worker: push of clock %llu failed: %s\n",
				(unsigned long long)k, ps_client_error(c));
			return 1;
		}
		q = ps_client_pull(c, k + 1, &ta, 1);
		if (q <= 0 || ps_client_wait(c, q) || memcmp(a, want, sizeof(a))) {
			fprintf(stderr, "worker: pull of clock %llu: %s\n", (unsigned long long)k,
				q <= 0 ? ps_client_error(c) : "not the exact sums");
			return 1;
		}
	}
	ps_client_free(c);
	printf("worker: 3 clocks exact\n");
	return 0;
}

/* With limits.reconnect_timeout_ms 0 (a request fails at once when its
 * shard is lost), a send the socket cannot take at once (sendmsg: EAGAIN)
 * must go to the I/O thread, not fail the request: the worker's Nth
 * sendmsg made to fail so, for each N until none is left. */
START_TEST(test_send_eagain)
{
	char spec[64], out[200];
	int n;
	pid_t pid;

	make_dir();
	write_cfg("");
	{
		/* reconnects off: the config again with that limit */
		char yaml[2048];
		FILE *f = fopen(cfg_path, "r");
		size_t k = fread(yaml, 1, sizeof(yaml) - 1, f);
		fclose(f);
		yaml[k] = 0;
		f = fopen(cfg_path, "w");
		fprintf(f, "%s  reconnect_timeout_ms: 0\n", yaml);
		fclose(f);
	}
	pid = start_faulted(-1, NULL, NULL);
	snprintf(out, sizeof(out), "%s/worker.out", dir);
	for (n = 1; n <= 20; n++) {
		const char *argv[] = { self, "--eagain-worker", cfg_path, NULL };
		pid_t w;
		int rc;

		snprintf(spec, sizeof(spec), "sendmsg:%d:EAGAIN:sock", n);
		unlink(flog);
		setenv("LD_PRELOAD", lib, 1);
		setenv("PS_FAULT", spec, 1);
		setenv("PS_FAULT_LOG", flog, 1);
		w = tu_spawn(argv, out);
		unsetenv("LD_PRELOAD");
		unsetenv("PS_FAULT");
		unsetenv("PS_FAULT_LOG");
		rc = tu_wait_child(w);
		if (!faults_made()) {
			ck_assert_msg(rc == 0, "without a fault: %s", slurp(out));
			break;
		}
		ck_assert_msg(rc == 0, "%s: %s", spec, slurp(out));
		/* a new worker: the shard is restarted (clock 0 again) */
		ck_assert_int_eq(tu_stop_server(pid), 0);
		tu_rmtree(dir);
		ck_assert_int_eq(mkdir(dir, 0700), 0);
		pid = start_faulted(-1, NULL, NULL);
	}
	printf("test_send_eagain: %d sends failed with EAGAIN in turn\n", n - 1);
	ck_assert_msg(n > 1 && n <= 20, "the worker's sends: %d failed in turn", n - 1);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unlink(cfg_path);
	tu_rmtree(dir);
}
END_TEST

int main(int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (argc == 3 && !strcmp(argv[1], "--eagain-worker"))
		return eagain_worker(argv[2]);
	if (SANITIZED) {
		printf("it_fault: skipped: the sanitizer's runtime must be the first library "
		       "loaded, before libpsfault.so\n");
		return 77;
	}
	if (getenv("PS_TEST_VALGRIND")) {
		printf("it_fault: skipped: under valgrind, whose malloc libpsfault.so would "
		       "bypass\n");
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
	TU_ADD_LOOP(tc, test_snapshot_faults, 0, 4);
	TU_ADD(tc, test_accept_oom);
	TU_ADD(tc, test_rows_oom);
	TU_ADD(tc, test_backup_rows_oom);
	TU_ADD(tc, test_backup_join_oom);
	TU_ADD(tc, test_declare_oom);
	TU_ADD(tc, test_send_eagain);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
