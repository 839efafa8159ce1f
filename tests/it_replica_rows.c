/* it_replica_rows.c - replicated shards (cluster.replicas: 1) with
 * embedding tables: two shards, each a primary and a backup process, two
 * worker processes built on libps pushing rows and a dense tensor while
 * faults are injected: kill -9 of a random primary or backup (restarted),
 * one partition of a primary (nftables, when this runs as root).
 *
 * The oracle is exact: tables e (dim 4) and f (dim 2, admission 2) are
 * SGD with lr 1, init zeros and small integer gradients, so every row must
 * be minus the exact sum of the gradients applied to it, and the row
 * admission creates is known (sync: the clock whose pushes bring the id's
 * sightings to 2, its sum included; async: the second push naming it, f's
 * ids being each pushed by one worker only). In sync mode every worker
 * checks the rows it pushed after each clock against the oracle, whatever
 * process answered, so a takeover that changed anything a worker can see
 * fails the run. Table g (rowwise adagrad, float gradients) and table h
 * (ttl 1 s, max_rows 100: rows expire and are evicted all the time) have
 * no oracle: at the end the two processes of each shard must show the
 * same checksum of every table (rows, optimizer state, recency order,
 * admission filter), the same counts of rows admitted, evicted and
 * expired, and the same dense state.
 *
 * A third case takes over in the middle of an incremental checkpoint
 * chain: full and delta-1 written by both processes, the primary killed,
 * delta-2 written by the new primary, which is then killed and restarted
 * from its chain: the tables must come back bit for bit (checksums). A
 * fourth stops both backups: a row push must wait for them before its ack.
 * A fifth pushes 100,000 rows at once: one batch, applied by the backup.
 *
 * PS_TEST_REPL_CLOCKS sets the clocks of the fault runs (default 400;
 * 150 with PS_TEST_QUICK), PS_TEST_REPL_PACE_MS a worker's pause between
 * clocks (default 20).
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NSHARDS 2
#define NWORKERS 2
#define NIDS 160      /* ids of each table */
#define K 6           /* ids in one row push */
#define NDENSE 64     /* the dense tensor a */
#define DE 4          /* dims of e, f, g */
#define DF 2
#define DG 3
#define DH 2
#define NT 4          /* tables e, f, g, h */
#define NPHASE 8

/* What the workers tell the test process (shared memory), and when they
 * pause (the checkpoint case). */
struct shared {
	double last_ack[NWORKERS];     /* ps_now_s() of each worker's last acked clock */
	int clock[NWORKERS];           /* clocks done */
	int done[NWORKERS];
	int exited[NWORKERS];          /* the worker process ended (done or failed) */
	int stop_at[NPHASE];           /* the checkpoint case: clocks to pause before */
	int resume;                    /* phases released; -1: exit */
	int paused[NWORKERS];          /* the clock a worker waits before, else -1 */
	char why[NWORKERS][512];       /* a worker's failure */
};

static struct shared *sh;
static char cfg_path[64];
static struct ps_config cfg;
static int ports[2][NSHARDS];
static pid_t srv[2][NSHARDS];
static char logdir[64];
static char ckdir[64];
static int sync_mode;

static int quick(void)
{
	return getenv("PS_TEST_QUICK") != NULL;
}

static int nclocks(void)
{
	const char *e = getenv("PS_TEST_REPL_CLOCKS");
	int n = e && *e ? atoi(e) : quick() ? 150 : 400;

	if (getenv("PS_TEST_VALGRIND"))
		n /= 5;
	return n > 0 ? n : 400;
}

static int pace_ms(void)
{
	const char *e = getenv("PS_TEST_REPL_PACE_MS");

	return e && *e ? atoi(e) : 20;
}

/* A free port below the kernel's ephemeral range: a restarted process must
 * not find its port taken as the source port of its partner's dial. */
static int low_free_port(int n)
{
	static int picked[2 * NSHARDS];
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)n * 7919u + 17u;

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

static void write_config(const char *mode, int with_ckpt, int timeout_ms)
{
	char yaml[3072], err[512], ck[256] = "";

	for (int r = 0; r < 2; r++)
		for (int k = 0; k < NSHARDS; k++)
			ports[r][k] = low_free_port(r * NSHARDS + k);
	strcpy(logdir, "/tmp/ps-test-replrows-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
	if (with_ckpt) {
		snprintf(ckdir, sizeof(ckdir), "%s/ckpt", logdir);
		ck_assert_int_eq(mkdir(ckdir, 0700), 0);
		snprintf(ck, sizeof(ck), "checkpoint:\n  dir: %s\n  every_s: 0\n  incremental: 4\n"
			 "  on_request: true\n  min_interval_s: 0\n", ckdir);
	}
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  backups: [%s:%d, %s:%d]\n"
		 "  replicas: 1\n  workers: %d\n"
		 "replication:\n  timeout_ms: %d\n"
		 "consistency:\n  mode: %s\n  staleness: 2\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "%s"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 60000\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [%d], init: arange}\n"
		 "  embeddings:\n"
		 "    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n"
		 "    - {name: f, dim: %d, init: zeros, optimizer: sgd, lr: 1, admission: 2}\n"
		 "    - {name: g, dim: %d, optimizer: rowwise_adagrad, lr: 0.5}\n"
		 "    - {name: h, dim: %d, init: zeros, optimizer: sgd, lr: 1, ttl: 1, "
		 "max_rows: 100}\n",
		 tu_transport_yaml(), tu_host(), ports[0][0], tu_host(), ports[0][1], tu_host(),
		 ports[1][0], tu_host(), ports[1][1], NWORKERS, timeout_ms, mode, ck, NDENSE, DE, DF,
		 DG, DH);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	sync_mode = !strcmp(mode, "sync");
}

static void start_all(void)
{
	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++)
			srv[r][k] = tu_start_replica(cfg_path, logdir, k, r, 0);
}

/* Stops every process with SIGTERM: each must exit 0. */
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

/* ---- the workload and its oracle ---- */

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Id j of rank's push of table t at clock c. f's ids are rank's own
 * (async: one worker per id keeps the admitting push known). */
static uint64_t row_id(int t, int rank, int c, int j)
{
	uint64_t h = mix((uint64_t)t * 1000003u + (uint64_t)rank * 7919u + (uint64_t)c * 131u +
			 (uint64_t)j);
	if (t == 1)
		return 2 * (h % (NIDS / 2)) + (uint64_t)rank;
	return h % NIDS;
}

static float row_grad(int t, int rank, int c, int j, int d)
{
	if (t == 2)
		return sinf((float)(rank * 31 + c * 7 + j * 3 + d)) * 0.25f;
	return (float)(((rank + 1) * (c * 7 + j * 3 + d + t)) % 9 - 4);
}

