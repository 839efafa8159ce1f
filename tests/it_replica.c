/* it_replica.c - replicated shards (cluster.replicas: 1) with real
 * processes on loopback: two shards, each a primary and a backup process,
 * two worker processes built on libps, and faults injected while they
 * train: kill -9 of a random primary or backup (restarted), a partition
 * of a primary (nftables, when this runs as root), a backup stopped
 * (SIGSTOP). The oracle is exact: SGD with lr 1 and small integer
 * gradients, so every weight must be its initial value minus the exact
 * sum of the acknowledged pushes, plus 0 or 1 times each push whose
 * outcome its worker did not learn. Failover times (kill to the next
 * acknowledged push of every worker) are printed, median and max.
 *
 * PS_TEST_REPL_CLOCKS sets the clocks of the fault runs (default 1000),
 * PS_TEST_REPL_PACE_MS the pause of a worker between clocks (default 30,
 * so that the faults fall inside the run); PS_TEST_REPL_SOAK=1 runs three
 * times as many clocks; PS_TEST_QUICK=1 (scripts/mutate.sh) 400 by default,
 * still long enough for the faults to land inside the run.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NSHARDS 2
#define NWORKERS 2
#define NT 2
#define MAXU 256 /* pushes of unknown outcome one worker may have */

/* What the workers tell the test process (shared memory). */
struct shared {
	double last_ack[NWORKERS];     /* ps_now_s() of each worker's last acked push */
	int clock[NWORKERS];           /* clocks done */
	int unknown[NWORKERS];         /* async: pushes whose outcome was not learned */
	int unknown_clock[NWORKERS][MAXU];
	int done[NWORKERS];
};

static struct shared *sh;
static char cfg_path[64];
static struct ps_config cfg;
static int ports[2][NSHARDS];
static pid_t srv[2][NSHARDS];
static char logdir[64];

static int nclocks(void)
{
	const char *e = getenv("PS_TEST_REPL_CLOCKS");
	int n = e && *e ? atoi(e) : getenv("PS_TEST_QUICK") ? 400 : 1000;

	if (getenv("PS_TEST_REPL_SOAK"))
		n *= 3;
	if (getenv("PS_TEST_VALGRIND")) /* the test and its workers under memcheck */
		n /= 5;
	return n > 0 ? n : 1000;
}

static int pace_ms(void)
{
	const char *e = getenv("PS_TEST_REPL_PACE_MS");

	return e && *e ? atoi(e) : 30;
}

/* A free port below the kernel's ephemeral range (32768 by default): the
 * processes dial each other, and a restarted process must find its port
 * not taken as the source port of such a dial. Distinct from the n ports
 * picked before it in this config. */
static int low_free_port(int n)
{
	static int picked[2 * NSHARDS];
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)n;

	for (int i = 0; i < 1000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000), dup = 0;
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		for (int j = 0; j < n; j++)
			dup |= picked[j] == p;
		if (!dup && fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(fd);
			picked[n] = p;
			return p;
		}
		if (fd >= 0)
			close(fd);
	}
	return tu_free_port();
}

/* The first of n consecutive free ports below the ephemeral range (the
 * metrics ports of the four processes), none of the config's. */
static int low_free_range(int n)
{
	unsigned seed = (unsigned)getpid() * 40503u;

	for (int i = 0; i < 1000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000), ok = 1;
		for (int j = 0; j < n && ok; j++) {
			struct sockaddr_in sa = { .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)(p + j)),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			for (int r = 0; r < 2; r++)
				for (int k = 0; k < NSHARDS; k++)
					ok &= ports[r][k] != p + j;
			ok &= fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
			if (fd >= 0)
				close(fd);
		}
		if (ok)
			return p;
	}
	return tu_free_port();
}

static const char *forward = "aggregated";
static int http_port; /* 1: stats.http on free ports (shard k replica r on port + k + 2 r) */

