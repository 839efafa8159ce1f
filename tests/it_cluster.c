/* it_cluster.c - integration tests with real ps-server processes and real
 * client processes on loopback: exact BSP sums, the SSP staleness bound,
 * refused handshakes, hostile frames. */
#include <check.h>
#include <inttypes.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "ps_time.h"
#include "codec.h"
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_client_int.h" /* a push built, not sent: its encoded slices */
#include "ps_err.h"
#include "shardmap.h"
#include "test_util.h"

#define NCLOCKS 50

/* Connects, retrying while the servers start (up to 10 s). */
static struct ps_client *connect_retry(const struct ps_config *cfg, int rank, char *err, size_t n)
{
	struct ps_client *c = NULL;

	for (int i = 0; i < 100; i++) {
		int rc = ps_client_init(&c, cfg, rank, err, n);
		if (rc == 0)
			return c;
		if (rc != -ECONNREFUSED)
			return NULL;
		tu_sleep_ms(100);
	}
	return NULL;
}

/* Two shards, slices small enough that every tensor spans both. */
static void cluster_yaml(char *buf, size_t n, int p0, int p1, int workers, const char *mode,
			 const char *extra)
{
	snprintf(buf, n,
		 "%s"
		 "cluster:\n  servers: [%s:%d, %s:%d]\n  workers: %d\n"
		 "consistency:\n  mode: %s\n%s"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000], init: arange}\n"
		 "    - {name: b, shape: [17, 33], init: arange}\n"
		 "    - {name: c, shape: [5], init: arange}\n"
		 "log:\n  level: warn\n",
		 tu_transport_yaml(), tu_host(), p0, tu_host(), p1, workers, mode, extra);
}

/* Writes a config from cluster_yaml on two free ports into a temporary
 * file (its name into path), loads it into cfg and starts both shards. */
static void start_cluster(char *path, struct ps_config *cfg, int workers, const char *mode,
			  const char *extra, pid_t srv[2])
{
	char yaml[2048], err[512];

	cluster_yaml(yaml, sizeof(yaml), tu_free_port(), tu_free_port(), workers, mode, extra);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
}

/* Stops both shards (each must exit 0) and removes the config file. */
static void stop_cluster(const char *path, const pid_t srv[2])
{
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}

static double now_ms(void)
{
	return ps_now_s() * 1e3;
}

/* Gradient and weight buffers for the three tensors of cluster_yaml. */
static void tensors_new(const struct ps_config *cfg, struct ps_tensor *g, struct ps_tensor *w)
{
	for (int t = 0; t < 3; t++) {
		g[t] = (struct ps_tensor){ cfg->tensors[t].name, malloc(cfg->tensors[t].count * 4),
					   cfg->tensors[t].count, 0 };
		w[t] = (struct ps_tensor){ cfg->tensors[t].name, malloc(cfg->tensors[t].count * 4),
					   cfg->tensors[t].count, 0 };
	}
}

/* Integer gradient of worker rank at clock for element i. */
static float grad_value(int rank, int clock, int t, int64_t i)
{
	return (float)((rank + 1) * (int)((clock + i + t) % 7 - 3));
}

/* The three gradient tensors of worker rank at clock. */
static void fill_grads(struct ps_tensor *g, int rank, int clock)
{
	for (int t = 0; t < 3; t++)
		for (int64_t i = 0; i < g[t].count; i++)
			g[t].data[i] = grad_value(rank, clock, t, i);
}

/* Sync with a worker that leaves: once it has had no connection for
 * limits.idle_timeout_ms the barrier goes on with the other one (its pull is
 * answered, with only its gradient applied); when it connects again it
 * continues at the shard's clock and counts again. Weights stay exactly
 * init minus the gradients that were applied. */
START_TEST(test_sync_worker_leaves_and_rejoins)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];
	/* which ranks pushed each clock */
	int present[12][2] = { { 0 } };

	/* heartbeats every 500 ms keep the waiting worker's connections */
	start_cluster(path, &cfg, 2, "sync", "limits:\n  idle_timeout_ms: 1500\n", srv);
	struct ps_client *c[2];
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	tensors_new(&cfg, g, w);
	for (int clock = 0; clock < 12; clock++) {
		if (clock == 4) { /* rank 1 leaves */
			ps_client_free(c[1]);
			c[1] = NULL;
		}
		if (clock == 8) { /* and comes back: it continues at clock 8 */
			c[1] = connect_retry(&cfg, 1, err, sizeof(err));
			ck_assert_msg(c[1] != NULL, "%s", err);
			ck_assert_uint_eq(ps_client_clock(c[1]), 8);
		}
		int64_t ids[2] = { 0, 0 };
		for (int r = 0; r < 2; r++) {
			if (!c[r])
				continue;
			fill_grads(g, r, clock);
			ids[r] = ps_client_push(c[r], (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
			ck_assert_msg(ids[r] > 0 && ps_client_wait(c[r], ids[r]) == 0, "push %d: %s",
				      clock, ps_client_error(c[r]));
			present[clock][r] = 1;
		}
		double t0 = now_ms();
		int64_t p = ps_client_pull(c[0], (uint64_t)clock + 1, w, 3);
		ck_assert_msg(p > 0 && ps_client_wait(c[0], p) == 0, "pull %d: %s", clock,
			      ps_client_error(c[0]));
		if (clock == 4) /* waited for the drop: 1500 ms plus the 200 ms tick, and slack */
			ck_assert_msg(now_ms() - t0 < 1700 + 2200 * tu_time_scale(),
				      "barrier waited %.0f ms", now_ms() - t0);
	}
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = 0;
			for (int clock = 0; clock < 12; clock++)
				for (int r = 0; r < 2; r++)
					if (present[clock][r])
						sum += grad_value(r, clock, t, i);
			ck_assert_msg((double)w[t].data[i] == (double)(i % 1024) - sum,
				      "%s[%lld] = %g, want %g", w[t].name, (long long)i,
				      (double)w[t].data[i], (double)(i % 1024) - sum);
		}
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c[0]);
	ps_client_free(c[1]);
	stop_cluster(path, srv);
}
END_TEST

/* One step of a sync worker: push its gradients of clock (ending it),
 * then pull version clock + 1; 0 or the error. */
