/* test_fault.h - what it_fault and it_fault_repl share: libpsfault.so
 * (tests/fault_inject.c) found beside the program and put into the
 * environment of the shards they start, the faults it made read back from
 * its log, a model of one dense tensor and one table with exact sums
 * (integer gradients, SGD lr 1), and the configs (one shard; one shard's
 * replicated pair).
 */
#ifndef TEST_FAULT_H
#define TEST_FAULT_H

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
/* The environment that arms libpsfault.so in the next process started:
 * spec after the log line after (NULL: at once), faults made into flog
 * (emptied), each with its call stack when backtrace is set; disarm_faults
 * takes it away again. */
static inline void arm_faults(const char *spec, const char *after, int backtrace)
{
	unlink(flog);
	setenv("LD_PRELOAD", lib, 1);
	setenv("PS_FAULT", spec, 1);
	setenv("PS_FAULT_LOG", flog, 1);
	if (after)
		setenv("PS_FAULT_AFTER", after, 1);
	if (backtrace)
		setenv("PS_FAULT_BACKTRACE", "1", 1);
}

static inline void disarm_faults(void)
{
	unsetenv("LD_PRELOAD");
	unsetenv("PS_FAULT");
	unsetenv("PS_FAULT_LOG");
	unsetenv("PS_FAULT_AFTER");
	unsetenv("PS_FAULT_BACKTRACE");
}

static inline pid_t start_faulted(int r, const char *spec, const char *after)
{
	pid_t pid;

	if (spec)
		arm_faults(spec, after, 0);
	else
		unlink(flog);
	setenv("PS_TEST_LOG", "info", 1); /* the markers are info lines */
	pid = r < 0 ? tu_start_server_log(cfg_path, 0, slog)
		    : tu_start_replica(cfg_path, dir, 0, r, 1);
	disarm_faults();
	unsetenv("PS_TEST_LOG");
	return pid;
}

/* Spawns argv (tu_spawn, output into out) with faults armed as
 * arm_faults says. */
static inline pid_t spawn_faulted(const char *const *argv, const char *out, const char *spec,
				  const char *after, int backtrace)
{
	arm_faults(spec, after, backtrace);
	pid_t pid = tu_spawn(argv, out);
	disarm_faults();
	return pid;
}

/* The text of file path (static, up to 1 MiB; "" when absent). */
static inline const char *slurp(const char *path)
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

/* The lines of log path whose message (after "role[k] ") is empty. */
static inline int empty_log_lines(const char *path)
{
	char line[4096];
	int n = 0;
	FILE *f = fopen(path, "r");

	while (f && fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "] ");
		if (p && strspn(p + 2, " \n") == strlen(p + 2))
			n++;
	}
	if (f)
		fclose(f);
	return n;
}

/* The faults made: the lines of flog that name a call. */
static inline int faults_made(void)
{
	return tu_file_count(flog, " call ");
}

static inline struct ps_client *connect_retry(const struct ps_config *c, int rank)
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

static inline float dgrad(int i, uint64_t k)
{
	return (float)((int)((i * 7 + (int)k * 3) % 9) - 4);
}

static inline float rgrad(int id, int j, uint64_t k)
{
	return (float)((int)((id * 5 + j * 3 + (int)k * 7) % 9) - 4);
}

/* The gradients of m's next clock into g (dense), rg and ids (rows), and
 * m updated by them (SGD, lr 1). */
static inline void clock_grads(struct model *m, float *g, float *rg, uint64_t *ids)
{
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
}

/* One sync clock of worker c (the only one): rows, then the dense push
 * ending the clock; m follows. */
static inline void train_clock(struct ps_client *c, struct model *m)
{
	static float g[NA], rg[NID * DIM];
	uint64_t ids[NID];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };
	int64_t q;

	clock_grads(m, g, rg, ids);
	ck_assert_msg(ps_client_push_rows(c, "e", m->clock, ids, NID, rg, 0) == 0, "push rows: %s",
		      ps_client_error(c));
	q = ps_client_push(c, m->clock, &t, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "push: %s", ps_client_error(c));
	m->clock++;
}

/* One sync clock as train_clock, each call tried again (up to 5 times)
 * when the shard refuses it; the refusals counted in *refused. */