static void write_config(const char *mode, const char *optim, int timeout_ms, int request_ms)
{
	char yaml[2048], http[64] = "";

	for (int r = 0; r < 2; r++)
		for (int k = 0; k < NSHARDS; k++)
			ports[r][k] = low_free_port(r * NSHARDS + k);
	if (http_port)
		snprintf(http, sizeof(http), "stats:\n  http: 127.0.0.1:%d\n",
			 low_free_range(2 * NSHARDS));
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  backups: [%s:%d, %s:%d]\n"
		 "  replicas: 1\n  workers: %d\n"
		 "replication:\n  timeout_ms: %d\n  forward: %s\n"
		 "consistency:\n  mode: %s\n  staleness: 2\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  %s\n"
		 "%s"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: %d\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000], init: arange}\n"
		 "    - {name: b, shape: [17, 33], init: arange}\n",
		 tu_transport_yaml(), tu_host(), ports[0][0], tu_host(), ports[0][1], tu_host(),
		 ports[1][0], tu_host(), ports[1][1], NWORKERS, timeout_ms, forward, mode, optim, http,
		 request_ms);
	tu_replica_config(yaml, cfg_path, &cfg, logdir, "/tmp/ps-test-repl-XXXXXX");
}

static void start_all(void)
{
	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++)
			srv[r][k] = tu_start_replica(cfg_path, logdir, k, r, 0);
}

/* Stops every process with SIGTERM: each must exit 0 (under the
 * sanitizers, also free of leaks). */
static void stop_all(void)
{
	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++)
			if (srv[r][k] > 0) {
				int st = tu_stop_server(srv[r][k]);
				ck_assert_msg(st == 0, "shard %d replica %d exited with %d (logs in %s)", k,
					      r, st, logdir);
				srv[r][k] = 0;
			}
	unlink(cfg_path);
}

enum { G_INT, G_FLOAT, G_MARK };
static int gmode, g_nc;

/* G_INT: small integers on every element; G_MARK: 1 on the elements whose
 * index names this push (rank * clocks + clock, modulo the push count),
 * so every push's outcome shows on its own elements. */
static float grad_value(int rank, int clock, int t, int64_t i)
{
	if (gmode == G_MARK)
		return (i + t * 7) % (NWORKERS * g_nc) == rank * g_nc + clock ? (float)(rank + 1) : 0;
	return (float)((rank + 1) * (int)((clock * 3 + i + t) % 7 - 3));
}

/* Adam runs: a float gradient that is not an integer. */
static float grad_float(int rank, int clock, int t, int64_t i)
{
	return sinf((float)(rank * 131 + clock * 17 + t * 7) + (float)i * 0.01f) * 0.1f;
}

/* One worker process: nc clocks of push (ending the clock) and pull.
 * Sync: every push must be acknowledged. Async: a push that fails is
 * recorded as unknown and the worker goes on. */
static int worker(int rank, int nc, int sync)
{
	char err[512];
	struct ps_client *c = NULL;
	struct ps_tensor g[NT], w[NT];
	int pace = pace_ms();

	for (int i = 0; i < 100 && ps_client_init(&c, &cfg, rank, err, sizeof(err)); i++)
		tu_sleep_ms(100);
	if (!c) {
		fprintf(stderr, "worker %d: %s\n", rank, err);
		return 2;
	}
	for (int t = 0; t < NT; t++) {
		g[t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(cfg.tensors[t].count * 4),
					   cfg.tensors[t].count, 0 };
		w[t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(cfg.tensors[t].count * 4),
					   cfg.tensors[t].count, 0 };
	}
	for (int clock = 0; clock < nc; clock++) {
		for (int t = 0; t < NT; t++)
			for (int64_t i = 0; i < g[t].count; i++)
				g[t].data[i] = gmode == G_FLOAT ? grad_float(rank, clock, t, i)
								: grad_value(rank, clock, t, i);
		int64_t id = ps_client_push(c, (uint64_t)clock, g, NT, PS_PUSH_END_CLOCK);
		if (id < 0 || ps_client_wait(c, id)) {
			if (sync) {
				fprintf(stderr, "worker %d push %d: %s\n", rank, clock,
					ps_client_error(c));
				return 3;
			}
			if (sh->unknown[rank] >= MAXU)
				return 5;
			sh->unknown_clock[rank][sh->unknown[rank]++] = clock;
		} else {
			sh->last_ack[rank] = ps_now_s();
		}
		id = ps_client_pull(c, sync ? (uint64_t)clock + 1 : 0, w, NT);
		if (id < 0 || ps_client_wait(c, id)) {
			fprintf(stderr, "worker %d pull %d: %s\n", rank, clock, ps_client_error(c));
			if (sync)
				return 4;
		}
		sh->clock[rank] = clock + 1;
		if (pace)
			tu_sleep_ms(pace);
	}
	sh->done[rank] = 1;
	ps_client_free(c);
	return 0;
}