static int sync_step(struct ps_client *c, int rank, int clock, struct ps_tensor *g,
		     struct ps_tensor *w)
{
	fill_grads(g, rank, clock);
	int64_t id = ps_client_push(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
	int rc = id < 0 ? (int)id : ps_client_wait(c, id);
	if (rc)
		return rc;
	id = ps_client_pull(c, (uint64_t)clock + 1, w, 3);
	return id < 0 ? (int)id : ps_client_wait(c, id);
}

/* kill -9 of a worker waiting inside a sync barrier (it pushed clock 3 and
 * waits for the others): the other worker finishes clock 3 at once and
 * clock 4 without it, once the shards drop it after limits.idle_timeout_ms
 * (the killed process's connections close at once). The weights hold
 * exactly what each worker pushed. */
START_TEST(test_worker_killed_in_barrier)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];
	int ready[2];

	start_cluster(path, &cfg, 2, "sync", "limits:\n  idle_timeout_ms: 1000\n", srv);
	ck_assert_int_eq(pipe(ready), 0);
	pid_t kid = fork();
	if (kid == 0) {
		struct ps_client *c1 = connect_retry(&cfg, 1, err, sizeof(err));
		tensors_new(&cfg, g, w);
		for (int clock = 0; c1 && clock < 3; clock++)
			if (sync_step(c1, 1, clock, g, w))
				_exit(1);
		fill_grads(g, 1, 3);
		int64_t id = c1 ? ps_client_push(c1, 3, g, 3, PS_PUSH_END_CLOCK) : -1;
		if (id < 0 || ps_client_wait(c1, id))
			_exit(1);
		(void)!write(ready[1], "x", 1);
		id = ps_client_pull(c1, 4, w, 3); /* blocks: worker 0 has not pushed 3 */
		ps_client_wait(c1, id);
		_exit(2);
	}
	struct ps_client *c0 = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	tensors_new(&cfg, g, w);
	for (int clock = 0; clock < 3; clock++)
		ck_assert_msg(sync_step(c0, 0, clock, g, w) == 0, "clock %d: %s", clock,
			      ps_client_error(c0));
	char x;
	ck_assert_int_eq(read(ready[0], &x, 1), 1);
	/* it is inside the pull once both shards have it: 3 pulls of each
	 * worker before, and this one */
	double deadline = now_ms() + 10000 * tu_time_scale();
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		for (;;) {
			ck_assert_int_eq(ps_client_stats(c0, k, &st), 0);
			if (st.pulls >= 7)
				break;
			ck_assert_msg(now_ms() < deadline, "shard %d: %" PRIu64 " pulls, expected 7", k,
				      st.pulls);
			tu_sleep_ms(5);
		}
		ck_assert_uint_eq(st.pulls, 7);
	}
	/* The shards see the killed worker's connections close after the
	 * kill and drop it once it has been away for limits.idle_timeout_ms:
	 * not sooner than that after t0, and soon after (every 200 ms they
	 * check; the rest is slack for a busy machine). */
	double t0 = now_ms();
	kill(kid, SIGKILL);
	ck_assert_int_eq(tu_wait_child(kid), 128 + SIGKILL);
	ck_assert_msg(sync_step(c0, 0, 3, g, w) == 0, "clock 3: %s", ps_client_error(c0));
	ck_assert_msg(sync_step(c0, 0, 4, g, w) == 0, "clock 4: %s", ps_client_error(c0));
	double took = now_ms() - t0;
	printf("measured: worker killed in a barrier: the other went on after %.0f ms "
	       "(limits.idle_timeout_ms 1000)\n", took);
	ck_assert_msg(took >= 1000 && took < 1000 + 200 + 2300 * tu_time_scale(),
		      "went on after %.0f ms", took);
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = grad_value(0, 4, t, i);
			for (int clock = 0; clock < 4; clock++)
				sum += grad_value(0, clock, t, i) + grad_value(1, clock, t, i);
			ck_assert_msg((double)w[t].data[i] == (double)(i % 1024) - sum,
				      "%s[%lld] = %g, want %g", w[t].name, (long long)i,
				      (double)w[t].data[i], (double)(i % 1024) - sum);
		}
		free(g[t].data);
		free(w[t].data);
	}
	close(ready[0]);
	close(ready[1]);
	ps_client_free(c0);
	stop_cluster(path, srv);
}
END_TEST

/* A pull that waits past limits.request_timeout_ms (the barrier waits for
 * a worker that has not pushed) fails with the reason; the connection it
 * went out on is closed (its queued writes must not outlive the request),
 * the worker reconnects, and once the other worker pushes, the same pull
 * succeeds with exact weights. */
START_TEST(test_request_timeout_then_go_on)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];

	start_cluster(path, &cfg, 2, "sync", "limits:\n  request_timeout_ms: 1000\n", srv);
	struct ps_client *c0 = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	tensors_new(&cfg, g, w);
	fill_grads(g, 0, 0);
	int64_t id = ps_client_push(c0, 0, g, 3, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c0, id) == 0, "%s", ps_client_error(c0));
	double t0 = now_ms();
	id = ps_client_pull(c0, 1, w, 3);
	ck_assert_int_eq(ps_client_wait(c0, id), PS_ETIMEDOUT);
	ck_assert_msg(strstr(ps_client_error(c0), "no answer within 1000 ms"), "%s",
		      ps_client_error(c0));
	ck_assert_msg(now_ms() - t0 < 1100 + 1400 * tu_time_scale(), "failed after %.0f ms",
		      now_ms() - t0);
	struct ps_client *c1 = connect_retry(&cfg, 1, err, sizeof(err));
	ck_assert_msg(c1 != NULL, "%s", err);
	fill_grads(g, 1, 0);
	id = ps_client_push(c1, 0, g, 3, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c1, id) == 0, "%s", ps_client_error(c1));
	id = ps_client_pull(c0, 1, w, 3);
	ck_assert_msg(ps_client_wait(c0, id) == 0, "pull after the timeout: %s",
		      ps_client_error(c0));
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double want = (double)(i % 1024) - grad_value(0, 0, t, i) - grad_value(1, 0, t, i);
			ck_assert_msg((double)w[t].data[i] == want, "%s[%lld] = %g, want %g",
				      w[t].name, (long long)i, (double)w[t].data[i], want);
		}
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c0);
	ps_client_free(c1);
	stop_cluster(path, srv);
}
END_TEST

/* A pull held by the sync barrier for a worker that never connected: the
 * shard says so in its heartbeat replies, and the worker's timeout names
 * the missing worker instead of blaming the shard ("waiting for workers 1
 * of 2 at clock 0 (worker 1 never connected)"). With consistency.staleness
 * 2, which sync ignores: the message must not count clocks as async does. */
START_TEST(test_timeout_names_missing_worker)
{
	char path[64], err[512], extra[160];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];
	double scale = tu_time_scale();

	/* heartbeats every third of the idle timeout: several before the pull
	 * times out */
	snprintf(extra, sizeof(extra), "  staleness: 2\nlimits:\n  request_timeout_ms: %d\n"
		 "  idle_timeout_ms: %d\n",
		 (int)(2000 * scale), (int)(600 * scale));
	start_cluster(path, &cfg, 2, "sync", extra, srv);
	struct ps_client *c0 = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	tensors_new(&cfg, g, w);
	fill_grads(g, 0, 0);
	int64_t id = ps_client_push(c0, 0, g, 3, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c0, id) == 0, "%s", ps_client_error(c0));
	id = ps_client_pull(c0, 1, w, 3);
	ck_assert_int_eq(ps_client_wait(c0, id), PS_ETIMEDOUT);
	ck_assert_msg(strstr(ps_client_error(c0), "is waiting for workers 1 of 2 at clock 0 "
				"(worker 1 never connected)") &&
		      strstr(ps_client_error(c0), "no answer within"), "%s", ps_client_error(c0));
	for (int t = 0; t < 3; t++) {
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c0);
	stop_cluster(path, srv);
}
END_TEST

/* ---- network faults with nftables (root only) ---- */

static char nft_table[32];

/* Runs an nft command; 0 when it succeeded. */
static int nft(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int nft(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	int n = snprintf(cmd, sizeof(cmd), "nft ");

	va_start(ap, fmt);
	vsnprintf(cmd + n, sizeof(cmd) - (size_t)n, fmt, ap);
	va_end(ap);
	strncat(cmd, " 2>/dev/null", sizeof(cmd) - strlen(cmd) - 1);
	return system(cmd) == 0 ? 0 : -1;
}

/* Creates this test's table with an output chain "out": 0 or -1. */
static int nft_table_up(void)
{
	return nft("add table inet %s", nft_table) ||
	       nft("add chain inet %s out '{ type filter hook output priority 0; }'", nft_table)
	       ? -1 : 0;
}

/* Why nftables cannot be used here, or NULL when it can. */
static const char *nft_unusable(void)
{
	if (geteuid() != 0)
		return "not root";
	snprintf(nft_table, sizeof(nft_table), "ps_it_%d", (int)getpid());
	if (nft_table_up())
		return "nft cannot create a table (nftables missing, or no permission)";
	nft("delete table inet %s", nft_table);
	return NULL;
}

/* Client ports of the established connections to the shards' ports
 * (from /proc/net/tcp; loopback, so both ends are listed). */
static int client_ports(int p0, int p1, int *out, int max)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512];
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f) && n < max) {
		unsigned lp, rp, st;
		if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lp, &rp, &st) == 3 && st == 1 &&
		    ((int)lp == p0 || (int)lp == p1))
			out[n++] = (int)rp;
	}
	fclose(f);
	return n;
}