static float dense_grad(int rank, int c, int i)
{
	return (float)((rank + 1) * ((c * 3 + i) % 7 - 3));
}

/* The oracle of tables e and f: rows and f's admission counts. */
struct oracle {
	double e[NIDS][DE];
	double f[NIDS][DF];
	int f_seen[NIDS];   /* sightings before admission */
	int f_live[NIDS];
};

/* The distinct ids of a push and their summed gradients (the client sums
 * repeats): n ids into ids, sums into g (dim each). */
static int push_rows_of(int t, int rank, int c, int dim, uint64_t *ids, double *g)
{
	int n = 0;

	for (int j = 0; j < K; j++) {
		uint64_t id = row_id(t, rank, c, j);
		int k = 0;
		while (k < n && ids[k] != id)
			k++;
		if (k == n) {
			ids[n++] = id;
			for (int d = 0; d < dim; d++)
				g[k * dim + d] = 0;
		}
		for (int d = 0; d < dim; d++)
			g[k * dim + d] += row_grad(t, rank, c, j, d);
	}
	return n;
}

/* Sync: clock c of both ranks applied to the oracle. */
static void oracle_clock_sync(struct oracle *o, int c)
{
	double se[NIDS][DE] = { { 0 } }, sf[NIDS][DF] = { { 0 } };
	int ne[NIDS] = { 0 }, nf[NIDS] = { 0 };

	for (int r = 0; r < NWORKERS; r++) {
		uint64_t ids[K];
		double g[K * DE];
		int n = push_rows_of(0, r, c, DE, ids, g);
		for (int i = 0; i < n; i++) {
			ne[ids[i]]++;
			for (int d = 0; d < DE; d++)
				se[ids[i]][d] += g[i * DE + d];
		}
		n = push_rows_of(1, r, c, DF, ids, g);
		for (int i = 0; i < n; i++) {
			nf[ids[i]]++;
			for (int d = 0; d < DF; d++)
				sf[ids[i]][d] += g[i * DF + d];
		}
	}
	for (int id = 0; id < NIDS; id++) {
		for (int d = 0; ne[id] && d < DE; d++)
			o->e[id][d] -= se[id][d];
		if (!nf[id])
			continue;
		if (!o->f_live[id]) {
			o->f_seen[id] += nf[id];
			if (o->f_seen[id] < 2)
				continue;
			o->f_live[id] = 1;
		}
		for (int d = 0; d < DF; d++)
			o->f[id][d] -= sf[id][d];
	}
}

/* Async: rank's push of clock c applied to the oracle (f's ids are its own). */
static void oracle_push_async(struct oracle *o, int rank, int c)
{
	uint64_t ids[K];
	double g[K * DE];
	int n = push_rows_of(0, rank, c, DE, ids, g);

	for (int i = 0; i < n; i++)
		for (int d = 0; d < DE; d++)
			o->e[ids[i]][d] -= g[i * DE + d];
	n = push_rows_of(1, rank, c, DF, ids, g);
	for (int i = 0; i < n; i++) {
		if (!o->f_live[ids[i]] && ++o->f_seen[ids[i]] < 2)
			continue;
		o->f_live[ids[i]] = 1;
		for (int d = 0; d < DF; d++)
			o->f[ids[i]][d] -= g[i * DF + d];
	}
}

static void oracle_run(struct oracle *o, int nc)
{
	memset(o, 0, sizeof(*o));
	for (int c = 0; c < nc; c++) {
		if (sync_mode)
			oracle_clock_sync(o, c);
		else
			for (int r = 0; r < NWORKERS; r++)
				oracle_push_async(o, r, c);
	}
}

/* Compares the rows of ids (pulled into w, dim each) of table t (0 e, 1 f)
 * with the oracle; 0, or -1 with the first difference in why. */
static int oracle_check(const struct oracle *o, int t, const uint64_t *ids, int n,
			const float *w, char *why, size_t len)
{
	int dim = t ? DF : DE;

	for (int i = 0; i < n; i++)
		for (int d = 0; d < dim; d++) {
			double want = t ? o->f[ids[i]][d] : o->e[ids[i]][d];
			if ((double)w[i * dim + d] != want) {
				snprintf(why, len, "table %s row %llu [%d]: %g, the exact sum says %g",
					 t ? "f" : "e", (unsigned long long)ids[i], d, w[i * dim + d],
					 want);
				return -1;
			}
		}
	return 0;
}

/* Pushes the rows of tables e, f, g, h for clock c (waited for). */
static int push_tables(struct ps_client *cl, int rank, int c)
{
	static const char *names[NT] = { "e", "f", "g", "h" };
	static const int dims[NT] = { DE, DF, DG, DH };
	int64_t id[NT];

	for (int t = 0; t < NT; t++) {
		uint64_t ids[K];
		float g[K * DE];
		for (int j = 0; j < K; j++) {
			ids[j] = row_id(t, rank, c, j);
			for (int d = 0; d < dims[t]; d++)
				g[j * dims[t] + d] = row_grad(t, rank, c, j, d);
		}
		id[t] = ps_client_push_rows_async(cl, names[t], (uint64_t)c, ids, K, g, 0);
		if (id[t] < 0)
			return (int)id[t];
	}
	for (int t = 0; t < NT; t++) {
		int rc = ps_client_wait(cl, id[t]);
		if (rc)
			return rc;
	}
	return 0;
}

/* One worker process: nc clocks of row pushes, the dense push that ends
 * the clock, and (sync) the pull of the rows pushed, checked against the
 * oracle. Every push must be acknowledged. Pauses before the clocks of
 * sh->stop_at until released. */