static pid_t start_worker(int rank, int nc, int sync)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(worker(rank, nc, sync));
	return pid;
}

/* nftables: drop everything to and from a port (a partition). */
static int nft_ok = -1;
static void nft(const char *cmd)
{
	if (system(cmd) != 0)
		fprintf(stderr, "it_replica: '%s' failed\n", cmd);
}

static int partition_possible(void)
{
	if (nft_ok < 0)
		nft_ok = geteuid() == 0 &&
			 system("nft add table inet ps_repl_test 2>/dev/null") == 0 &&
			 system("nft add chain inet ps_repl_test out '{ type filter hook output "
				"priority 0; }' 2>/dev/null") == 0;
	return nft_ok;
}

static void partition(int port, int on)
{
	char cmd[256];

	if (on) {
		snprintf(cmd, sizeof(cmd), "nft add rule inet ps_repl_test out tcp dport %d drop; "
			 "nft add rule inet ps_repl_test out tcp sport %d drop", port, port);
	} else {
		snprintf(cmd, sizeof(cmd), "nft delete table inet ps_repl_test");
		nft_ok = -1;
	}
	nft(cmd);
}

/* Runs the workers while faults are injected every few seconds; returns
 * the number of faults, failover times in ft (seconds). */
enum { F_ANY, F_PARTITION, F_PRIMARIES };

/* xorshift64*: the faults' choices (rand_r's low bits are too regular) */
static uint64_t rnd(uint64_t *x)
{
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return (*x * 2685821657736338717ull) >> 33;
}
static int run_with_faults(int nc, int sync, int faults, double *ft, int *nft_out, int how)
{
	pid_t w[NWORKERS];
	int n = 0, parted = 0;
	uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull | 1;

	for (int r = 0; r < NWORKERS; r++)
		w[r] = start_worker(r, nc, sync);
	*nft_out = 0;
	while (faults && !(sh->done[0] && sh->done[1])) {
		tu_sleep_ms(1200 + (int)(rnd(&seed) % 800));
		if (sh->done[0] || sh->done[1] || tu_replicas_healthy(&cfg, NSHARDS, 30) < 0)
			break;
		int k = (int)(rnd(&seed) % NSHARDS), p = tu_replica_primary(&cfg, k);
		if (p < 0)
			continue;
		int do_partition = how == F_PARTITION;
		/* the first fault always hits a primary, so every run fails over */
		int victim = (do_partition && !parted && n >= 1) || how == F_PRIMARIES || n == 0
			     ? p : (int)(rnd(&seed) % 2);
		double t0 = ps_now_s(), tf = 0;
		if (do_partition && !parted && n >= 1 && partition_possible()) {
			/* cut the primary off from everyone for 5 s */
			parted = 1;
			partition(ports[victim][k], 1);
			while (ps_now_s() - t0 < 5.0 && !(sh->done[0] && sh->done[1])) {
				if (!tf && sh->last_ack[0] > t0 && sh->last_ack[1] > t0)
					tf = ps_now_s() - t0;
				tu_sleep_ms(5);
			}
			partition(ports[victim][k], 0);
			fprintf(stderr, "it_replica: partitioned the primary of shard %d (replica %d) "
				"for %.1f s\n", k, victim, ps_now_s() - t0);
		} else {
			kill(srv[victim][k], SIGKILL);
			tu_wait_child(srv[victim][k]);
			tu_sleep_ms(200 + (int)(rnd(&seed) % 500));
			srv[victim][k] = tu_start_replica(cfg_path, logdir, k, victim, 0);
		}
		n++;
		if (victim == p) {
			/* failover: until every worker has an ack after the fault */
			while (!(sh->done[0] && sh->done[1]) &&
			       (sh->last_ack[0] < t0 || sh->last_ack[1] < t0) && ps_now_s() - t0 < 60)
				tu_sleep_ms(5);
			if (tf)
				ft[(*nft_out)++] = tf;
			else if (!(sh->done[0] && sh->done[1]))
				ft[(*nft_out)++] = ps_now_s() - t0;
		}
		faults--;
	}
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_int_eq(tu_wait_child(w[r]), 0);
	return n;
}