/* Acks lost (the shard's packets to the worker dropped until the worker
 * gives the connection up and reconnects), then a full partition of 10 s:
 * every push is applied exactly once, the shards answer resent ones without
 * applying them again, and the weights are init minus the exact sum. */
START_TEST(test_partition_exactly_once)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];
	const char *why = nft_unusable();

	if (why) {
		tu_skip("partition test: %s", why);
		return;
	}
	start_cluster(path, &cfg, 1, "sync",
		      "limits:\n  idle_timeout_ms: 800\n  drop_timeout_ms: 60000\n"
		      "  reconnect_timeout_ms: 20000\n  request_timeout_ms: 20000\n", srv);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	tensors_new(&cfg, g, w);
	int p0 = cfg.shards[0].port, p1 = cfg.shards[1].port;
	for (int clock = 0; clock < 10; clock++) {
		pid_t healer = 0;
		if (clock == 3) { /* the shards' answers to this worker vanish */
			int ports[8], n = client_ports(p0, p1, ports, 8);
			ck_assert_int_eq(n, 2);
			ck_assert_int_eq(nft_table_up(), 0);
			for (int i = 0; i < n; i++)
				ck_assert_int_eq(nft("add rule inet %s out tcp sport { %d, %d } "
						     "tcp dport %d drop", nft_table, p0, p1, ports[i]), 0);
		}
		if (clock == 6) { /* nothing passes either way for 10 s */
			ck_assert_int_eq(nft_table_up(), 0);
			ck_assert_int_eq(nft("add rule inet %s out tcp dport { %d, %d } drop",
					     nft_table, p0, p1), 0);
			ck_assert_int_eq(nft("add rule inet %s out tcp sport { %d, %d } drop",
					     nft_table, p0, p1), 0);
			healer = fork();
			if (healer == 0) {
				tu_sleep_ms(10000);
				_exit(nft("delete table inet %s", nft_table) ? 1 : 0);
			}
		}
		fill_grads(g, 0, clock);
		double t0 = now_ms();
		int64_t id = ps_client_push(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %d: %s", clock,
			      ps_client_error(c));
		if (clock == 3) {
			printf("measured: acks lost: push acknowledged after %.0f ms "
			       "(limits.idle_timeout_ms 800, then reconnect and resend)\n", now_ms() - t0);
			ck_assert_msg(now_ms() - t0 > 700, "acked after %.0f ms: the answers were "
				      "not blocked", now_ms() - t0);
			ck_assert_int_eq(nft("delete table inet %s", nft_table), 0);
		}
		if (healer > 0) {
			ck_assert_int_eq(tu_wait_child(healer), 0);
			printf("measured: 10 s partition: push acknowledged after %.0f ms\n",
			       now_ms() - t0);
			ck_assert_msg(now_ms() - t0 > 9500, "push went through the partition in "
				      "%.0f ms", now_ms() - t0);
		}
		id = ps_client_pull(c, (uint64_t)clock + 1, w, 3);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull %d: %s", clock,
			      ps_client_error(c));
	}
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = 0;
			for (int clock = 0; clock < 10; clock++)
				sum += grad_value(0, clock, t, i);
			ck_assert_msg((double)w[t].data[i] == (double)(i % 1024) - sum,
				      "%s[%lld] = %g, want %g: a push was lost or applied twice",
				      w[t].name, (long long)i, (double)w[t].data[i],
				      (double)(i % 1024) - sum);
		}
		free(g[t].data);
		free(w[t].data);
	}
	uint64_t dups = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		dups += st.duplicate_pushes;
		ck_assert_uint_eq(st.worker_clock[0], 10);
	}
	/* the clock-3 push reached both shards and was resent to both */
	ck_assert_msg(dups >= 2, "%llu duplicate pushes seen", (unsigned long long)dups);
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* One worker process of the sync test: 50 clocks of push then pull, then a
 * check of every element against init minus the exact sum. Exit status 0
 * when every value matched. Rank 1 sends each push and pull together
 * (ps_client_pushpull), rank 2 on odd clocks. */
static int sync_worker(const struct ps_config *cfg, int rank, int nworkers)
{
	char err[512];
	struct ps_client *c = connect_retry(cfg, rank, err, sizeof(err));
	struct ps_tensor g[3], w[3];
	int bad = 0;

	if (!c) {
		fprintf(stderr, "worker %d: %s\n", rank, err);
		return 2;
	}
	tensors_new(cfg, g, w);
	srand((unsigned)(getpid() * 7919));
	for (int clock = 0; clock < NCLOCKS; clock++) {
		fill_grads(g, rank, clock);
		/* Vary the arrival order at the shards from clock to clock. */
		if (rand() % 3 == 0)
			tu_sleep_ms(rand() % 3);
		if (rank == 1 || (rank == 2 && clock % 2)) {
			int64_t ids[2];
			int rc = ps_client_pushpull(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK,
						    (uint64_t)clock + 1, w, 3, ids);
			/* the pull first: it is answered after the push is applied */
			if (rc || ps_client_wait(c, ids[1]) || ps_client_wait(c, ids[0])) {
				fprintf(stderr, "worker %d pushpull %d: %s\n", rank, clock,
					ps_client_error(c));
				return 3;
			}
		} else {
			int64_t id = ps_client_push(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
			if (id < 0 || ps_client_wait(c, id)) {
				fprintf(stderr, "worker %d push %d: %s\n", rank, clock,
					ps_client_error(c));
				return 3;
			}
			id = ps_client_pull(c, (uint64_t)clock + 1, w, 3);
			if (id < 0 || ps_client_wait(c, id)) {
				fprintf(stderr, "worker %d pull %d: %s\n", rank, clock,
					ps_client_error(c));
				return 4;
			}
		}
		for (int t = 0; t < 3; t++)
			if (w[t].version != (uint64_t)clock + 1) {
				fprintf(stderr, "worker %d: tensor %d version %" PRIu64 " after clock %d\n",
					rank, t, w[t].version, clock);
				return 5;
			}
	}
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = 0;
			for (int clock = 0; clock < NCLOCKS; clock++)
				for (int r = 0; r < nworkers; r++)
					sum += grad_value(r, clock, t, i);
			double want = (double)(i % 1024) - sum;
			if ((double)w[t].data[i] != want && bad++ < 5)
				fprintf(stderr, "worker %d: %s[%" PRId64 "] = %g, want %g\n", rank,
					w[t].name, i, w[t].data[i], want);
		}
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c);
	return bad ? 6 : 0;
}

/* Three workers, 50 sync clocks, every value exact (sync_worker), each
 * shard applying each slice once per clock: with MACs, and with frames
 * encrypted under each cipher (security.encrypt). */