static int worker(int rank, int nc)
{
	char err[512];
	struct ps_client *c = NULL;
	struct oracle *o = calloc(1, sizeof(*o));
	float gd[NDENSE], wd[NDENSE];
	int pace = pace_ms(), phase = 0;

	for (int i = 0; i < 100 && ps_client_init(&c, &cfg, rank, err, sizeof(err)); i++)
		tu_sleep_ms(100);
	if (!c || !o) {
		snprintf(sh->why[rank], sizeof(sh->why[rank]), "init: %.400s", err);
		return 2;
	}
	for (int clock = 0; clock < nc; clock++) {
		if (phase < NPHASE && sh->stop_at[phase] == clock) {
			double t0 = ps_now_s();
			sh->paused[rank] = clock;
			while (sh->resume <= phase && sh->resume >= 0 && ps_now_s() - t0 < 120)
				tu_sleep_ms(10);
			sh->paused[rank] = -1;
			if (sh->resume < 0) {
				ps_client_free(c);
				return 0;
			}
			if (sh->resume <= phase) {
				snprintf(sh->why[rank], sizeof(sh->why[rank]), "never released");
				return 6;
			}
			phase++;
		}
		int rc = push_tables(c, rank, clock);
		if (rc) {
			snprintf(sh->why[rank], sizeof(sh->why[rank]), "row push %d: %s", clock,
				 ps_client_error(c));
			return 3;
		}
		for (int i = 0; i < NDENSE; i++)
			gd[i] = dense_grad(rank, clock, i);
		struct ps_tensor g = { "a", gd, NDENSE, 0 }, w = { "a", wd, NDENSE, 0 };
		int64_t id = ps_client_push(c, (uint64_t)clock, &g, 1, PS_PUSH_END_CLOCK);
		if (id < 0 || ps_client_wait(c, id)) {
			snprintf(sh->why[rank], sizeof(sh->why[rank]), "push %d: %s", clock,
				 ps_client_error(c));
			return 3;
		}
		sh->last_ack[rank] = ps_now_s();
		id = ps_client_pull(c, sync_mode ? (uint64_t)clock + 1 : 0, &w, 1);
		if (id < 0 || ps_client_wait(c, id)) {
			snprintf(sh->why[rank], sizeof(sh->why[rank]), "pull %d: %s", clock,
				 ps_client_error(c));
			return 4;
		}
		if (sync_mode) {
			/* the rows this worker pushed, after the clock: exact */
			oracle_clock_sync(o, clock);
			for (int t = 0; t < 2; t++) {
				uint64_t ids[K];
				float rows[K * DE];
				for (int j = 0; j < K; j++)
					ids[j] = row_id(t, rank, clock, j);
				if (ps_client_pull_rows(c, t ? "f" : "e", (uint64_t)clock + 1, ids, K,
							rows)) {
					snprintf(sh->why[rank], sizeof(sh->why[rank]), "row pull %d: %s",
						 clock, ps_client_error(c));
					return 4;
				}
				if (oracle_check(o, t, ids, K, rows, sh->why[rank],
						 sizeof(sh->why[rank])))
					return 7;
			}
		}
		sh->clock[rank] = clock + 1;
		if (pace)
			tu_sleep_ms(pace);
	}
	sh->done[rank] = 1;
	ps_client_free(c);
	free(o);
	return 0;
}

static pid_t start_worker(int rank, int nc)
{
	pid_t pid = fork();

	if (pid == 0) {
		int rc = worker(rank, nc);
		sh->exited[rank] = 1;
		_exit(rc);
	}
	return pid;
}

/* Waits for both workers; fails naming the first that failed with a
 * reason (one killed because the other failed has none). */
static void wait_workers(pid_t *w)
{
	int st[NWORKERS], bad = -1;

	for (int r = 0; r < NWORKERS; r++) {
		st[r] = tu_wait_child(w[r]);
		if (st[r] && (bad < 0 || (!sh->why[bad][0] && sh->why[r][0])))
			bad = r;
	}
	ck_assert_msg(bad < 0, "worker %d exited with %d: %s (logs in %s)", bad,
		      bad < 0 ? 0 : st[bad], bad < 0 ? "" : sh->why[bad], logdir);
}

/* ---- faults ---- */

static int nft_ok = -1;
static void nft(const char *cmd)
{
	if (system(cmd) != 0)
		fprintf(stderr, "it_replica_rows: '%s' failed\n", cmd);
}

static int partition_possible(void)
{
	if (nft_ok < 0)
		nft_ok = geteuid() == 0 &&
			 system("nft add table inet ps_replrows_test 2>/dev/null") == 0 &&
			 system("nft add chain inet ps_replrows_test out '{ type filter hook output "
				"priority 0; }' 2>/dev/null") == 0;
	return nft_ok;
}

static void partition(int port, int on)
{
	char cmd[256];

	if (on) {
		snprintf(cmd, sizeof(cmd), "nft add rule inet ps_replrows_test out tcp dport %d drop; "
			 "nft add rule inet ps_replrows_test out tcp sport %d drop", port, port);
	} else {
		snprintf(cmd, sizeof(cmd), "nft delete table inet ps_replrows_test");
		nft_ok = -1;
	}
	nft(cmd);
}

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return (*x * 2685821657736338717ull) >> 33;
}

/* Both workers finished, or one ended early (failed: wait_workers says
 * why), or the run passed its deadline (4 minutes at this machine's
 * speed). */
static double run_t0;
static int failed(int r)
{
	return sh->exited[r] && !sh->done[r];
}

static int past_deadline(void)
{
	return ps_now_s() - run_t0 > 240 * tu_time_scale();
}

static int all_done(void)
{
	return (sh->done[0] && sh->done[1]) || failed(0) || failed(1) || past_deadline();
}

/* Runs the workers while faults come every 1.2-2 s (the first a primary;
 * the second, when possible, a 3 s partition of a primary); returns the
 * number of faults, failover times in ft (seconds). */
static int run_with_faults(int nc, double *ft, int *nft_out)
{
	pid_t w[NWORKERS];
	int n = 0, parted = 0;
	uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull | 1;

	run_t0 = ps_now_s();
	for (int r = 0; r < NWORKERS; r++)
		w[r] = start_worker(r, nc);
	*nft_out = 0;
	while (!all_done()) {
		double t1 = ps_now_s(), pause = (1200 + (int)(rnd(&seed) % 800)) / 1000.0;
		while (!all_done() && ps_now_s() - t1 < pause)
			tu_sleep_ms(10);
		if (all_done() || tu_replicas_healthy(&cfg, NSHARDS, 30) < 0)
			break;
		int k = (int)(rnd(&seed) % NSHARDS), p = tu_replica_primary(&cfg, k);
		if (p < 0)
			continue;
		int part = !parted && n == 1 && partition_possible();
		int victim = part || n == 0 ? p : (int)(rnd(&seed) % 2);
		double t0 = ps_now_s(), tf = 0;
		if (part) {
			parted = 1;
			partition(ports[victim][k], 1);
			while (ps_now_s() - t0 < 3.0 && !all_done()) {
				if (!tf && sh->last_ack[0] > t0 && sh->last_ack[1] > t0)
					tf = ps_now_s() - t0;
				tu_sleep_ms(5);
			}
			partition(ports[victim][k], 0);
			fprintf(stderr, "it_replica_rows: partitioned the primary of shard %d (replica "
				"%d) for %.1f s\n", k, victim, ps_now_s() - t0);
		} else {
			kill(srv[victim][k], SIGKILL);
			tu_wait_child(srv[victim][k]);
			tu_sleep_ms(200 + (int)(rnd(&seed) % 500));
			srv[victim][k] = tu_start_replica(cfg_path, logdir, k, victim, 0);
		}
		n++;
		if (victim == p) {
			/* failover: until every worker has an ack after the fault */
			while (!all_done() && (sh->last_ack[0] < t0 || sh->last_ack[1] < t0) &&
			       ps_now_s() - t0 < 60)
				tu_sleep_ms(5);
			if (tf)
				ft[(*nft_out)++] = tf;
			else if (!all_done())
				ft[(*nft_out)++] = ps_now_s() - t0;
		}
	}
	for (int r = 0; r < NWORKERS; r++)
		if (!sh->exited[r] && !sh->done[r] && (failed(1 - r) || past_deadline())) {
			if (!failed(1 - r))
				snprintf(sh->why[r], sizeof(sh->why[r]), "still at clock %d after %.0f s",
					 sh->clock[r], ps_now_s() - run_t0);
			kill(w[r], SIGKILL);
		}
	wait_workers(w);
	return n;
}