static void report_failovers(const char *what, double *ft, int n)
{
	if (!n) {
		fprintf(stderr, "it_replica: %s: no primary failed\n", what);
		return;
	}
	qsort(ft, (size_t)n, sizeof(*ft), tu_cmp_double);
	fprintf(stderr, "it_replica: %s: %d primary failures, failover (fault to every worker's "
		"next ack) median %.2f s, max %.2f s (replication.timeout_ms %d)\n", what, n,
		ft[n / 2], ft[n - 1], cfg.repl_timeout_ms);
}

/* The final weights, pulled by a fresh worker-less monitor... a worker
 * rank may not be reused (its incarnation would restart the clocks), so
 * weights are read with a pull from a new process of rank 0 at version 0. */
static void pull_weights(struct ps_tensor *w)
{
	char err[512];
	struct ps_client *c = NULL;

	for (int i = 0; i < 50 && ps_client_init(&c, &cfg, 0, err, sizeof(err)); i++)
		tu_sleep_ms(100);
	ck_assert_msg(c, "%s", err);
	int64_t id = ps_client_pull(c, 0, w, NT);
	ck_assert_msg(id >= 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	ps_client_free(c);
}

static void alloc_w(struct ps_tensor *w)
{
	for (int t = 0; t < NT; t++)
		w[t] = (struct ps_tensor){ cfg.tensors[t].name, calloc(cfg.tensors[t].count, 4),
					   cfg.tensors[t].count, 0 };
}

static void free_w(struct ps_tensor *w)
{
	for (int t = 0; t < NT; t++)
		free(w[t].data);
}

/* Every element is init - sum of acked pushes - a 0/1 combination of the
 * unknown ones (the Jepsen counter rule). */
static void check_oracle(struct ps_tensor *w, int nc)
{
	int nu = sh->unknown[0] + sh->unknown[1];

	for (int t = 0; t < NT; t++)
		for (int64_t i = 0; i < w[t].count; i++) {
			double exp = (double)(i % 1024), unk[2 * MAXU];
			int u = 0, found = 0;
			for (int r = 0; r < NWORKERS; r++)
				for (int c = 0; c < nc; c++) {
					int unknown = 0;
					for (int j = 0; j < sh->unknown[r]; j++)
						unknown |= sh->unknown_clock[r][j] == c;
					if (!grad_value(r, c, t, i))
						continue;
					if (unknown)
						unk[u++] = grad_value(r, c, t, i);
					else
						exp -= grad_value(r, c, t, i);
				}
			ck_assert_msg(u <= 20, "%d pushes of unknown outcome on one element", u);
			for (unsigned m = 0; m < (1u << u) && !found; m++) {
				double e = exp;
				for (int j = 0; j < u; j++)
					if (m >> j & 1)
						e -= unk[j];
				found = (double)w[t].data[i] == e;
			}
			ck_assert_msg(found, "tensor %d element %lld: %g, expected %g minus a subset of "
				      "%d unknown pushes", t, (long long)i, w[t].data[i], exp, nu);
		}
}

static void *shared_new(void)
{
	void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	memset(p, 0, sizeof(struct shared));
	return p;
}

/* Sync, SGD, integer gradients: kill -9 of random primaries and backups
 * (restarted) and one 5 s partition of a primary; every weight exact. */
START_TEST(test_sync_faults_exact)
{
	double ft[64];
	struct ps_tensor w[NT];
	int nf, nc = nclocks();

	sh = shared_new();
	gmode = G_INT;
	g_nc = nc;
	write_config("sync", "name: sgd\n  lr: 1", 500, 60000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	double t0 = ps_now_s();
	int n = run_with_faults(nc, 1, 1000, ft, &nf, F_PARTITION);
	fprintf(stderr, "it_replica: sync: %d clocks, %d faults in %.1f s\n", nc, n,
		ps_now_s() - t0);
	ck_assert_int_ge(n, 1);
	ck_assert_int_ge(nf, 1);
	report_failovers("sync", ft, nf);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, nc);
	free_w(w);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form again");
	stop_all();
}
END_TEST

/* Async: a push whose request failed is applied 0 or 1 times, every
 * acknowledged one exactly once. */
START_TEST(test_async_faults_counter)
{
	double ft[64];
	struct ps_tensor w[NT];
	int nf, nc = nclocks();

	sh = shared_new();
	gmode = G_MARK;
	g_nc = nc;
	/* requests give up before a failover ends: their outcome is unknown */
	write_config("async", "name: sgd\n  lr: 1", 500, 800);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	int n = run_with_faults(nc, 0, 1000, ft, &nf, F_ANY);
	ck_assert_int_ge(n, 1);
	fprintf(stderr, "it_replica: async: %d faults, %d pushes of unknown outcome\n", n,
		sh->unknown[0] + sh->unknown[1]);
	ck_assert_int_ge(nf, 1);
	report_failovers("async", ft, nf);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, nc);
	free_w(w);
	stop_all();
}
END_TEST