START_TEST(test_sync_exact_sum)
{
	/* frames MACed (the default), then encrypted with each cipher */
	static const char *const security[] = {
		"", "security:\n  encrypt: true\n",
		"security:\n  encrypt: true\n  cipher: chacha20-poly1305\n",
	};
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2], cli[3];

	start_cluster(path, &cfg, 3, "sync", security[_i], srv);
	ck_assert_int_eq(cfg.security.encrypt, _i > 0);
	for (int r = 0; r < 3; r++) {
		cli[r] = fork();
		if (cli[r] == 0)
			_exit(sync_worker(&cfg, r, 3));
	}
	for (int r = 0; r < 3; r++)
		ck_assert_msg(tu_wait_child(cli[r]) == 0, "worker %d failed (see its stderr)", r);

	/* Each shard applied each of its slices exactly NCLOCKS times. */
	struct ps_shardmap map;
	struct ps_client *mon = connect_retry(&cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		uint64_t owned = 0, owned_bytes = 0;
		for (uint32_t s = 0; s < map.nslices; s++) {
			owned += map.slices[s].shard == k;
			if (map.slices[s].shard == k)
				owned_bytes += (uint64_t)map.slices[s].count * 4;
		}
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_uint_gt(owned, 0);
		ck_assert_uint_eq(st.applies, owned * NCLOCKS);
		/* what was applied, and how long it took */
		ck_assert_uint_eq(st.apply_bytes, owned_bytes * NCLOCKS);
		ck_assert_msg(st.apply_seconds > 0 && st.apply_seconds < 60, "apply_seconds %g",
			      st.apply_seconds);
		/* each acknowledged push and each answered pull in the latency
		 * histograms, once */
		uint64_t nlat[2] = { 0, 0 };
		for (int b = 0; b < PS_HISTO_BUCKETS; b++) {
			nlat[0] += st.push_lat[b];
			nlat[1] += st.pull_lat[b];
		}
		ck_assert_msg(nlat[0] == st.pushes && nlat[1] == st.pulls, "shard %d: %llu push and "
			      "%llu pull latencies, %llu pushes and %llu pulls", k,
			      (unsigned long long)nlat[0], (unsigned long long)nlat[1],
			      (unsigned long long)st.pushes, (unsigned long long)st.pulls);
		ck_assert_msg(st.push_lat_sum_s > 0 && st.pull_lat_sum_s > 0 &&
			      st.push_lat_sum_s < 60 && st.pull_lat_sum_s < 60, "latency sums %g, %g",
			      st.push_lat_sum_s, st.pull_lat_sum_s);
		/* every worker numbered its pushes: the dedup windows hold them */
		for (int r = 0; r < 3; r++)
			ck_assert_msg(st.dedup_seq[r] > 0 && st.dedup_digest[r] != 0, "shard %d: "
				      "worker %d's dedup window %llu, %llx", k, r,
				      (unsigned long long)st.dedup_seq[r],
				      (unsigned long long)st.dedup_digest[r]);
		ck_assert_uint_eq(st.errors, 0);
		for (int r = 0; r < 3; r++)
			ck_assert_uint_eq(st.worker_clock[r], NCLOCKS);
		/* the byte counters: what the pushes carried in, the pull
		 * replies out, as the per-codec figures count them */
		uint64_t pw = 0;
		for (int x = 0; x < 8; x++)
			pw += st.push_wire_bytes[x];
		ck_assert_uint_gt(st.bytes_out, 0);
		ck_assert_uint_eq(st.bytes_out, st.pull_wire_bytes);
		ck_assert_uint_eq(st.bytes_in, pw);
		ck_assert_uint_ge(st.pull_raw_bytes, st.pulls * 4);
	}
	ps_shardmap_free(&map);
	ps_client_free(mon);
	stop_cluster(path, srv);
}
END_TEST

/* One worker process of the async test: NCLOCKS clocks of push (ending
 * the clock) and pull, rank 1 with both in one go (ps_client_pushpull).
 * Exit status 0 when every request succeeded. */
static int async_worker(const struct ps_config *cfg, int rank)
{
	char err[512];
	struct ps_client *c = connect_retry(cfg, rank, err, sizeof(err));
	struct ps_tensor g[3], w[3];

	if (!c) {
		fprintf(stderr, "worker %d: %s\n", rank, err);
		return 2;
	}
	tensors_new(cfg, g, w);
	srand((unsigned)(getpid() * 7919));
	for (int clock = 0; clock < NCLOCKS; clock++) {
		fill_grads(g, rank, clock);
		/* Vary the arrival order at the shards from clock to clock. */
		if (rand() % 3 == 0)
			tu_sleep_ms(rand() % 3);
		if (rank == 1) {
			int64_t ids[2];
			if (ps_client_pushpull(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK, 0, w, 3, ids) ||
			    ps_client_wait(c, ids[1]) || ps_client_wait(c, ids[0])) {
				fprintf(stderr, "worker %d pushpull %d: %s\n", rank, clock,
					ps_client_error(c));
				return 3;
			}
		} else {
			int64_t id = ps_client_push(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
			if (id < 0 || ps_client_wait(c, id)) {
				fprintf(stderr, "worker %d push %d: %s\n", rank, clock,
					ps_client_error(c));
				return 3;
			}
			id = ps_client_pull(c, 0, w, 3);
			if (id < 0 || ps_client_wait(c, id)) {
				fprintf(stderr, "worker %d pull %d: %s\n", rank, clock,
					ps_client_error(c));
				return 4;
			}
		}
	}
	for (int t = 0; t < 3; t++) {
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c);
	return 0;
}

/* Async (SSP, staleness 2): each push is applied on its own as it
 * arrives, in whatever order the three workers' pushes interleave. With
 * SGD, lr 1, and small integer gradients every partial sum is an integer
 * far below 2^24, so float addition is exact in any order: once every
 * worker has finished, the weights are exactly init minus the sum of all
 * pushes, and each shard applied each owned slice once per push. */
START_TEST(test_async_exact_sum)
{
	char path[64], err[512];
	struct ps_config cfg;
	struct ps_tensor g[3], w[3];
	pid_t srv[2], cli[3];

	start_cluster(path, &cfg, 3, "async", "  staleness: 2\n", srv);
	ck_assert_int_eq(cfg.consistency, PS_ASYNC);
	for (int r = 0; r < 3; r++) {
		cli[r] = fork();
		if (cli[r] == 0)
			_exit(async_worker(&cfg, r));
	}
	for (int r = 0; r < 3; r++)
		ck_assert_msg(tu_wait_child(cli[r]) == 0, "worker %d failed (see its stderr)", r);

	/* a worker connecting now continues at the finished clock and reads
	 * every push applied */
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_uint_eq(ps_client_clock(c), NCLOCKS);
	tensors_new(&cfg, g, w);
	int64_t id = ps_client_pull(c, 0, w, 3);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = 0;
			for (int clock = 0; clock < NCLOCKS; clock++)
				for (int r = 0; r < 3; r++)
					sum += grad_value(r, clock, t, i);
			double want = (double)(i % 1024) - sum;
			ck_assert_msg((double)w[t].data[i] == want, "%s[%" PRId64 "] = %g, want %g",
				      w[t].name, i, (double)w[t].data[i], want);
		}
		free(g[t].data);
		free(w[t].data);
	}
	struct ps_shardmap map;
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		uint64_t owned = 0;
		for (uint32_t s = 0; s < map.nslices; s++)
			owned += map.slices[s].shard == k;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		ck_assert_uint_gt(owned, 0);
		ck_assert_uint_eq(st.applies, owned * NCLOCKS * 3);
		ck_assert_uint_eq(st.errors, 0);
		for (int r = 0; r < 3; r++)
			ck_assert_uint_eq(st.worker_clock[r], NCLOCKS);
		/* the byte counters: what the pushes carried in, the pull
		 * replies out, as the per-codec figures count them */
		uint64_t pw = 0;
		for (int x = 0; x < 8; x++)
			pw += st.push_wire_bytes[x];
		ck_assert_uint_gt(st.bytes_out, 0);
		ck_assert_uint_eq(st.bytes_out, st.pull_wire_bytes);
		ck_assert_uint_eq(st.bytes_in, pw);
		ck_assert_uint_ge(st.pull_raw_bytes, st.pulls * 4);
	}
	ps_shardmap_free(&map);
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* Pipelined requests leave in submission order: one worker queues 200
 * pushes (clocks 0..199) without waiting, then one pull of version 200.
 * Sent newest-first, clock c + 1 would reach the shard before c; this once
 * hung the single-worker fast path. A stuck request fails in 5 s. */