static void report_failovers(const char *what, double *ft, int n)
{
	if (!n) {
		fprintf(stderr, "it_replica_rows: %s: no primary failed\n", what);
		return;
	}
	qsort(ft, (size_t)n, sizeof(*ft), tu_cmp_double);
	fprintf(stderr, "it_replica_rows: %s: %d primary failures, failover (fault to every "
		"worker's next ack) median %.2f s, max %.2f s (replication.timeout_ms %d)\n", what,
		n, ft[n / 2], ft[n - 1], cfg.repl_timeout_ms);
}

/* ---- the checks at the end ---- */

/* Whether the two stats show the same dense state and tables. */
static int pair_same(const struct ps_shard_stats *a, const struct ps_shard_stats *b)
{
	if (a->repl_lsn != b->repl_lsn || a->repl_lag || b->repl_lag ||
	    a->param_checksum != b->param_checksum || a->ntables != NT || b->ntables != NT)
		return 0;
	for (int t = 0; t < NT; t++)
		if (a->tables[t].checksum != b->tables[t].checksum ||
		    a->tables[t].rows != b->tables[t].rows ||
		    a->tables[t].version != b->tables[t].version ||
		    a->tables[t].admitted != b->tables[t].admitted ||
		    a->tables[t].evicted != b->tables[t].evicted ||
		    a->tables[t].expired != b->tables[t].expired)
			return 0;
	return 1;
}

/* The two processes of every shard hold the same tables and dense state:
 * waits (10 s) until the backup confirmed everything and the two agree
 * (table h's rows expire meanwhile: a batch may come between the two
 * reads), then compares (with need_rows, e, f and g must hold rows). */
static void check_pairs_equal(int need_rows)
{
	for (int k = 0; k < NSHARDS; k++) {
		struct ps_shard_stats a, b;
		double t0 = ps_now_s();
		int same = 0;
		while (!same && ps_now_s() - t0 < 10 * tu_time_scale()) {
			ck_assert_int_eq(tu_replica_stats(&cfg, k, 0, 0, &a), 0);
			ck_assert_int_eq(tu_replica_stats(&cfg, k, 1, 0, &b), 0);
			same = pair_same(&a, &b);
			if (!same)
				tu_sleep_ms(50);
		}
		ck_assert_msg(a.repl_lsn == b.repl_lsn, "shard %d: batches %llu and %llu after 10 s",
			      k, (unsigned long long)a.repl_lsn, (unsigned long long)b.repl_lsn);
		ck_assert_uint_eq(a.param_checksum, b.param_checksum);
		ck_assert_int_eq(a.ntables, NT);
		ck_assert_int_eq(b.ntables, NT);
		for (int t = 0; t < NT; t++) {
			ck_assert_str_eq(a.tables[t].name, b.tables[t].name);
			ck_assert_msg(same, "shard %d table %s: replica 0 has %llu rows at version %llu "
				      "(checksum %016llx; admitted %llu, evicted %llu, expired %llu), "
				      "replica 1 %llu at %llu (%016llx; %llu, %llu, %llu)", k,
				      a.tables[t].name, (unsigned long long)a.tables[t].rows,
				      (unsigned long long)a.tables[t].version,
				      (unsigned long long)a.tables[t].checksum,
				      (unsigned long long)a.tables[t].admitted,
				      (unsigned long long)a.tables[t].evicted,
				      (unsigned long long)a.tables[t].expired,
				      (unsigned long long)b.tables[t].rows,
				      (unsigned long long)b.tables[t].version,
				      (unsigned long long)b.tables[t].checksum,
				      (unsigned long long)b.tables[t].admitted,
				      (unsigned long long)b.tables[t].evicted,
				      (unsigned long long)b.tables[t].expired);
			if (need_rows && t < 3)
				ck_assert_uint_gt(a.tables[t].rows, 0);
		}
	}
}

/* Each table's epoch (the instant of stamp 0 of its ttl clock, on the
 * wall clock) on the primary of each shard, once the pairs have formed. */
static void read_epochs(double e[NSHARDS][NT])
{
	for (int k = 0; k < NSHARDS; k++) {
		struct ps_shard_stats st;
		int p = tu_replica_primary(&cfg, k);
		ck_assert_int_ge(p, 0);
		ck_assert_int_eq(tu_replica_stats(&cfg, k, p, 0, &st), 0);
		ck_assert_int_eq(st.ntables, NT);
		for (int t = 0; t < NT; t++)
			e[k][t] = st.tables[t].epoch_unix;
	}
}

/* After any number of takeovers, every process's tables keep the first
 * primary's epochs (e0): a state transfer sets the backup's epoch on the
 * wall clock both share, so its delay does not add up along the
 * processes that serve in turn (it did: 0.43 s after six faults). The
 * margin is fixed, whatever the number of faults. */
#define EPOCH_SLACK 0.02
static void check_epochs(double e0[NSHARDS][NT], int faults)
{
	double worst = 0;

	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++) {
			struct ps_shard_stats st;
			ck_assert_int_eq(tu_replica_stats(&cfg, k, r, 0, &st), 0);
			ck_assert_int_eq(st.ntables, NT);
			for (int t = 0; t < NT; t++) {
				double d = st.tables[t].epoch_unix - e0[k][t];
				ck_assert_msg(fabs(d) <= EPOCH_SLACK, "shard %d replica %d table %s: "
					      "epoch %.6f, %+.6f s from the first primary's after %d "
					      "faults (logs in %s)", k, r, st.tables[t].name,
					      st.tables[t].epoch_unix, d, faults, logdir);
				if (fabs(d) > worst)
					worst = fabs(d);
			}
		}
	fprintf(stderr, "it_replica_rows: after %d faults the tables' epochs are the first "
		"primary's within %.6f s (at most %.3f allowed)\n", faults, worst, EPOCH_SLACK);
}

/* Every row of e and f and every element of a, pulled by a new process of
 * rank 0, against the oracle of nc clocks. */