/* Sync with Adam and float gradients: a run with kills of primaries ends
 * bit-identical to a clean run of the same seed. */
START_TEST(test_sync_adam_bit_identical)
{
	double ft[64];
	struct ps_tensor w[2][NT];
	int nf, nc = nclocks() / 4 < 200 ? 200 : nclocks() / 4;

	for (int run = 0; run < 2; run++) {
		sh = shared_new();
		gmode = G_FLOAT;
		write_config("sync", "name: adam\n  lr: 0.01", 500, 60000);
		start_all();
		ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
		int n = run_with_faults(nc, 1, run ? 3 : 0, ft, &nf, F_PRIMARIES);
		if (run) {
			ck_assert_int_ge(nf, 1);
			report_failovers("sync adam", ft, nf);
		}
		(void)n;
		alloc_w(w[run]);
		pull_weights(w[run]);
		stop_all();
		munmap(sh, sizeof(*sh));
	}
	for (int t = 0; t < NT; t++)
		ck_assert_msg(memcmp(w[0][t].data, w[1][t].data, (size_t)w[0][t].count * 4) == 0,
			      "tensor %d differs from the clean run", t);
	free_w(w[0]);
	free_w(w[1]);
}
END_TEST

/* A backup stopped for 3 s (less than replication.timeout_ms): the
 * primary's acks wait, nothing is lost, and the backup catches up to the
 * same state. */
START_TEST(test_backup_stopped_catches_up)
{
	struct ps_tensor w[NT];
	int nc = 300;

	sh = shared_new();
	gmode = G_INT;
	g_nc = nc;
	write_config("sync", "name: sgd\n  lr: 1", 5000, 60000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	int p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	pid_t wk[NWORKERS];
	for (int r = 0; r < NWORKERS; r++)
		wk[r] = start_worker(r, nc, 1);
	for (double t0 = ps_now_s(); sh->clock[0] < 20 && ps_now_s() - t0 < 30 * tu_time_scale();)
		tu_sleep_ms(5);
	ck_assert_msg(sh->clock[0] >= 20, "the workers did not reach clock 20 (logs in %s)", logdir);
	kill(srv[!p][0], SIGSTOP);
	int at = sh->clock[0];
	tu_sleep_ms(3000);
	struct ps_shard_stats st;
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &st), 0);
	fprintf(stderr, "it_replica: backup stopped 3 s: lag %llu batches, workers went from "
		"clock %d to %d\n", (unsigned long long)st.repl_lag, at, sh->clock[0]);
	ck_assert_int_le(sh->clock[0], at + 2); /* acks waited for the backup */
	kill(srv[!p][0], SIGCONT);
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_int_eq(tu_wait_child(wk[r]), 0);
	ck_assert_int_eq(tu_replica_primary(&cfg, 0), p); /* no takeover */
	struct ps_shard_stats a, b;
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, !p, -1, &b), 0);
	ck_assert_uint_eq(a.repl_lag, 0);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);
	ck_assert_uint_eq(a.repl_lsn, b.repl_lsn);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, nc);
	free_w(w);
	stop_all();
}
END_TEST