START_TEST(test_pipelined_order)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	enum { N = 200 };
	int64_t ids[N + 1];

	start_cluster(path, &cfg, 1, "sync", "limits:\n  request_timeout_ms: 5000\n  max_clock_ahead: 1000\n", srv);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	struct ps_tensor g[3], w[3];
	for (int t = 0; t < 3; t++) {
		int64_t n = cfg.tensors[t].count;
		g[t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(n * 4), n, 0 };
		w[t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(n * 4), n, 0 };
		for (int64_t i = 0; i < n; i++)
			g[t].data[i] = 1.0f; /* the same gradient every clock: STABLE sends may share it */
	}
	for (int k = 0; k < N; k++) {
		ids[k] = ps_client_push(c, (uint64_t)k, g, 3, PS_PUSH_END_CLOCK);
		ck_assert_int_ge(ids[k], 0);
	}
	ids[N] = ps_client_pull(c, N, w, 3);
	ck_assert_int_ge(ids[N], 0);
	for (int k = 0; k <= N; k++)
		ck_assert_msg(ps_client_wait(c, ids[k]) == 0, "request %d: %s", k, ps_client_error(c));
	for (int t = 0; t < 3; t++) {
		ck_assert_uint_eq(w[t].version, N);
		for (int64_t i = 0; i < w[t].count; i++)
			ck_assert_float_eq(w[t].data[i], (float)(i % 1024) - N); /* sgd, lr 1 */
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* fp16 pushes and pulls (and the LZ4 stage) of small integers are exact:
 * two workers' encoded gradients are decoded into the rank-ordered sum and
 * the result matches the float32 run bit for bit; the shards count raw and
 * wire bytes by codec. */
START_TEST(test_fp16_exact)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	enum { N = 20 };
	struct ps_client *c[2];
	struct ps_tensor g[2][3], w[3];
	uint64_t raw = 0, wire = 0, floats = 0;

	start_cluster(path, &cfg, 2, "sync", "compression:\n  codec: fp16\n  pull: fp16\n  lz4: on\n", srv);
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int t = 0; t < 3; t++) {
		int64_t n = cfg.tensors[t].count;
		floats += (uint64_t)n;
		w[t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(n * 4), n, 0 };
		for (int r = 0; r < 2; r++)
			g[r][t] = (struct ps_tensor){ cfg.tensors[t].name, malloc(n * 4), n, 0 };
	}
	for (int clock = 0; clock < N; clock++) {
		int64_t id[3];
		for (int r = 0; r < 2; r++) {
			for (int t = 0; t < 3; t++)
				for (int64_t i = 0; i < g[r][t].count; i++)
					g[r][t].data[i] = grad_value(r, clock, t, i);
			id[r] = ps_client_push(c[r], (uint64_t)clock, g[r], 3, PS_PUSH_END_CLOCK);
			ck_assert_int_ge(id[r], 0);
		}
		id[2] = ps_client_pull(c[0], (uint64_t)clock + 1, w, 3);
		for (int k = 0; k < 3; k++)
			ck_assert_msg(ps_client_wait(c[k < 2 ? k : 0], id[k]) == 0, "%s",
				      ps_client_error(c[k < 2 ? k : 0]));
	}
	for (int t = 0; t < 3; t++) {
		for (int64_t i = 0; i < w[t].count; i++) {
			double sum = 0;
			for (int clock = 0; clock < N; clock++)
				for (int r = 0; r < 2; r++)
					sum += grad_value(r, clock, t, i);
			ck_assert_msg(w[t].data[i] == (float)((double)(i % 1024) - sum),
				      "%s[%" PRId64 "] = %g, want %g", w[t].name, i, w[t].data[i],
				      (double)(i % 1024) - sum);
		}
		free(w[t].data);
		for (int r = 0; r < 2; r++)
			free(g[r][t].data);
	}
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c[0], k, &st), 0);
		raw += st.push_raw_bytes[PS_CODEC_FP16];
		wire += st.push_wire_bytes[PS_CODEC_FP16];
		ck_assert_uint_eq(st.push_raw_bytes[PS_CODEC_NONE], 0);
		ck_assert_uint_gt(st.pull_raw_bytes, 0);
		ck_assert_uint_le(st.pull_wire_bytes, st.pull_raw_bytes / 2 + 64 * N);
	}
	ck_assert_uint_eq(raw, 2 * N * floats * 4);
	ck_assert_uint_le(wire, raw / 2);
	ck_assert_uint_gt(wire, 0);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	stop_cluster(path, srv);
}
END_TEST

/* Error feedback keeps, per element, what the codec did not send, and
 * adds it to that element's next push: over any pushes, what the shards
 * applied plus the worker's residual equals the sum of the raw gradients.
 * Two tensors of 5 slices each (64 floats, the last 44) over both shards,
 * one topk (a quarter of each slice per push), one sign; one worker, SGD
 * with lr 1 (w -= g). After pushes of known integer gradients the worker
 * pushes zeros until a push changes no weight: a residual that is not
 * zero always sends something (topk its largest value, sign +-mean |r|),
 * so the residual is then zero and the weights must be exactly the initial
 * ones minus the raw sums, element by element. The sign gradients have
 * magnitudes 1 and 3 in equal numbers per slice, so the residual comes out
 * of equal magnitude and one zero push can flush it (the sign codec sends
 * +-mean |x|). */
#define EF_N 300
#define EF_STEPS 2

static float ef_grad(int t, int k, int i)
{
	if (t == 0) /* topk: -5..5, different each step */
		return (float)((i * 7 + k * 3) % 11 - 5);
	/* sign: magnitude 1 or 3 by parity, a fixed sign pattern */
	return (float)((i % 2 ? 3 : 1) * ((i * 5 + i / 3) % 4 < 2 ? 1 : -1));
}

START_TEST(test_error_feedback_per_slice)
{
	char yaml[2048], path[64], err[512];
	static float g[2][EF_N], w0[2][EF_N], w[2][EF_N], prev[2][EF_N];
	struct ps_config cfg;
	struct ps_shardmap map;
	pid_t srv[2];
	const char *names[2] = { "t", "s" };
	struct ps_tensor tg[2], tw[2];
	uint64_t clock = 0;
	int flushed = 0;

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 1\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 256\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n"
		 "    - {name: t, shape: [%d], init: arange}\n"
		 "    - {name: s, shape: [%d], init: arange}\n"
		 "compression:\n  error_feedback: true\n  lz4: off\n  tensors:\n"
		 "    - {name: t, codec: topk, ratio: 0.25}\n"
		 "    - {name: s, codec: sign}\n"
		 "log:\n  level: warn\n",
		 tu_free_port(), tu_free_port(), EF_N, EF_N);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	/* each tensor spans several slices on both shards */
	for (int t = 0; t < 2; t++) {
		int on[2] = { 0, 0 };
		ck_assert_uint_eq(map.tensor_first[t + 1] - map.tensor_first[t], 5);
		for (uint32_t sl = map.tensor_first[t]; sl < map.tensor_first[t + 1]; sl++)
			on[map.slices[sl].shard]++;
		ck_assert(on[0] > 0 && on[1] > 0);
	}
	ps_shardmap_free(&map);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int t = 0; t < 2; t++) {
		tg[t] = (struct ps_tensor){ names[t], g[t], EF_N, 0 };
		tw[t] = (struct ps_tensor){ names[t], w0[t], EF_N, 0 };
	}
	int64_t id = ps_client_pull(c, 0, tw, 2);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	for (int t = 0; t < 2; t++)
		tw[t].data = w[t];
	memcpy(prev, w0, sizeof(prev));
	/* EF_STEPS pushes of the known gradients, then zeros until nothing moves */
	for (int k = 0; k < EF_STEPS + 12 && !flushed; k++) {
		for (int t = 0; t < 2; t++)
			for (int i = 0; i < EF_N; i++)
				g[t][i] = k < EF_STEPS ? ef_grad(t, k, i) : 0.0f;
		id = ps_client_push(c, clock, tg, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %d: %s", k,
			      ps_client_error(c));
		clock++;
		id = ps_client_pull(c, clock, tw, 2);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull %d: %s", k,
			      ps_client_error(c));
		flushed = k >= EF_STEPS && memcmp(w, prev, sizeof(w)) == 0;
		memcpy(prev, w, sizeof(prev));
	}
	ck_assert_msg(flushed, "the residual still sends after 12 pushes of zeros");
	for (int t = 0; t < 2; t++)
		for (int i = 0; i < EF_N; i++) {
			double sum = 0;
			for (int k = 0; k < EF_STEPS; k++)
				sum += ef_grad(t, k, i);
			ck_assert_msg((double)w0[t][i] - (double)w[t][i] == sum,
				      "%s[%d] (slice %d): applied %g in all, the raw gradients sum to %g",
				      names[t], i, i / 64, (double)w0[t][i] - (double)w[t][i], sum);
		}
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* SSP (staleness 2): two fast workers and a slow one (rank 2). The slow
 * worker ends its clock k only once both fast workers have sent their pull
 * of clock k + 3 (or finished), the first pull the bound must hold back
 * until then; it publishes k + 1 in shared memory before its push, so the
 * published clock is never behind what the shards know. A fast worker
 * reads it after each pull of clock c: the gap c - published can only
 * exceed 2 if a shard let a pull through beyond the bound, and since the
 * slow worker publishes k + 2 only after the fast ones have sent their
 * pulls of k + 4, the gap at clock c is exactly min(c, 2): the fast
 * workers reach the bound at every clock and never pass it. Rank 1 sends
 * the push ending clock c - 1 and the pull of clock c together
 * (ps_client_pushpull): that pull must be held as one of clock c. */