static inline void train_clock_retry(struct ps_client *c, struct model *m, int *refused,
			      const char *spec)
{
	static float g[NA], rg[NID * DIM];
	uint64_t ids[NID];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };
	int rc = -1, k;

	clock_grads(m, g, rg, ids);
	for (k = 0; k < 5 && rc; k++)
		if ((rc = ps_client_push_rows(c, "e", m->clock, ids, NID, rg, 0)))
			(*refused)++;
	ck_assert_msg(rc == 0, "%s: push rows of clock %llu, %d tries: %s", spec,
		      (unsigned long long)m->clock, k, ps_client_error(c));
	rc = -1;
	for (k = 0; k < 5 && rc; k++) {
		int64_t q = ps_client_push(c, m->clock, &t, 1, PS_PUSH_END_CLOCK);
		if ((rc = q > 0 ? ps_client_wait(c, q) : (int)q))
			(*refused)++;
	}
	ck_assert_msg(rc == 0, "%s: push of clock %llu, %d tries: %s", spec,
		      (unsigned long long)m->clock, k, ps_client_error(c));
	m->clock++;
}

/* The shard's weights and rows equal m's, exactly. */
static inline void check_exact(struct ps_client *c, const struct model *m, const char *what)
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

/* ---- configs ---- */

/* The test's config of nservers shards (fresh ports): tensor a, table e,
 * SGD lr 1, checkpoints in ckdir on request, extra lines after them;
 * written to a temporary file (its name into path) and loaded into c. */
static inline void write_cfg_n(char *path, struct ps_config *c, int nservers, const char *ckdir,
			       const char *extra)
{
	char yaml[2048], servers[256] = "", err[512];

	for (int k = 0, o = 0; k < nservers; k++)
		o += snprintf(servers + o, sizeof(servers) - (size_t)o, "%s%s:%d", k ? ", " : "",
			      tu_host(), tu_free_port());
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s]\n  workers: 1\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n%s"
		 "limits:\n  request_timeout_ms: 20000\n",
		 tu_transport_yaml(), servers, NA, DIM, ckdir, extra);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(c, path, err, sizeof(err)) == 0, "%s", err);
}

/* The config of one shard, checkpoints in dir, at cfg_path (cfg). */
static inline void write_cfg(const char *extra)
{
	write_cfg_n(cfg_path, &cfg, 1, dir, extra);
}

static inline void make_dir(void)
{
	strcpy(dir, "/tmp/ps-test-fault-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(flog, sizeof(flog), "%s/faults.log", dir);
	snprintf(slog, sizeof(slog), "%s/shard.log", dir);
}

static const char *pair_mode = "sync"; /* consistency.mode of write_pair_cfg */
static const char *pair_workers = "workers: 1"; /* its cluster's workers line(s) */

static inline void write_pair_cfg(const char *model, int request_ms)
{
	char yaml[2048];
	int p0 = tu_low_free_port(0), p1 = tu_low_free_port(p0);

	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n"
		 "  replicas: 1\n  %s\n"
		 "replication:\n  timeout_ms: 1000\n"
		 "consistency:\n  mode: %s\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n%s"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: %d\n",
		 tu_transport_yaml(), tu_host(), p0, tu_host(), p1, pair_workers, pair_mode, model,
		 request_ms);
	tu_replica_config(yaml, cfg_path, &cfg, dir, "/tmp/ps-test-fault-XXXXXX");
	snprintf(flog, sizeof(flog), "%s/faults.log", dir);
}

static inline const char *rlog(int r)
{
	static char path[2][160];

	snprintf(path[r], sizeof(path[r]), "%s/shard0-r%d.log", dir, r);
	return path[r];
}

/* Both processes hold the same weights and tables (checksums), at the
 * same clock and batch (waited for). */
static inline void assert_in_sync(uint64_t clock, const char *what)
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


/* The checks a program of libpsfault.so makes before its cases: 0 to
 * run them, else the exit status (77: skipped, the reason printed). */
static inline int tu_fault_setup(const char *prog)
{
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (SANITIZED) {
		printf("%s: skipped: the sanitizer's runtime must be the first library loaded, "
		       "before libpsfault.so\n", prog);
		return 77;
	}
	if (n <= 0)
		return 1;
	self[n] = 0;
	snprintf(lib, sizeof(lib), "%s/libpsfault.so", dirname(strdup(self)));
	if (access(lib, R_OK)) {
		fprintf(stderr, "%s: %s is missing (make %s)\n", prog, lib, lib);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

#endif