/* replication.forward: every_push (each worker's gradient forwarded, the
 * backup sums them): after kills of primaries, weights exact too. */
START_TEST(test_every_push_exact)
{
	double ft[64];
	struct ps_tensor w[NT];
	int nf, nc = nclocks() / 4 < 200 ? 200 : nclocks() / 4;

	sh = shared_new();
	gmode = G_INT;
	g_nc = nc;
	forward = "every_push";
	write_config("sync", "name: sgd\n  lr: 1", 500, 60000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	run_with_faults(nc, 1, 2, ft, &nf, F_PRIMARIES);
	ck_assert_int_ge(nf, 1);
	report_failovers("sync every_push", ft, nf);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, nc);
	free_w(w);
	stop_all();
}
END_TEST

/* One worker's push of clock (G_INT gradients, ending the clock) from a
 * client of this process: the request id, not waited for. */
static int64_t push_clock(struct ps_client *c, int rank, int clock, struct ps_tensor *g)
{
	for (int t = 0; t < NT; t++)
		for (int64_t i = 0; i < g[t].count; i++)
			g[t].data[i] = grad_value(rank, clock, t, i);
	return ps_client_push(c, (uint64_t)clock, g, NT, PS_PUSH_END_CLOCK);
}

/* every_push: a backup that joins while a clock waits in the primary's
 * barrier (worker 0 pushed it, worker 1 not yet) must get worker 0's
 * gradient with the state; it summed that clock without it, and once it
 * took over, the weights lacked an acknowledged push. The backup of shard
 * 0 is killed and restarted between the two pushes, so its state transfer
 * falls there every time; then the pair's checksums must agree, and after
 * the primary is killed, the weights the backup serves are exact. */
START_TEST(test_every_push_backup_joins_mid_clock)
{
	struct ps_tensor g[NWORKERS][NT], w[NT];
	struct ps_client *c[NWORKERS] = { NULL };
	struct ps_shard_stats a, b;
	char err[512];
	int64_t id[NWORKERS];

	sh = shared_new();
	gmode = G_INT;
	g_nc = 1;
	forward = "every_push";
	write_config("sync", "name: sgd\n  lr: 1", 500, 60000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	int p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	for (int r = 0; r < NWORKERS; r++) {
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
		alloc_w(g[r]);
	}
	id[0] = push_clock(c[0], 0, 0, g[0]);
	ck_assert_int_ge(id[0], 0);
	/* worker 0's push is in shard 0's barrier (its ack waits for worker 1) */
	double t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, p, -1, &a) == 0 && a.pushes >= 1) &&
	       ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_uint_ge(a.pushes, 1);
	kill(srv[!p][0], SIGKILL);
	tu_wait_child(srv[!p][0]);
	srv[!p][0] = tu_start_replica(cfg_path, logdir, 0, !p, 0);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the restarted backup did not join (logs in %s)",
		      logdir);
	id[1] = push_clock(c[1], 1, 0, g[1]);
	ck_assert_int_ge(id[1], 0);
	for (int r = 0; r < NWORKERS; r++) {
		ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "worker %d: %s", r,
			      ps_client_error(c[r]));
		ps_client_free(c[r]);
		free_w(g[r]);
	}
	/* acknowledged: the backup confirmed the clock's sum */
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, !p, -1, &b), 0);
	ck_assert_msg(a.param_checksum == b.param_checksum, "shard 0: the backup's weights differ "
		      "from the primary's (logs in %s)", logdir);
	/* the backup serves: the weights must hold both pushes once */
	kill(srv[p][0], SIGKILL);
	tu_wait_child(srv[p][0]);
	srv[p][0] = tu_start_replica(cfg_path, logdir, 0, p, 0);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pair did not form again (logs in %s)", logdir);
	ck_assert_int_eq(tu_replica_primary(&cfg, 0), !p);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, 1);
	free_w(w);
	stop_all();
}
END_TEST