static void check_final(int nc)
{
	char err[512], why[256];
	struct ps_client *c = NULL;
	struct oracle *o = calloc(1, sizeof(*o));
	static uint64_t ids[NIDS];
	static float rows[NIDS * DE];
	float wd[NDENSE];
	struct ps_tensor w = { "a", wd, NDENSE, 0 };

	ck_assert_ptr_nonnull(o);
	oracle_run(o, nc);
	for (int i = 0; i < 50 && ps_client_init(&c, &cfg, 0, err, sizeof(err)); i++)
		tu_sleep_ms(100);
	ck_assert_msg(c, "%s", err);
	for (int i = 0; i < NIDS; i++)
		ids[i] = (uint64_t)i;
	for (int t = 0; t < 2; t++) {
		ck_assert_msg(ps_client_pull_rows(c, t ? "f" : "e", 0, ids, NIDS, rows) == 0, "%s",
			      ps_client_error(c));
		ck_assert_msg(oracle_check(o, t, ids, NIDS, rows, why, sizeof(why)) == 0, "%s", why);
	}
	int64_t id = ps_client_pull(c, 0, &w, 1);
	ck_assert_msg(id >= 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	for (int i = 0; i < NDENSE; i++) {
		double want = i;
		for (int r = 0; r < NWORKERS; r++)
			for (int k = 0; k < nc; k++)
				want -= dense_grad(r, k, i);
		ck_assert_msg((double)wd[i] == want, "a[%d]: %g, the exact sum says %g", i, wd[i],
			      want);
	}
	ps_client_free(c);
	free(o);
}

static void *shared_new(void)
{
	void *p = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	memset(p, 0, sizeof(struct shared));
	for (int i = 0; i < NPHASE; i++)
		((struct shared *)p)->stop_at[i] = -1;
	return p;
}

static void faults_case(const char *mode)
{
	double ft[64], e0[NSHARDS][NT];
	int nf, nc = nclocks();

	sh = shared_new();
	write_config(mode, 0, 500);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	read_epochs(e0);
	double t0 = ps_now_s();
	int n = run_with_faults(nc, ft, &nf);
	fprintf(stderr, "it_replica_rows: %s: %d clocks, %d faults in %.1f s\n", mode, nc, n,
		ps_now_s() - t0);
	ck_assert_int_ge(n, 1);
	ck_assert_int_ge(nf, 1);
	report_failovers(mode, ft, nf);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 30) >= 0, "the pairs did not form again (logs in %s)", logdir);
	check_final(nc);
	check_pairs_equal(1);
	check_epochs(e0, n);
	stop_all();
	tu_rmtree(logdir);
	munmap(sh, sizeof(*sh));
}

/* Sync: kill -9 of random primaries and backups (restarted), one partition
 * of a primary; every row and weight exact after every clock and at the
 * end, both processes of each shard equal. */
START_TEST(test_rows_sync_faults_exact)
{
	faults_case("sync");
}
END_TEST

/* Async: the same faults; every acknowledged row push applied exactly
 * once (every push is acknowledged: requests wait out the failovers). */
START_TEST(test_rows_async_faults_exact)
{
	faults_case("async");
}
END_TEST

/* A row push is acknowledged only once the backup has it: with both
 * backups stopped (SIGSTOP; replication.timeout_ms 5000, so no primary
 * gives them up) the push stays unacknowledged, and is acknowledged once
 * they run again; then the rows are exact on both processes. */