#define SSP_CLOCKS 24
#define SSP_STALENESS 2
#define SSP_WAIT_MS 30000
struct ssp_shared {
	uint64_t slow_clock;             /* clocks the slow worker is ending */
	uint64_t sent[2];                /* fast worker's pull sent; SSP_CLOCKS: done */
	uint64_t gap[2][SSP_CLOCKS];     /* fast worker's gap after its pull of clock c */
};

static int ssp_worker(const struct ps_config *cfg, int rank, struct ssp_shared *sh)
{
	char err[512];
	struct ps_client *c = connect_retry(cfg, rank, err, sizeof(err));
	struct ps_tensor t = { "a", malloc(3000 * 4), 3000, 0 };
	struct ps_tensor g = { "a", malloc(3000 * 4), 3000, 0 };

	if (!c) {
		fprintf(stderr, "worker %d: %s\n", rank, err);
		return 2;
	}
	for (int64_t i = 0; i < t.count; i++)
		t.data[i] = 0.0f, g.data[i] = 1.0f;
	for (uint64_t clock = 0; clock < SSP_CLOCKS; clock++) {
		int64_t id, ids[2];
		if (rank != 2)
			__atomic_store_n(&sh->sent[rank], clock, __ATOMIC_SEQ_CST);
		if (rank == 1 && clock > 0) {
			if (ps_client_pushpull(c, clock - 1, &g, 1, PS_PUSH_END_CLOCK, 0, &t, 1, ids) ||
			    ps_client_wait(c, ids[0]) || ps_client_wait(c, ids[1])) {
				fprintf(stderr, "worker %d pushpull: %s\n", rank, ps_client_error(c));
				return 3;
			}
		} else {
			id = ps_client_pull(c, 0, &t, 1);
			if (id < 0 || ps_client_wait(c, id)) {
				fprintf(stderr, "worker %d pull: %s\n", rank, ps_client_error(c));
				return 3;
			}
		}
		if (rank != 2) {
			uint64_t slow = __atomic_load_n(&sh->slow_clock, __ATOMIC_SEQ_CST);
			sh->gap[rank][clock] = clock > slow ? clock - slow : 0;
		} else {
			/* both fast workers at the pull the bound holds (or done) */
			uint64_t want = clock + SSP_STALENESS + 1 < SSP_CLOCKS ?
					clock + SSP_STALENESS + 1 : SSP_CLOCKS;
			double deadline = now_ms() + SSP_WAIT_MS * tu_time_scale();
			while (__atomic_load_n(&sh->sent[0], __ATOMIC_SEQ_CST) < want ||
			       __atomic_load_n(&sh->sent[1], __ATOMIC_SEQ_CST) < want) {
				if (now_ms() > deadline) {
					fprintf(stderr, "slow worker, clock %" PRIu64 ": the fast workers "
						"did not reach clock %" PRIu64 " within %d ms\n", clock, want,
						SSP_WAIT_MS);
					return 5;
				}
				tu_sleep_ms(1);
			}
			__atomic_store_n(&sh->slow_clock, clock + 1, __ATOMIC_SEQ_CST);
		}
		if (rank == 1 && clock + 1 < SSP_CLOCKS)
			continue; /* pushed with the next clock's pull */
		id = ps_client_push(c, clock, &g, 1, PS_PUSH_END_CLOCK);
		if (id < 0 || ps_client_wait(c, id)) {
			fprintf(stderr, "worker %d push: %s\n", rank, ps_client_error(c));
			return 4;
		}
	}
	if (rank != 2)
		__atomic_store_n(&sh->sent[rank], SSP_CLOCKS, __ATOMIC_SEQ_CST);
	free(t.data);
	free(g.data);
	ps_client_free(c);
	return 0;
}

START_TEST(test_ssp_staleness_bound)
{
	char path[64], err[512], extra[64];
	struct ps_config cfg;
	struct ps_shardmap map;
	struct ssp_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t srv[2], cli[3];

	ck_assert_ptr_ne(sh, MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	snprintf(extra, sizeof(extra), "  staleness: %d\n", SSP_STALENESS);
	start_cluster(path, &cfg, 3, "async", extra, srv);
	ck_assert_int_eq(cfg.consistency, PS_ASYNC);
	ck_assert_int_eq(cfg.staleness, SSP_STALENESS);
	for (int r = 0; r < 3; r++) {
		cli[r] = fork();
		if (cli[r] == 0)
			_exit(ssp_worker(&cfg, r, sh));
	}
	for (int r = 0; r < 3; r++)
		ck_assert_msg(tu_wait_child(cli[r]) == 0, "worker %d failed", r);
	/* The fast workers ran exactly as far ahead as the staleness allows,
	 * at every clock, and never further. */
	for (int r = 0; r < 2; r++)
		for (int k = 0; k < SSP_CLOCKS; k++) {
			uint64_t want = k < SSP_STALENESS ? (uint64_t)k : SSP_STALENESS;
			ck_assert_msg(sh->gap[r][k] <= SSP_STALENESS,
				      "worker %d read clock %d while the slowest had finished %" PRIu64
				      " (staleness %d)", r, k, k - sh->gap[r][k], SSP_STALENESS);
			ck_assert_msg(sh->gap[r][k] == want, "worker %d at clock %d: gap %" PRIu64
				      ", expected %" PRIu64, r, k, sh->gap[r][k], want);
		}
	/* The shards' own record: the largest gap they let a pull through at. */
	struct ps_client *mon = connect_retry(&cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		uint64_t owned = 0;
		for (uint32_t s = map.tensor_first[0]; s < map.tensor_first[1]; s++)
			owned += map.slices[s].shard == k;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_uint_eq(st.max_clock_gap, SSP_STALENESS);
		/* Async applies every push: 3 workers x SSP_CLOCKS x owned slices of a. */
		ck_assert_uint_gt(owned, 0);
		ck_assert_uint_eq(st.applies, 3 * SSP_CLOCKS * owned);
	}
	ps_shardmap_free(&map);
	ps_client_free(mon);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	munmap(sh, sizeof(*sh));
	unlink(path);
}
END_TEST

/* A pull of more slices than a shard's reply keeps on its stack (16): a
 * tensor of 48 slices over two shards, one push, one pull, every value
 * exact (init minus the gradient, SGD lr 1). */
START_TEST(test_pull_of_many_slices)
{
	enum { COUNT = 48 * 1024 };
	static float g[COUNT], w[COUNT];
	char yaml[1024], path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 1\n"
		 "slice_bytes: 4096\noptimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: big, shape: [%d], init: arange}\n"
		 "log:\n  level: warn\n", tu_free_port(), tu_free_port(), COUNT);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int i = 0; i < COUNT; i++)
		g[i] = (float)(i % 7) - 3.0f;
	struct ps_tensor tg = { "big", g, COUNT, 0 }, tw = { "big", w, COUNT, 0 };
	int64_t id = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push: %s", ps_client_error(c));
	id = ps_client_pull(c, 1, &tw, 1);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull: %s", ps_client_error(c));
	for (int i = 0; i < COUNT; i++)
		ck_assert_msg(w[i] == (float)(i % 1024) - g[i], "big[%d] = %g, want %g", i,
			      (double)w[i], (double)((float)(i % 1024) - g[i]));
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* Async: a pull waiting for the next version of a slice is answered by
 * the push that makes it, also one that does not end a clock (worker 1
 * pushes tensor c mid-clock while worker 0 waits), with the weights that
 * push left. */