static int log_has(int k, int r, const char *text)
{
	char path[160], buf[1 << 16];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/shard%d-r%d.log", logdir, k, r);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

/* The backup killed: its primary goes on alone, says so in its log, in
 * ps-stat's fields and /metrics, the workers keep going, and the
 * restarted process joins as the backup with the same state. */
START_TEST(test_backup_killed_primary_alone)
{
	struct ps_tensor w[NT];
	struct ps_shard_stats st, a, b;
	char body[1 << 16];
	int nc = 400;

	sh = shared_new();
	gmode = G_INT;
	g_nc = nc;
	http_port = 1;
	write_config("async", "name: sgd\n  lr: 1", 500, 60000);
	http_port = 0;
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	int p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	pid_t wk[NWORKERS];
	for (int r = 0; r < NWORKERS; r++)
		wk[r] = start_worker(r, nc, 0);
	for (double t0 = ps_now_s(); sh->clock[0] < 20 && ps_now_s() - t0 < 30 * tu_time_scale();)
		tu_sleep_ms(5);
	ck_assert_msg(sh->clock[0] >= 20, "the workers did not reach clock 20 (logs in %s)", logdir);
	kill(srv[!p][0], SIGKILL);
	tu_wait_child(srv[!p][0]);
	double t0 = ps_now_s();
	int alone = 0;
	while (!alone && ps_now_s() - t0 < 10 * tu_time_scale()) {
		alone = tu_replica_stats(&cfg, 0, p, -1, &st) == 0 && st.repl_state == 3 && !st.repl_partner_up;
		tu_sleep_ms(20);
	}
	ck_assert_msg(alone, "the primary does not say it is alone");
	ck_assert_msg(log_has(0, p, "goes on alone"), "no log line (logs in %s)", logdir);
	struct ps_endpoint ep;
	const char *why;
	ck_assert_int_eq(ps_endpoint_parse(cfg.stats.http, &ep, &why), 0);
	ck_assert_int_eq(tu_http_get(ep.port + 0 + p * NSHARDS, "/metrics", body, sizeof(body)), 200);
	ck_assert_msg(strstr(body, "ps_replica_partner_up 0") && strstr(body, "ps_replica_primary 1"),
		      "%s", body);
	int at = sh->clock[0];
	double t1 = ps_now_s();
	while (sh->clock[0] < at + 10 && ps_now_s() - t1 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(sh->clock[0] >= at + 10, "training stopped without the backup");
	srv[!p][0] = tu_start_replica(cfg_path, logdir, 0, !p, 0);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the restarted backup did not join");
	ck_assert_int_eq(tu_http_get(ep.port + 0 + p * NSHARDS, "/metrics", body, sizeof(body)), 200);
	ck_assert_msg(strstr(body, "ps_replica_partner_up 1"), "%s", body);
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_int_eq(tu_wait_child(wk[r]), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, !p, -1, &b), 0);
	ck_assert_int_eq(a.repl_state, 3);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);
	alloc_w(w);
	pull_weights(w);
	check_oracle(w, nc);
	free_w(w);
	stop_all();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("replica");
	TCase *tc = tcase_create("processes");

	tcase_set_timeout(tc, 600);
	TU_ADD(tc, test_backup_stopped_catches_up);
	TU_ADD(tc, test_sync_faults_exact);
	TU_ADD(tc, test_async_faults_counter);
	TU_ADD(tc, test_sync_adam_bit_identical);
	TU_ADD(tc, test_every_push_exact);
	TU_ADD(tc, test_every_push_backup_joins_mid_clock);
	TU_ADD(tc, test_backup_killed_primary_alone);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int rc;

	tu_secret_setup();
	rc = tu_run_suite(suite());
	tu_secret_cleanup();
	return rc;
}