START_TEST(test_rows_ack_waits_for_backup)
{
	char err[512], why[256];
	struct ps_client *c = NULL;
	struct oracle *o = calloc(1, sizeof(*o));
	uint64_t ids[K];
	float g[K * DE], rows[K * DE];
	int b[NSHARDS];

	sh = shared_new();
	write_config("async", 0, 5000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	ck_assert_int_eq(ps_client_init(&c, &cfg, 0, err, sizeof(err)), 0);
	for (int j = 0; j < K; j++) {
		ids[j] = row_id(0, 0, 0, j);
		for (int d = 0; d < DE; d++)
			g[j * DE + d] = row_grad(0, 0, 0, j, d);
	}
	for (int k = 0; k < NSHARDS; k++) {
		b[k] = 1 - tu_replica_primary(&cfg, k);
		ck_assert_int_le(b[k], 1);
		kill(srv[b[k]][k], SIGSTOP);
	}
	int64_t id = ps_client_push_rows_async(c, "e", 0, ids, K, g, 0);
	ck_assert_int_gt(id, 0);
	int rc = ps_client_wait_timeout(c, id, 1.0);
	for (int k = 0; k < NSHARDS; k++)
		kill(srv[b[k]][k], SIGCONT);
	ck_assert_msg(rc == PS_ETIMEDOUT, "the row push was answered (%s) while the backups were "
		      "stopped", rc ? ps_strerror(rc) : "acknowledged");
	ck_assert_msg(ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	oracle_push_async(o, 0, 0);
	ck_assert_msg(ps_client_pull_rows(c, "e", 0, ids, K, rows) == 0, "%s", ps_client_error(c));
	ck_assert_msg(oracle_check(o, 0, ids, K, rows, why, sizeof(why)) == 0, "%s", why);
	ps_client_free(c);
	for (int k = 0; k < NSHARDS; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(tu_replica_stats(&cfg, k, 1 - b[k], 0, &st), 0);
		ck_assert_uint_eq(st.repl_failovers, 0);
	}
	check_pairs_equal(0);
	stop_all();
	free(o);
	tu_rmtree(logdir);
	munmap(sh, sizeof(*sh));
}
END_TEST

/* ---- a primary that steps down with a clock's rows waiting ---- */

/* Rank's rows of table e for clock c pushed with cl (not waited for). */
static int64_t push_e(struct ps_client *cl, int rank, int c)
{
	uint64_t ids[K];
	float g[K * DE];

	for (int j = 0; j < K; j++) {
		ids[j] = row_id(0, rank, c, j);
		for (int d = 0; d < DE; d++)
			g[j * DE + d] = row_grad(0, rank, c, j, d);
	}
	return ps_client_push_rows_async(cl, "e", (uint64_t)c, ids, K, g, 0);
}

/* Every rank's dense push ending clock c, then waited for (a sync push is
 * acknowledged once its clock's sum is applied). */
static void end_clock(struct ps_client **cl, int c)
{
	static float gd[NWORKERS][NDENSE];
	int64_t id[NWORKERS];

	for (int r = 0; r < NWORKERS; r++) {
		struct ps_tensor t = { "a", gd[r], NDENSE, 0 };
		for (int i = 0; i < NDENSE; i++)
			gd[r][i] = dense_grad(r, c, i);
		id[r] = ps_client_push(cl[r], (uint64_t)c, &t, 1, PS_PUSH_END_CLOCK);
	}
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_msg(id[r] > 0 && ps_client_wait(cl[r], id[r]) == 0, "rank %d clock %d: %s",
			      r, c, ps_client_error(cl[r]));
}

/* Until process r of shard 0 serves (state 3); 0, or -1 after limit_s. */
static int wait_serving(int r, double limit_s)
{
	struct ps_shard_stats st;

	for (double t0 = ps_now_s(); ps_now_s() - t0 < limit_s * tu_time_scale(); tu_sleep_ms(50))
		if (tu_replica_stats(&cfg, 0, r, -1, &st) == 0 && st.repl_state == 3)
			return 0;
	return -1;
}

/* A primary that stops serving forgets the clocks whose rows wait for a
 * worker (sync): rank 0 pushes clock 0's rows of e while rank 1 holds back;
 * shard 0's primary is stopped (SIGSTOP) past replication.timeout_ms, its
 * backup takes over, and the old primary, let go (SIGCONT), steps down and
 * joins as the backup (a state transfer); clock 0 completes on the new
 * primary (rank 0's push sent again), which is then killed -9, so the old
 * primary serves again; both ranks push clock 1. Every row of e is its
 * exact sum at version 2. A primary that kept its waiting clock 0 after
 * stepping down kept it at the head of the table's pending clocks, where
 * clock 1's rows queued behind it and were never applied (nor
 * acknowledged). */
START_TEST(test_rows_step_down_drops_waiting_clock)
{
	char err[512], why[256];
	struct ps_client *c[NWORKERS] = { NULL };
	struct oracle *o = calloc(1, sizeof(*o));
	int64_t q0;
	int p;

	ck_assert_ptr_nonnull(o);
	sh = shared_new();
	write_config("sync", 0, 1000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs "
		      "in %s)", logdir);
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
	p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	q0 = push_e(c[0], 0, 0); /* waits for rank 1's */
	ck_assert_int_gt(q0, 0);
	ck_assert_int_eq(ps_client_wait_timeout(c[0], q0, 0.3), PS_ETIMEDOUT);
	kill(srv[p][0], SIGSTOP);
	int took = wait_serving(1 - p, 10);
	kill(srv[p][0], SIGCONT);
	ck_assert_msg(took == 0, "shard 0's backup did not take over from its stopped primary "
		      "(logs in %s)", logdir);
	/* the old primary steps down and joins as the backup */
	ck_assert_msg(tu_wait_pair(&cfg, 0, 20) == 1 - p, "shard 0's old primary did not join "
		      "back as the backup (logs in %s)", logdir);
	int64_t q1 = push_e(c[1], 1, 0);
	ck_assert_int_gt(q1, 0);
	ck_assert_msg(ps_client_wait(c[0], q0) == 0, "%s", ps_client_error(c[0]));
	ck_assert_msg(ps_client_wait(c[1], q1) == 0, "%s", ps_client_error(c[1]));
	end_clock(c, 0);
	oracle_clock_sync(o, 0);
	/* the new primary killed: the old one serves again */
	kill(srv[1 - p][0], SIGKILL);
	tu_wait_child(srv[1 - p][0]);
	srv[1 - p][0] = 0;
	ck_assert_msg(wait_serving(p, 10) == 0, "shard 0's old primary did not serve again (logs "
		      "in %s)", logdir);
	int64_t q[NWORKERS];
	for (int r = 0; r < NWORKERS; r++)
		q[r] = push_e(c[r], r, 1);
	for (int r = 0; r < NWORKERS; r++) {
		ck_assert_int_gt(q[r], 0);
		int rc = ps_client_wait_timeout(c[r], q[r], 10.0 * tu_time_scale());
		ck_assert_msg(rc == 0, "rank %d's rows of clock 1 on the old primary serving again: %s "
			      "(logs in %s)", r, rc == PS_ETIMEDOUT ? "not acknowledged within 10 s"
			      : ps_client_error(c[r]), logdir);
	}
	end_clock(c, 1);
	oracle_clock_sync(o, 1);
	for (int r = 0; r < NWORKERS; r++)
		for (int k = 0; k < 2; k++) {
			uint64_t ids[K];
			float rows[K * DE];
			for (int j = 0; j < K; j++)
				ids[j] = row_id(0, r, k, j);
			ck_assert_msg(ps_client_pull_rows(c[0], "e", 2, ids, K, rows) == 0, "%s",
				      ps_client_error(c[0]));
			ck_assert_msg(oracle_check(o, 0, ids, K, rows, why, sizeof(why)) == 0,
				      "rank %d's rows of clock %d after the old primary served again: "
				      "%s (logs in %s)", r, k, why, logdir);
		}
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	free(o);
	tu_rmtree(logdir);
	munmap(sh, sizeof(*sh));
}
END_TEST

/* ---- a backup's stamps after the state transfer ---- */

/* The rows' stamps a backup receives in a state transfer are its
 * primary's: rows pushed when the primary's table clock read 6 s (ttl 8 s),
 * the backup restarted (kill -9) and given the state, then the primary
 * killed: the new primary keeps them until the clock reads 14, as the old
 * one would have. (Stamps counted from the oldest row's age instead of the
 * primary's clock make them 6 s older: gone at 8.) */
START_TEST(test_rows_backup_keeps_primary_stamps)
{
	char yaml[1024], err[512];
	struct ps_client *c = NULL;
	struct ps_shard_stats st;
	uint64_t ids[8];
	float g[8 * 4], rows[8 * 4];
	double t0;
	int port0 = low_free_port(0), port1 = low_free_port(1), p;

	strcpy(logdir, "/tmp/ps-test-replrows-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n  replicas: 1\n"
		 "  workers: 1\nreplication:\n  timeout_ms: 500\nconsistency:\n  mode: async\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "limits:\n  connect_timeout_ms: 2000\n  request_timeout_ms: 20000\n"
		 "model:\n  tensors:\n    - {name: a, shape: [8]}\n  embeddings:\n"
		 "    - {name: t, dim: 4, init: zeros, optimizer: sgd, lr: 1, ttl: 8}\n",
		 tu_transport_yaml(), tu_host(), port0, tu_host(), port1);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	t0 = ps_now_s(); /* the tables' clocks start about now */
	for (int r = 0; r < 2; r++)
		srv[r][0] = tu_start_replica(cfg_path, logdir, 0, r, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, 1, 20) >= 0, "the pair did not form (logs in %s)",
		      logdir);
	p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	while (ps_now_s() - t0 < 6.0) /* the table's clock at 6 s */
		tu_sleep_ms(50);
	for (int j = 0; j < 8; j++) {
		ids[j] = 1000 + (uint64_t)j * 7919;
		for (int d = 0; d < 4; d++)
			g[j * 4 + d] = 1.0f + (float)d;
	}
	ck_assert_int_eq(ps_client_init(&c, &cfg, 0, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_push_rows(c, "t", 0, ids, 8, g, 0) == 0, "%s", ps_client_error(c));
	ps_client_free(c);
	c = NULL;
	/* the backup restarted: it gets the rows in the state transfer */
	kill(srv[1 - p][0], SIGKILL);
	tu_wait_child(srv[1 - p][0]);
	srv[1 - p][0] = tu_start_replica(cfg_path, logdir, 0, 1 - p, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, 1, 20) >= 0, "the pair did not form again (logs "
		      "in %s)", logdir);
	kill(srv[p][0], SIGKILL);
	tu_wait_child(srv[p][0]);
	srv[p][0] = 0;
	while (tu_replica_primary(&cfg, 0) != 1 - p && ps_now_s() - t0 < 30 * tu_time_scale())
		tu_sleep_ms(50);
	ck_assert_msg(tu_replica_primary(&cfg, 0) == 1 - p, "the backup did not take over (logs "
		      "in %s)", logdir);
	if (ps_now_s() - t0 >= 12.0) { /* a ttl is not stretched by PS_TEST_TIME_SCALE */
		tu_skip("test_rows_backup_keeps_primary_stamps: the takeover was over only %.1f s "
			"after the start, past the 12 s where the rows are due to be kept and the "
			"wrong stamps' rows gone (a slow machine)", ps_now_s() - t0);
		ck_assert_int_eq(tu_stop_server(srv[1 - p][0]), 0);
		srv[1 - p][0] = 0;
		unlink(cfg_path);
		tu_rmtree(logdir);
		return;
	}
	while (ps_now_s() - t0 < 10.0) /* past 8 s plus a tick of the expiry */
		tu_sleep_ms(50);
	ck_assert_int_eq(ps_client_init(&c, &cfg, 0, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_pull_rows(c, "t", 0, ids, 8, rows) == 0, "%s", ps_client_error(c));
	for (int i = 0; i < 8 * 4; i++)
		ck_assert_msg(rows[i] == -g[i], "row %d after the takeover, %.1f s after it was "
			      "pushed at the primary's 6 s (ttl 8): %g, %g expected (expired early: "
			      "the backup's stamps are not its primary's)", i / 4, ps_now_s() - t0 - 6,
			      rows[i], -g[i]);
	ps_client_free(c);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, 1 - p, -1, &st), 0);
	ck_assert_int_eq(st.ntables, 1);
	ck_assert_uint_eq(st.tables[0].rows, 8);
	ck_assert_uint_eq(st.tables[0].expired, 0);
	ck_assert_int_eq(tu_stop_server(srv[1 - p][0]), 0);
	srv[1 - p][0] = 0;
	unlink(cfg_path);
	tu_rmtree(logdir);
}
END_TEST