START_TEST(test_async_push_answers_waiting_pull)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	float g[5], w[5];

	start_cluster(path, &cfg, 2, "async", "limits:\n  request_timeout_ms: 5000\n", srv);
	struct ps_client *a = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(a != NULL, "%s", err);
	struct ps_client *b = connect_retry(&cfg, 1, err, sizeof(err));
	ck_assert_msg(b != NULL, "%s", err);
	struct ps_tensor tw = { "c", w, 5, 0 }, tg = { "c", g, 5, 0 };
	for (int i = 0; i < 5; i++) {
		g[i] = (float)(i + 1);
		w[i] = -1.0f;
	}
	int64_t q = ps_client_pull(a, 1, &tw, 1); /* version 1 does not exist yet */
	ck_assert_int_gt(q, 0);
	int64_t p = ps_client_push(b, 0, &tg, 1, 0); /* not the end of its clock */
	ck_assert_msg(p > 0 && ps_client_wait(b, p) == 0, "push: %s", ps_client_error(b));
	ck_assert_msg(ps_client_wait(a, q) == 0, "the waiting pull: %s", ps_client_error(a));
	ck_assert_uint_eq(tw.version, 1);
	for (int i = 0; i < 5; i++)
		ck_assert_msg(w[i] == (float)i - g[i], "c[%d] = %g", i, (double)w[i]);
	ps_client_free(a);
	ps_client_free(b);
	stop_cluster(path, srv);
}
END_TEST

/* limits.connect_timeout_ms is honoured to the millisecond part: against a
 * listener that accepts and never answers, a worker with 1,500 ms gives up
 * no sooner than that, naming the shard and the limit. */
START_TEST(test_connect_timeout_fraction)
{
	char yaml[1024], path[64], err[512];
	struct ps_config cfg;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int lfd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 8), 0); /* the kernel accepts; nobody answers */
	ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [4]}\n"
		 "limits:\n  connect_timeout_ms: 1500\n  reconnect_timeout_ms: 0\n"
		 "log:\n  level: warn\n", ntohs(sa.sin_port));
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	struct ps_client *c = NULL;
	double t0 = now_ms();
	int rc = ps_client_init(&c, &cfg, 0, err, sizeof(err));
	double took = now_ms() - t0;
	ck_assert_int_ne(rc, 0);
	ck_assert_msg(strstr(err, "no handshake within 1500 ms (limits.connect_timeout_ms)"), "%s",
		      err);
	ck_assert_msg(took >= 1450, "gave up after %.0f ms", took);
	printf("measured: connect_timeout_ms 1500: gave up after %.0f ms\n", took);
	close(lfd);
	unlink(path);
}
END_TEST

/* lz4: auto tries LZ4 only on encoded slices of at least 1 KiB: a q8
 * push of tensor b (561 values, about 570 bytes encoded, all zeros, so
 * very compressible) leaves with as many bytes as with lz4: off, while
 * lz4: on shrinks it. */
START_TEST(test_lz4_auto_skips_small_slices)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	static float g[561];
	uint64_t wire[3];
	static const int modes[3] = { PS_LZ4_AUTO, PS_LZ4_OFF, PS_LZ4_ON };

	start_cluster(path, &cfg, 1, "async", "compression:\n  codec: q8\n  lz4: auto\n", srv);
	for (int m = 0; m < 3; m++) {
		struct ps_config c2 = cfg;
		c2.compress.lz4 = modes[m];
		struct ps_client *c = connect_retry(&c2, 0, err, sizeof(err));
		ck_assert_msg(c != NULL, "%s", err);
		struct ps_tensor t = { "b", g, 561, 0 };
		int64_t id = ps_client_push(c, 0, &t, 1, 0);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push: %s", ps_client_error(c));
		uint64_t raw;
		ps_client_push_bytes(c, &raw, &wire[m]);
		ck_assert_uint_eq(raw, 561 * 4);
		ps_client_free(c);
	}
	ck_assert_msg(wire[0] == wire[1], "lz4 auto sent %" PRIu64 " bytes, off %" PRIu64, wire[0],
		      wire[1]);
	ck_assert_msg(wire[2] < wire[1] / 2, "lz4 on sent %" PRIu64 " bytes, off %" PRIu64, wire[2],
		      wire[1]);
	stop_cluster(path, srv);
}
END_TEST

/* q8's stochastic rounding draws from a nonce the client gives each slice
 * of each push (its clock and its slice): two slices holding the same
 * values, in the same push or at another clock, must not be rounded alike,
 * or the rounding errors of slices and steps would be correlated instead
 * of independent. Tensor a's first two slices (1024 values each) hold the
 * same values in two pushes (clocks 0 and 1; built, not sent; no error
 * feedback and no LZ4, so each encodes exactly those values): the four
 * encoded slices differ pairwise. */
START_TEST(test_q8_nonces_distinct)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	static float g[3000];
	const uint8_t *enc[2][2] = { { NULL } };
	uint64_t len[2][2] = { { 0 } };
	struct req *r[2];

	start_cluster(path, &cfg, 1, "async", "compression:\n  codec: q8\n  error_feedback: false\n"
		      "  lz4: off\n", srv);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int i = 0; i < 3000; i++)
		g[i] = i % 1024 ? 0.37f * (float)(i % 1024 % 11) / 11.0f : 1.0f;
	struct ps_tensor t = { "a", g, 3000, 0 };
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps__client_build_push(c, (uint64_t)k, &t, 1, 0, &r[k]), 0);
		for (int s = 0; s < cfg.nshards; s++) {
			const struct part *pt = &r[k]->parts[s];
			if (!pt->meta)
				continue;
			Ps__Push *m = ps__push__unpack(NULL, pt->meta_len, pt->meta);
			ck_assert_ptr_nonnull(m);
			ck_assert_int_eq((int)m->n_slices, pt->niov);
			for (size_t j = 0; j < m->n_slices; j++) {
				uint32_t id = m->slices[j]->slice;
				if (id < 2) {   /* slices 0 and 1: tensor a's first two */
					ck_assert_uint_eq(m->slices[j]->codec, PS_CODEC_Q8);
					enc[k][id] = pt->iov[j].base;
					len[k][id] = m->slices[j]->length;
				}
			}
			ps__push__free_unpacked(m, NULL);
		}
	}
	for (int a = 0; a < 4; a++) {
		ck_assert_msg(enc[a / 2][a % 2] && len[a / 2][a % 2] == 4 + 1024,
			      "clock %d slice %d: %" PRIu64 " bytes", a / 2, a % 2, len[a / 2][a % 2]);
		for (int b = 0; b < a; b++)
			ck_assert_msg(memcmp(enc[a / 2][a % 2], enc[b / 2][b % 2], 4 + 1024) != 0,
				      "clock %d slice %d was rounded as clock %d slice %d", a / 2,
				      a % 2, b / 2, b % 2);
	}
	/* the same values, so the same scale (1.0) heads each */
	ck_assert_msg(!memcmp(enc[0][0], enc[1][1], 4), "the scales differ");
	for (int k = 0; k < 2; k++)
		ps__client_req_free(c, r[k]);
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

/* Sync, two workers, one of them two clocks ahead of the other, which never
 * pushes: nothing is applied (each clock waits for both), and the shards
 * stop cleanly with those clocks still buffered (under SANITIZE=address
 * their leak check sees every buffered clock freed). */