/* ---- one row push larger than a batch's groups could be one by one ---- */

/* A push of 100,000 rows of one table reaches the backup as one batch of
 * one group (the rows of a table at one stamp gathered together): the
 * backup applies it, so the pair counts the same batches and bytes, and
 * the tables are the same. (A group per row would make the batch's
 * metadata about 1 MB, past limits.max_meta_bytes, 256 KiB here: the
 * backup closes the link and the state is transferred again.) */
START_TEST(test_rows_big_push_one_batch)
{
	enum { N = 100000, D = 4 };
	char yaml[1024], err[512];
	struct ps_client *c = NULL;
	struct ps_shard_stats a, b;
	uint64_t *ids = malloc(sizeof(uint64_t) * N), probe[3] = { 0, N / 2, N - 1 };
	float *g = malloc(sizeof(float) * N * D), rows[3 * D];
	int port0 = low_free_port(0), port1 = low_free_port(1), p, same = 0;
	double t0;

	ck_assert_ptr_nonnull(ids);
	ck_assert_ptr_nonnull(g);
	strcpy(logdir, "/tmp/ps-test-replrows-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n  replicas: 1\n"
		 "  workers: 1\nreplication:\n  timeout_ms: 2000\nconsistency:\n  mode: async\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "limits:\n  connect_timeout_ms: 2000\n  request_timeout_ms: 20000\n"
		 "  max_meta_bytes: 256KiB\n"
		 "model:\n  tensors:\n    - {name: a, shape: [8]}\n  embeddings:\n"
		 "    - {name: t, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n",
		 tu_transport_yaml(), tu_host(), port0, tu_host(), port1, D);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	for (int r = 0; r < 2; r++)
		srv[r][0] = tu_start_replica(cfg_path, logdir, 0, r, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, 1, 20) >= 0, "the pair did not form (logs in %s)",
		      logdir);
	p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	for (int i = 0; i < N; i++) {
		ids[i] = (uint64_t)i * 7919 + 1;
		for (int d = 0; d < D; d++)
			g[i * D + d] = (float)((i + d) % 5 + 1);
	}
	ck_assert_int_eq(ps_client_init(&c, &cfg, 0, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_push_rows(c, "t", 0, ids, N, g, 0) == 0, "%s", ps_client_error(c));
	for (int j = 0; j < 3; j++)
		probe[j] = ids[probe[j]];
	ck_assert_msg(ps_client_pull_rows(c, "t", 0, probe, 3, rows) == 0, "%s",
		      ps_client_error(c));
	for (int j = 0; j < 3; j++)
		for (int d = 0; d < D; d++) {
			uint64_t i = (probe[j] - 1) / 7919;
			ck_assert_msg(rows[j * D + d] == -(float)((i + d) % 5 + 1), "row %" PRIu64
				      " float %d: %g", probe[j], d, rows[j * D + d]);
		}
	ps_client_free(c);
	/* the backup has the batch once the push is acknowledged; the figures
	 * are read until they agree (10 s at most) */
	t0 = ps_now_s();
	while (!same && ps_now_s() - t0 < 10 * tu_time_scale()) {
		ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
		ck_assert_int_eq(tu_replica_stats(&cfg, 0, 1 - p, -1, &b), 0);
		same = a.repl_batches == b.repl_batches && a.repl_bytes == b.repl_bytes &&
		       a.tables[0].checksum == b.tables[0].checksum;
		if (!same)
			tu_sleep_ms(50);
	}
	ck_assert_msg(same, "the primary sent %" PRIu64 " batches (%" PRIu64 " bytes), the backup "
		      "applied %" PRIu64 " (%" PRIu64 " bytes); table checksums %016" PRIx64 " and %016"
		      PRIx64 " (logs in %s)", a.repl_batches, a.repl_bytes, b.repl_batches,
		      b.repl_bytes, a.tables[0].checksum, b.tables[0].checksum, logdir);
	ck_assert_uint_ge(a.repl_bytes, (uint64_t)N * (12 + 4 * D));
	ck_assert_uint_eq(a.tables[0].rows, N);
	ck_assert_uint_eq(b.tables[0].rows, N);
	ck_assert_uint_eq(a.repl_failovers, 0);
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(tu_stop_server(srv[r][0]), 0);
		srv[r][0] = 0;
	}
	free(ids);
	free(g);
	unlink(cfg_path);
	tu_rmtree(logdir);
}
END_TEST

/* ---- a takeover in the middle of an incremental checkpoint chain ---- */

/* Waits (30 s) until both workers pause before clock c. */
static void wait_paused(int c)
{
	double t0 = ps_now_s();

	while ((sh->paused[0] != c || sh->paused[1] != c) && ps_now_s() - t0 < 30 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(sh->paused[0] == c && sh->paused[1] == c, "the workers did not reach clock "
		      "%d (at %d and %d: %s / %s)", c, sh->clock[0], sh->clock[1], sh->why[0],
		      sh->why[1]);
}

/* Asks replica r of shard k for a checkpoint; its file must be the full one
 * (delta 0) or incremental checkpoint delta. */
static void checkpoint_is(int k, int r, int delta, struct ps_shard_stats *st)
{
	char want[64];
	const char *base;

	ck_assert_int_eq(tu_replica_stats(&cfg, k, r, 1, st), 0);
	ck_assert_msg(st->checkpoint_status == 0, "shard %d replica %d: checkpoint failed: %s", k, r,
		      st->checkpoint_error);
	base = strrchr(st->checkpoint_path, '/');
	base = base ? base + 1 : st->checkpoint_path;
	snprintf(want, sizeof(want), "shard-%d%s.ckpt", k, r ? "-r1" : "");
	if (delta)
		snprintf(want + strlen(want), sizeof(want) - strlen(want), ".delta-%d", delta);
	ck_assert_msg(!strcmp(base, want), "shard %d replica %d wrote %s, expected %s", k, r, base,
		      want);
}

START_TEST(test_rows_takeover_mid_checkpoint_chain)
{
	struct ps_shard_stats st, after;
	pid_t w[NWORKERS];
	int nc = 4 * 30, p, q;

	sh = shared_new();
	for (int i = 0; i < 3; i++)
		sh->stop_at[i] = 30 * (i + 1);
	/* a longer replication timeout than the fault cases': a slow build
	 * (sanitizers) must not see a pair change roles on its own here,
	 * which would start a process's chain afresh (a state transfer makes
	 * its next checkpoint a full one) */
	write_config("sync", 1, 2000);
	start_all();
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 20) >= 0, "the pairs did not form (logs in %s)", logdir);
	for (int r = 0; r < NWORKERS; r++)
		w[r] = start_worker(r, nc);
	/* the chain: full, then delta-1, on both processes of both shards */
	for (int i = 0; i < 2; i++) {
		wait_paused(30 * (i + 1));
		for (int k = 0; k < NSHARDS; k++)
			for (int r = 0; r < 2; r++)
				checkpoint_is(k, r, i, &st);
		sh->resume = i + 1;
	}
	/* the primary of shard 0 killed at clock 90; the backup serves alone */
	wait_paused(90);
	p = tu_replica_primary(&cfg, 0);
	ck_assert_int_ge(p, 0);
	q = 1 - p;
	kill(srv[p][0], SIGKILL);
	tu_wait_child(srv[p][0]);
	srv[p][0] = 0;
	sh->resume = 3;
	double t0 = ps_now_s();
	while (tu_replica_primary(&cfg, 0) != q && ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(20);
	ck_assert_int_eq(tu_replica_primary(&cfg, 0), q);
	wait_workers(w);
	/* the new primary's next checkpoint continues its chain, taken over
	 * in its middle: delta-2 */
	checkpoint_is(0, q, 2, &st);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, q, 0, &st), 0);
	ck_assert_int_eq(st.ntables, NT);
	for (int t = 0; t < 3; t++)
		ck_assert_uint_eq(st.tables[t].version, (uint64_t)nc);
	/* its partner back: it joins the new primary, gets the tables whole
	 * (equal checksums) and its next checkpoint is a full one */
	srv[p][0] = tu_start_replica(cfg_path, logdir, 0, p, 0);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 30) >= 0, "the pair did not form again (logs in %s)", logdir);
	ck_assert_int_eq(tu_replica_primary(&cfg, 0), q);
	check_pairs_equal(1);
	checkpoint_is(0, p, 0, &after);
	/* both killed; the new primary restarted from its chain (full,
	 * delta-1, and delta-2 written after the takeover): the tables bit for
	 * bit */
	for (int r = 0; r < 2; r++) {
		kill(srv[r][0], SIGKILL);
		tu_wait_child(srv[r][0]);
		srv[r][0] = 0;
	}
	srv[q][0] = tu_start_replica(cfg_path, logdir, 0, q, 0);
	t0 = ps_now_s();
	while (tu_replica_stats(&cfg, 0, q, 0, &after) && ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(50);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, q, 0, &after), 0);
	ck_assert_int_eq(after.ntables, NT);
	/* e, f, g (h's rows expire meanwhile: ttl 1 s) */
	ck_assert_uint_eq(after.param_checksum, st.param_checksum);
	for (int t = 0; t < 3; t++) {
		ck_assert_msg(after.tables[t].checksum == st.tables[t].checksum &&
			      after.tables[t].rows == st.tables[t].rows &&
			      after.tables[t].version == st.tables[t].version,
			      "table %s: %llu rows at version %llu (checksum %016llx) after the "
			      "restart, %llu at %llu (%016llx) before", st.tables[t].name,
			      (unsigned long long)after.tables[t].rows,
			      (unsigned long long)after.tables[t].version,
			      (unsigned long long)after.tables[t].checksum,
			      (unsigned long long)st.tables[t].rows,
			      (unsigned long long)st.tables[t].version,
			      (unsigned long long)st.tables[t].checksum);
		ck_assert_uint_gt(after.tables[t].rows, 0);
	}
	stop_all();
	tu_rmtree(logdir);
	munmap(sh, sizeof(*sh));
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("replica_rows");
	TCase *tc = tcase_create("processes");

	tcase_set_timeout(tc, 600);
	TU_ADD(tc, test_rows_ack_waits_for_backup);
	TU_ADD(tc, test_rows_step_down_drops_waiting_clock);
	TU_ADD(tc, test_rows_backup_keeps_primary_stamps);
	TU_ADD(tc, test_rows_big_push_one_batch);
	TU_ADD(tc, test_rows_takeover_mid_checkpoint_chain);
	TU_ADD(tc, test_rows_sync_faults_exact);
	TU_ADD(tc, test_rows_async_faults_exact);
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