START_TEST(test_stop_with_clocks_buffered)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[3], w[3];

	start_cluster(path, &cfg, 2, "sync", "", srv);
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	tensors_new(&cfg, g, w);
	for (int clock = 0; clock < 3; clock++) {
		fill_grads(g, 0, clock);
		int64_t id = ps_client_push(c, (uint64_t)clock, g, 3, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %d: %s", clock,
			      ps_client_error(c));
	}
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		ck_assert_uint_eq(st.applies, 0);
		ck_assert_uint_eq(st.worker_clock[0], 3);
	}
	for (int t = 0; t < 3; t++) {
		free(g[t].data);
		free(w[t].data);
	}
	ps_client_free(c);
	stop_cluster(path, srv);
}
END_TEST

START_TEST(test_shard_map_mismatch_refused)
{
	char yaml[2048], path_a[64], path_b[64], err[512], want[64];
	struct ps_config a, b;
	struct ps_shardmap ma, mb;
	struct ps_client *c = NULL;
	int p0 = tu_free_port(), p1 = tu_free_port(), rc;
	pid_t srv[2];

	cluster_yaml(yaml, sizeof(yaml), p0, p1, 1, "sync", "");
	ck_assert_int_eq(tu_write_temp(path_a, yaml), 0);
	/* Same servers, one tensor shaped differently. */
	char *pos = strstr(yaml, "[5]");
	ck_assert_ptr_nonnull(pos);
	memcpy(pos, "[6]", 3);
	ck_assert_int_eq(tu_write_temp(path_b, yaml), 0);
	ck_assert_int_eq(ps_config_load(&a, path_a, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_config_load(&b, path_b, err, sizeof(err)), 0);
	srv[0] = tu_start_server(path_a, 0);
	srv[1] = tu_start_server(path_a, 1);
	/* Make sure the servers are up with the right config first. */
	c = connect_retry(&a, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ps_client_free(c);
	c = NULL;
	rc = ps_client_init(&c, &b, 0, err, sizeof(err));
	ck_assert_int_eq(rc, PS_EREFUSED);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(err, "shard map mismatch"));
	ck_assert_int_eq(ps_shardmap_init(&ma, &a), 0);
	ck_assert_int_eq(ps_shardmap_init(&mb, &b), 0);
	snprintf(want, sizeof(want), "client has %016" PRIx64, mb.hash);
	ck_assert_msg(strstr(err, want), "'%s' not in '%s'", want, err);
	snprintf(want, sizeof(want), "has %016" PRIx64, ma.hash);
	ck_assert_msg(strstr(err, want), "'%s' not in '%s'", want, err);
	/* A rank outside the cluster is refused too. */
	a.nworkers = 5;
	rc = ps_client_init(&c, &a, 4, err, sizeof(err));
	ck_assert_int_eq(rc, PS_EREFUSED);
	ck_assert_ptr_nonnull(strstr(err, "rank 4"));
	ps_shardmap_free(&ma);
	ps_shardmap_free(&mb);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path_a);
	unlink(path_b);
}
END_TEST

/* A shard that cannot listen says why and what to do: a port another
 * process holds (the same shard started twice), a name that does not
 * resolve; with cluster.listen_any the shard binds every address of its
 * entry's family (0.0.0.0 for an IPv4 entry), says so, and serves through
 * the configured address. Each refused start exits 1 and leaves the shard
 * that runs serving. */
START_TEST(test_listen_refusals_and_any)
{
	char yaml[1024], path[64], log[64], want[300];
	const char *tmpl = "cluster:\n  servers: [%s:%d]\n  workers: 1\n%s"
			   "optimizer:\n  name: sgd\n  lr: 1\n"
			   "model:\n  tensors:\n    - {name: a, shape: [8], init: arange}\n";
	int port = tu_free_port();
	struct ps_config cfg;
	struct ps_client *c;
	char err[512];
	pid_t srv, again;

	snprintf(log, sizeof(log), "/tmp/ps-listen-%d.log", (int)getpid());
	for (int any = 0; any < 2; any++) {
		snprintf(yaml, sizeof(yaml), tmpl, "127.0.0.1", port,
			 any ? "  listen_any: true\n" : "");
		ck_assert_int_eq(tu_write_temp(path, yaml), 0);
		const char *argv[] = { "bin/ps-server", "--config", path, "--shard", "0",
				       "--log-level", "info", NULL };
		srv = tu_spawn(argv, log);
		ck_assert_int_eq(ps_config_load(&cfg, path, err, sizeof(err)), 0);
		c = connect_retry(&cfg, 0, err, sizeof(err));
		ck_assert_msg(c != NULL, "%s", err);
		snprintf(want, sizeof(want), "shard 0 of 1 listening on %s:%d (servers[0] "
			 "127.0.0.1:%d%s)", any ? "0.0.0.0" : "127.0.0.1", port, port,
			 any ? ", cluster.listen_any" : "");
		ck_assert_msg(tu_log_says(log, want), "'%s' not in %s", want, log);
		/* the same shard again: the port is held */
		again = tu_spawn(argv, log);
		ck_assert_int_eq(tu_wait_exit(again), 1);
		snprintf(want, sizeof(want), "cannot listen on %s:%d%s: ", any ? "0.0.0.0" :
			 "127.0.0.1", port, any ? " (cluster.listen_any)" : "");
		ck_assert_msg(tu_log_says(log, want), "'%s' not in %s", want, log);
		ck_assert_msg(tu_log_says(log, "; another process holds the port (a shard of the "
					  "same config still running? `ss -ltnp` names it)"),
			      "no remedy for a held port in %s", log);
		/* the first goes on serving */
		float w[8];
		struct ps_tensor t = { "a", w, 8, 0 };
		ck_assert_int_eq(ps_client_wait(c, ps_client_pull(c, 0, &t, 1)), 0);
		ck_assert_msg(w[7] == 7.0f, "w[7] = %g", (double)w[7]);
		ps_client_free(c);
		ck_assert_int_eq(tu_stop_server(srv), 0);
		unlink(path);
	}
	/* a name that does not resolve */
	snprintf(yaml, sizeof(yaml), tmpl, "ps-no-such-host.invalid", port, "");
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	const char *argv[] = { "bin/ps-server", "--config", path, "--shard", "0", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(argv, log)), 1);
	snprintf(want, sizeof(want), "cannot listen on ps-no-such-host.invalid:%d: ", port);
	ck_assert_msg(tu_log_says(log, want), "'%s' not in %s", want, log);
	ck_assert_msg(tu_log_says(log, " on this host; give an address in cluster.servers, add "
				  "the name to DNS or /etc/hosts, or set cluster.listen_any: true"),
		      "no remedy for a name that does not resolve in %s", log);
	unlink(path);
	unlink(log);
}
END_TEST

Suite *cluster_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc = tcase_create("processes");

	tcase_set_timeout(tc, 120);
	TU_ADD_LOOP(tc, test_sync_exact_sum, 0, 3);
	TU_ADD(tc, test_async_exact_sum);
	TU_ADD(tc, test_sync_worker_leaves_and_rejoins);
	TU_ADD(tc, test_partition_exactly_once);
	TU_ADD(tc, test_worker_killed_in_barrier);
	TU_ADD(tc, test_request_timeout_then_go_on);
	TU_ADD(tc, test_timeout_names_missing_worker);
	TU_ADD(tc, test_pipelined_order);
	TU_ADD(tc, test_fp16_exact);
	TU_ADD(tc, test_error_feedback_per_slice);
	TU_ADD(tc, test_ssp_staleness_bound);
	TU_ADD(tc, test_shard_map_mismatch_refused);
	TU_ADD(tc, test_pull_of_many_slices);
	TU_ADD(tc, test_async_push_answers_waiting_pull);
	TU_ADD(tc, test_connect_timeout_fraction);
	TU_ADD(tc, test_lz4_auto_skips_small_slices);
	TU_ADD(tc, test_q8_nonces_distinct);
	TU_ADD(tc, test_stop_with_clocks_buffered);
	TU_ADD(tc, test_listen_refusals_and_any);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed;

	tu_secret_setup();
	failed = tu_run_suite(cluster_suite());
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
