/* it_replica_cases.c - scripted cases of replicated shards
 * (cluster.replicas: 1): one shard, its two ps-server processes, and two
 * workers driven step by step from this process, so that each fault lands
 * in the one window where a mistake would show (it_replica's random kills
 * rarely hit it).
 *
 *  - A sync push is acknowledged only once its clock's sum is applied and
 *    the backup holds it: worker 0's push stays unacknowledged while worker
 *    1 holds back; then the primary is killed -9, worker 1 pushes, and the
 *    weights the backup serves hold both pushes exactly once. Before the
 *    kill, the backup's finished clocks of every worker equal the
 *    primary's; after the takeover too, and the new primary does not warn
 *    that updates are lost.
 *  - A backup that is killed and rejoins does not make its primary take
 *    over again: its epoch stays, its log has no second "now the primary".
 *  - With one direction between the two processes blocked (nftables, as
 *    root), the pair still elects a primary within a bound, whichever way;
 *    and when the packets to a serving primary are dropped, its backup
 *    takes over as soon as the stepped-down primary dials it, not after
 *    its own silence timeout.
 *  - The replication figures of stats and /metrics follow the operations
 *    that made them: the batch number counts the applied clocks, the lag
 *    is 0 once the backup confirmed, the takeover counted once.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_client_int.h" /* a push sent again with its number, raw */
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NWORKERS 2
#define NA 3000 /* floats of tensor a: several slices */

static char cfg_path[64];
static struct ps_config cfg;
static int ports[2];
static pid_t srv[2];
static char logdir[64];

static const char *cfg_mode = "sync"; /* consistency.mode of the next write_config */
/* more keys of the replication and optimizer sections of the next write_config */
static const char *cfg_repl = "", *cfg_optim = "";

/* One shard, two processes, sync, SGD lr 1; stats.http on http (0: none). */
static void write_config(int http)
{
	char yaml[2048], stats[64] = "";

	ports[0] = tu_low_free_port(0);
	ports[1] = tu_low_free_port(ports[0]);
	if (http)
		snprintf(stats, sizeof(stats), "stats:\n  http: 127.0.0.1:%d\n", http);
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n"
		 "  replicas: 1\n  workers: %d\n"
		 "replication:\n  timeout_ms: 1000\n%s"
		 "consistency:\n  mode: %s\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n%s%s"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 60000\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n",
		 tu_transport_yaml(), tu_host(), ports[0], tu_host(), ports[1], NWORKERS, cfg_repl,
		 cfg_mode, cfg_optim, stats, NA);
	tu_replica_config(yaml, cfg_path, &cfg, logdir, "/tmp/ps-test-replc-XXXXXX");
}

static void stop_all(void)
{
	for (int r = 0; r < 2; r++)
		if (srv[r] > 0) {
			int st = tu_stop_server(srv[r]);
			ck_assert_msg(st == 0, "replica %d exited with %d (logs in %s)", r, st, logdir);
			srv[r] = 0;
		}
	unlink(cfg_path);
}

/* Until one process is the primary with its backup holding the state:
 * which one, or -1 after limit_s. */
static int wait_pair(double limit_s)
{
	return tu_wait_pair(&cfg, 0, limit_s);
}

/* How often text occurs in replica r's log. */
static int log_count(int r, const char *text)
{
	char path[160];
	static char buf[1 << 20];
	FILE *f;
	size_t n;
	int count = 0;

	snprintf(path, sizeof(path), "%s/shard0-r%d.log", logdir, r);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	for (char *p = buf; (p = strstr(p, text)); p += strlen(text))
		count++;
	return count;
}

/* worker rank's integer gradient of clock, element i */
static float grad(int rank, int clock, int i)
{
	return (float)((rank + 1) * ((clock * 3 + i) % 7 - 3));
}

static struct ps_client *worker(int rank)
{
	struct ps_client *c = NULL;
	char err[512];

	ck_assert_msg(ps_client_init(&c, &cfg, rank, err, sizeof(err)) == 0, "worker %d: %s", rank,
		      err);
	return c;
}

static int64_t push(struct ps_client *c, int rank, int clock, float *g)
{
	struct ps_tensor t = { "a", g, NA, 0 };

	for (int i = 0; i < NA; i++)
		g[i] = grad(rank, clock, i);
	return ps_client_push(c, (uint64_t)clock, &t, 1, PS_PUSH_END_CLOCK);
}

static void pull(struct ps_client *c, uint64_t version, float *w)
{
	struct ps_tensor t = { "a", w, NA, 0 };
	int64_t id = ps_client_pull(c, version, &t, 1);

	ck_assert_msg(id >= 0 && ps_client_wait(c, id) == 0, "pull: %s", ps_client_error(c));
}

/* Starts the pair of the config written last, waits for it to form
 * (20 s at most), connects every worker into c and pulls the initial
 * weights into w0; the primary's replica index. */
static int start_pair_workers(struct ps_client *c[NWORKERS], float *w0)
{
	int p;

	tu_start_pair(cfg_path, logdir, 0, srv);
	p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	for (int r = 0; r < NWORKERS; r++)
		c[r] = worker(r);
	pull(c[0], 0, w0);
	return p;
}

/* c pulls version `clocks`: every element is its initial value (w0) less
 * every worker's gradient of each clock below, once (integer gradients:
 * exact); when says at what point of the case. */
static void every_push_once(struct ps_client *c, const float *w0, int clocks, const char *when)
{
	static float w[NA];

	pull(c, (uint64_t)clocks, w);
	for (int i = 0; i < NA; i++) {
		float want = w0[i];
		for (int clock = 0; clock < clocks; clock++)
			for (int r = 0; r < NWORKERS; r++)
				want -= grad(r, clock, i);
		ck_assert_msg(w[i] == want, "a[%d] = %g %s, %g due (every push once; logs in %s)", i,
			      (double)w[i], when, (double)want, logdir);
	}
}

/* Every worker pushes each clock from..to-1 (g: one gradient buffer per
 * worker) and waits for its acknowledgement. */
static void push_clocks(struct ps_client *c[NWORKERS], float g[NWORKERS][NA], int from, int to)
{
	int64_t id[NWORKERS];

	for (int clock = from; clock < to; clock++) {
		for (int r = 0; r < NWORKERS; r++)
			id[r] = push(c[r], r, clock, g[r]);
		for (int r = 0; r < NWORKERS; r++)
			ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "worker %d clock %d: %s", r,
				      clock, ps_client_error(c[r]));
	}
}

/* Until replica r reports both workers' finished clock as want (the
 * backup learns it with the batch that follows the ack); its stats. */
static struct ps_shard_stats wait_clocks(int r, uint64_t want)
{
	struct ps_shard_stats st;
	double t0 = ps_now_s();
	int ok = 0;

	memset(&st, 0, sizeof(st));
	while (!ok && ps_now_s() - t0 < 10 * tu_time_scale()) {
		ok = tu_replica_stats(&cfg, 0, r, -1, &st) == 0 && st.worker_clock[0] == want &&
		     st.worker_clock[1] == want;
		if (!ok)
			tu_sleep_ms(20);
	}
	ck_assert_msg(ok, "replica %d (%s): finished clocks %llu and %llu, %llu due (logs in %s)",
		      r, st.repl_state == 3 ? "primary" : "backup",
		      (unsigned long long)st.worker_clock[0], (unsigned long long)st.worker_clock[1],
		      (unsigned long long)want, logdir);
	return st;
}

/* Sync: three clocks; the backup's finished clocks equal the primary's.
 * Clock 3: worker 0's push waits, unacknowledged, while worker 1 holds
 * back; the primary is killed -9; worker 1 pushes; both acknowledged (worker
 * 0's push sent again to the new primary), and the weights are exactly the
 * initial ones minus every push once. */
START_TEST(test_ack_waits_for_sum_across_failover)
{
	static float g[NWORKERS][NA], w0[NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a, b;
	int64_t id[NWORKERS];

	write_config(0);
	int p = start_pair_workers(c, w0);
	push_clocks(c, g, 0, 3);
	a = wait_clocks(p, 3);
	b = wait_clocks(!p, 3);
	ck_assert_uint_eq(a.repl_lsn, b.repl_lsn);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);

	/* clock 3: worker 0 alone */
	id[0] = push(c[0], 0, 3, g[0]);
	ck_assert_int_ge(id[0], 0);
	double t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, p, -1, &a) == 0 && a.pushes >= 7) && ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(a.pushes >= 7, "worker 0's push of clock 3 did not arrive (%llu pushes)",
		      (unsigned long long)a.pushes);
	tu_sleep_ms(300); /* time for an acknowledgement that must not come */
	ck_assert_msg(!ps_client_done(c[0], id[0]), "worker 0's push of clock 3 was acknowledged "
		      "while worker 1 had not pushed it: its sum is not applied anywhere yet");
	kill(srv[p], SIGKILL);
	tu_wait_child(srv[p]);
	srv[p] = 0;
	id[1] = push(c[1], 1, 3, g[1]);
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "worker %d clock 3: %s", r,
			      ps_client_error(c[r]));
	every_push_once(c[0], w0, 4, "after the takeover");
	b = wait_clocks(!p, 4);
	ck_assert_int_eq(b.repl_state, 3);
	ck_assert_uint_eq(b.repl_failovers, 1);
	ck_assert_msg(log_count(!p, "now the primary") == 1, "logs in %s", logdir);
	ck_assert_msg(log_count(!p, "are lost") == 0, "the new primary warns that updates are "
		      "lost (logs in %s)", logdir);
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* Sync: worker 0's push of clock 1 waits for worker 1, its ack pending
 * (the sum is not applied); worker 0's connection closes. Worker 1's push
 * then completes the clock: the shard releases the pending ack of a
 * connection that is gone (sent nowhere: under ASan a use after free if it
 * were not forgotten), the primary goes on, worker 1 is acknowledged, the
 * backup holds the same weights, and worker 0, back, reads every push
 * once. */
START_TEST(test_pending_ack_of_closed_worker)
{
	static float g[NWORKERS][NA], w0[NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a, b;
	int64_t id[NWORKERS];

	write_config(0);
	int p = start_pair_workers(c, w0);
	push_clocks(c, g, 0, 1);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	uint64_t pushes = a.pushes;
	unsigned conns = a.connections;
	id[0] = push(c[0], 0, 1, g[0]);
	ck_assert_int_ge(id[0], 0);
	double t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, p, -1, &a) == 0 && a.pushes > pushes) &&
	       ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(a.pushes > pushes, "worker 0's push of clock 1 did not arrive");
	ck_assert(!ps_client_done(c[0], id[0]));
	ps_client_free(c[0]);
	t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, p, -1, &a) == 0 && a.connections < conns) &&
	       ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(a.connections < conns, "the primary did not see worker 0's close");
	id[1] = push(c[1], 1, 1, g[1]);
	ck_assert_msg(id[1] > 0 && ps_client_wait(c[1], id[1]) == 0, "worker 1 clock 1: %s",
		      ps_client_error(c[1]));
	c[0] = worker(0);
	every_push_once(c[0], w0, 2, "with worker 0 back");
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	ck_assert_int_eq(a.repl_state, 3);
	t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, !p, -1, &b) == 0 &&
		 b.param_checksum == a.param_checksum) && ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(20);
	ck_assert_msg(b.param_checksum == a.param_checksum, "the backup's weights differ from "
		      "the primary's (logs in %s)", logdir);
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* Sync: worker 0's push of clock 3 waits for worker 1; meanwhile worker 0
 * sends its push of clock 2 again (the same number; raw, as a resend after
 * a reconnect is). That clock's sum is applied and replicated, so the
 * resend is answered at once, as the first time was; it is matched to a
 * waiting push only by its exact number, and the push of clock 3 keeps its
 * own acknowledgement, which comes when worker 1 pushes. Every push is
 * applied once. */
START_TEST(test_resent_push_acked_at_once)
{
	static float g[NWORKERS][NA], w0[NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a;
	int64_t id[NWORKERS], again, later;

	write_config(0);
	int p = start_pair_workers(c, w0);
	push_clocks(c, g, 0, 2);
	for (int r = 0; r < NWORKERS; r++)
		id[r] = push(c[r], r, 2, g[r]);
	for (int r = 0; r < NWORKERS; r++)
		ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "worker %d clock 2: %s", r,
			      ps_client_error(c[r]));
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	uint64_t pushes = a.pushes;
	later = push(c[0], 0, 3, g[0]);
	ck_assert_int_gt(later, 0);
	double t0 = ps_now_s();
	while (!(tu_replica_stats(&cfg, 0, p, -1, &a) == 0 && a.pushes > pushes) &&
	       ps_now_s() - t0 < 10 * tu_time_scale())
		tu_sleep_ms(10);
	ck_assert_msg(a.pushes > pushes, "worker 0's push of clock 3 did not arrive");

	struct req *rq = ps__client_req_new(c[0], REQ_PUSH);
	Ps__Push m = PS__PUSH__INIT;
	ck_assert_ptr_nonnull(rq);
	rq->id = ps__client_reserve_id(c[0]);
	m.req_id = (uint64_t)rq->id;
	m.seq = (uint64_t)id[0];
	m.clock = 2;
	m.end_clock = 1;
	ck_assert_int_eq(ps__client_pack_part(&rq->parts[0], &m.base), 0);
	again = ps__client_submit_built(c[0], 0, rq);
	ck_assert_int_gt(again, 0);
	ck_assert_msg(ps_client_wait_timeout(c[0], again, 5 * tu_time_scale()) == 0,
		      "the resent push of clock 2 was not answered while clock 3 waits: %s "
		      "(logs in %s)", ps_client_error(c[0]), logdir);
	ck_assert_msg(!ps_client_done(c[0], later), "worker 0's push of clock 3 was "
		      "acknowledged before worker 1 pushed it");
	id[1] = push(c[1], 1, 3, g[1]);
	ck_assert_msg(ps_client_wait(c[0], later) == 0, "worker 0 clock 3: %s",
		      ps_client_error(c[0]));
	ck_assert_msg(ps_client_wait(c[1], id[1]) == 0, "worker 1 clock 3: %s",
		      ps_client_error(c[1]));
	every_push_once(c[0], w0, 4, "after the resend");
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* replication.forward: every_push with optimizer.average: the backup sums
 * each clock's gradients of the two workers itself and must take their
 * mean, as the primary's store does. After two clocks both processes hold
 * the same weights; after the primary's kill -9 the new primary serves
 * the initial weights minus the two clocks' means, exactly. */
START_TEST(test_every_push_average_on_backup)
{
	static float g[NWORKERS][NA], w0[NA], w[NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a, b;

	cfg_repl = "  forward: every_push\n";
	cfg_optim = "  average: true\n";
	write_config(0);
	cfg_repl = cfg_optim = "";
	int p = start_pair_workers(c, w0);
	push_clocks(c, g, 0, 2);
	a = wait_clocks(p, 2);
	b = wait_clocks(!p, 2);
	ck_assert_msg(a.param_checksum == b.param_checksum, "the backup's weights differ from the "
		      "primary's after two averaged clocks (logs in %s)", logdir);
	kill(srv[p], SIGKILL);
	tu_wait_child(srv[p]);
	srv[p] = 0;
	pull(c[0], 2, w);
	for (int i = 0; i < NA; i++) {
		float want = w0[i];
		for (int clock = 0; clock < 2; clock++)
			want -= (grad(0, clock, i) + grad(1, clock, i)) / 2.0f;
		ck_assert_msg(w[i] == want, "a[%d] = %g after the takeover, %g due (the mean of "
			      "each clock; logs in %s)", i, (double)w[i], (double)want, logdir);
	}
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* The backup killed -9 and restarted, twice: it joins as the backup each
 * time, and the primary neither takes over again nor changes its epoch. */
START_TEST(test_backup_rejoin_keeps_primary)
{
	struct ps_shard_stats a, a2;

	write_config(0);
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	int lines = log_count(p, "now the primary");
	ck_assert_int_eq(lines, 1);
	for (int round = 0; round < 2; round++) {
		kill(srv[!p], SIGKILL);
		tu_wait_child(srv[!p]);
		srv[!p] = tu_start_replica(cfg_path, logdir, 0, !p, 1);
		ck_assert_msg(wait_pair(20) == p, "round %d: the restarted backup did not join "
			      "(logs in %s)", round, logdir);
		ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a2), 0);
		ck_assert_msg(a2.repl_epoch == a.repl_epoch, "round %d: the primary's epoch went "
			      "from %llu to %llu when its backup rejoined", round,
			      (unsigned long long)a.repl_epoch, (unsigned long long)a2.repl_epoch);
		ck_assert_uint_eq(a2.repl_failovers, a.repl_failovers);
		ck_assert_msg(log_count(p, "now the primary") == lines, "round %d: the primary "
			      "logs \"now the primary\" again (logs in %s)", round, logdir);
	}
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* The backup at the shard's first address (the process of servers[0],
 * after a takeover moved the primary to the backup address): every
 * worker, rank 0 too, is sent on to the other address, so every push
 * reaches the primary and none the backup (whose state comes from the
 * primary alone). */
START_TEST(test_backup_turns_every_worker_away)
{
	static float g[NWORKERS][NA], w0[NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a, b;

	write_config(0);
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	if (p == 0) {   /* the primary to the second address */
		kill(srv[0], SIGKILL);
		tu_wait_child(srv[0]);
		double t0 = ps_now_s();
		while (tu_replica_primary(&cfg, 0) != 1 && ps_now_s() - t0 < 20 * tu_time_scale())
			tu_sleep_ms(50);
		ck_assert_msg(tu_replica_primary(&cfg, 0) == 1, "replica 1 did not take over (logs "
			      "in %s)", logdir);
		srv[0] = tu_start_replica(cfg_path, logdir, 0, 0, 1);
		p = wait_pair(20);
		ck_assert_msg(p == 1, "the pair did not form again with replica 1 primary (logs in %s)",
			      logdir);
	}
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, 0, -1, &b), 0);
	uint64_t backup_pushes = b.pushes;
	for (int r = 0; r < NWORKERS; r++)
		c[r] = worker(r);
	pull(c[0], 0, w0);
	push_clocks(c, g, 0, 2);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, 1, -1, &a), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, 0, -1, &b), 0);
	ck_assert_int_eq(a.repl_state, 3);
	ck_assert_msg(b.pushes == backup_pushes, "the backup took %llu pushes (logs in %s)",
		      (unsigned long long)(b.pushes - backup_pushes), logdir);
	ck_assert_msg(a.pushes >= 2 * NWORKERS, "the primary took %llu pushes",
		      (unsigned long long)a.pushes);
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* nftables, as root: packets to one process's port dropped, so that only
 * the other can dial. */
static int nft_table_made;
static char nft_table[32]; /* this process's own: runs side by side do not clash */
static int nft_block(int port)
{
	char cmd[256];

	if (geteuid() != 0)
		return -1;
	snprintf(nft_table, sizeof(nft_table), "ps_replc_%d", (int)getpid());
	snprintf(cmd, sizeof(cmd), "nft add table inet %s 2>/dev/null", nft_table);
	if (system(cmd) != 0)
		return -1;
	nft_table_made = 1;
	snprintf(cmd, sizeof(cmd), "nft add chain inet %s out '{ type filter hook output "
		 "priority 0; }' 2>/dev/null && nft add rule inet %s out tcp dport %d drop",
		 nft_table, nft_table, port);
	return system(cmd) == 0 ? 0 : -1;
}

static void nft_unblock(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "nft delete table inet %s", nft_table);
	if (nft_table_made && system(cmd) != 0)
		fprintf(stderr, "it_replica_cases: nft delete table failed\n");
	nft_table_made = 0;
}

/* One direction blocked: nothing reaches replica _i's port, so only it
 * can dial its partner. One process must take the primary's role within
 * 5 s (0.3 s is usual), and only one: read from the logs, as the blocked
 * process cannot be asked. (With replica 0 blocked, replica 1 cannot dial
 * the primary and stays joining: a backup must reach its primary.) Once
 * the rule is gone, the pair forms. */
START_TEST(test_one_way_blocked_elects)
{
	int blocked = _i, n = 0;

	write_config(0);
	if (nft_block(ports[blocked])) {
		nft_unblock();
		unlink(cfg_path);
		tu_rmtree(logdir);
		tu_skip("test_one_way_blocked_elects needs root and nftables (nft) to drop the "
			"packets of one direction");
		return;
	}
	tu_start_pair(cfg_path, logdir, 0, srv);
	double t0 = ps_now_s(), took;
	while (n == 0 && ps_now_s() - t0 < 5 * tu_time_scale()) {
		n = log_count(0, "now the primary") + log_count(1, "now the primary");
		if (!n)
			tu_sleep_ms(20);
	}
	took = ps_now_s() - t0;
	tu_sleep_ms(500); /* a second takeover would come now */
	n = log_count(0, "now the primary") + log_count(1, "now the primary");
	int who = log_count(0, "now the primary") ? 0 : 1;
	nft_unblock();
	ck_assert_msg(n >= 1, "packets to replica %d dropped: no primary after %.1f s (logs in %s)",
		      blocked, took, logdir);
	ck_assert_msg(n == 1, "packets to replica %d dropped: %d takeovers (logs in %s)", blocked, n,
		      logdir);
	fprintf(stderr, "it_replica_cases: packets to replica %d dropped: replica %d the primary "
		"after %.2f s\n", blocked, who, took);
	/* and with the way open again, the pair is whole, the primary the same */
	ck_assert_msg(wait_pair(20) == who, "the pair did not form after the rule went (logs in %s)",
		      logdir);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* A formed pair, then the packets to the primary's port dropped: its
 * backup no longer reaches it, while it still reaches the backup. The
 * primary hears nothing from its backup and steps down, then dials it as
 * a joining process: the backup must take over then (1.2 s or so), not
 * wait out its own 2 s of silence (it heard the primary until it stepped
 * down, so that is 3 s). */
START_TEST(test_primary_cut_one_way)
{
	struct ps_shard_stats st;
	int ok = 0;

	write_config(0);
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	if (nft_block(ports[p])) {
		nft_unblock();
		stop_all();
		tu_rmtree(logdir);
		tu_skip("test_primary_cut_one_way needs root and nftables (nft) to drop the "
			"packets of one direction");
		return;
	}
	double t0 = ps_now_s(), took;
	memset(&st, 0, sizeof(st));
	while (!ok && ps_now_s() - t0 < 6 * tu_time_scale()) {
		ok = tu_replica_stats(&cfg, 0, !p, -1, &st) == 0 && st.repl_state == 3;
		if (!ok)
			tu_sleep_ms(20);
	}
	took = ps_now_s() - t0;
	nft_unblock();
	ck_assert_msg(ok, "packets to the primary (replica %d) dropped: replica %d does not serve "
		      "after %.1f s (state %d; logs in %s)", p, !p, took, st.repl_state, logdir);
	fprintf(stderr, "it_replica_cases: packets to the primary dropped: replica %d serves "
		"after %.2f s\n", !p, took);
	/* it took over when the stepped-down primary dialed it (about 1.2 s),
	 * not after its own 2 s of silence (3 s): the primary still reaches it */
	ck_assert_msg(log_count(!p, "has restarted or stepped down") == 1 &&
		      log_count(!p, "nothing from the primary") == 0, "replica %d did not take over "
		      "when the stepped-down primary dialed it (logs in %s)", !p, logdir);
	ck_assert_msg(wait_pair(20) == !p, "the pair did not form again (logs in %s)", logdir);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* The value of metric name (a line "name value") in body, or -1. */
static double metric(const char *body, const char *name)
{
	char key[128];
	const char *p;

	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(body, key);
	return p ? atof(p + strlen(key)) : -1;
}

/* Five clocks of two workers: the batch number (repl_lsn) is the same on
 * both processes and at least the clocks applied, the lag 0 once the
 * backup confirmed, the primary's /metrics says so, and the partner of
 * each is the other's address. */
START_TEST(test_replication_figures)
{
	static float g[NWORKERS][NA];
	struct ps_client *c[NWORKERS];
	struct ps_shard_stats a, b;
	static char body[1 << 16];
	/* stats.http: replica r on port + r, both free */
	int http = tu_low_free_pair();

	write_config(http);
	ck_assert_msg(http != ports[0] && http != ports[1] && http + 1 != ports[0] &&
		      http + 1 != ports[1], "port clash");
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	uint64_t lsn0 = a.repl_lsn;
	/* the backup's log names the batch and epoch of the state it got */
	char line[128];
	snprintf(line, sizeof(line), "at batch %llu of epoch %llu", (unsigned long long)lsn0,
		 (unsigned long long)a.repl_epoch);
	ck_assert_msg(log_count(!p, line) == 1, "no \"%s\" in the backup's log (%s)", line, logdir);
	for (int r = 0; r < NWORKERS; r++)
		c[r] = worker(r);
	push_clocks(c, g, 0, 5);
	a = wait_clocks(p, 5);
	b = wait_clocks(!p, 5);
	ck_assert_msg(a.repl_lsn >= lsn0 + 5, "batch %llu after 5 clocks from batch %llu",
		      (unsigned long long)a.repl_lsn, (unsigned long long)lsn0);
	ck_assert_uint_eq(a.repl_lsn, b.repl_lsn);
	ck_assert_uint_eq(a.repl_lag, 0);
	ck_assert_uint_eq(a.repl_failovers, 0);
	ck_assert_uint_eq(b.repl_failovers, 0);
	ck_assert_int_eq(a.repl_replica, p);
	ck_assert_int_eq(b.repl_replica, !p);
	ck_assert_uint_eq(a.repl_epoch, b.repl_epoch);
	ck_assert_uint_eq(a.applies, b.applies);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);
	char want[64];
	snprintf(want, sizeof(want), ":%d", ports[!p]);
	ck_assert_msg(strstr(a.repl_partner, want), "the primary's partner is %s", a.repl_partner);
	/* shard k replica r serves /metrics on port + k + r * shards (one here) */
	ck_assert_int_eq(tu_http_get(http + p, "/metrics", body, sizeof(body)), 200);
	ck_assert_msg(metric(body, "ps_replica_primary") == 1 &&
		      metric(body, "ps_replica_partner_up") == 1, "%s", body);
	for (int r = 0; r < NWORKERS; r++)
		ps_client_free(c[r]);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* Async: a push is acknowledged once applied and held by the backup,
 * whatever its clock says: worker 0's first push is of clock 5 (a slice's
 * version then counts 1 apply, less than the clock). */
START_TEST(test_async_push_past_version_acked)
{
	static float g[NA];

	cfg_mode = "async";
	write_config(0);
	cfg_mode = "sync";
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	struct ps_client *c = worker(0);
	double t0 = ps_now_s();
	int64_t id = push(c, 0, 5, g);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	ck_assert_msg(ps_now_s() - t0 < 5 * tu_time_scale(), "acknowledged after %.1f s",
		      ps_now_s() - t0);
	/* acknowledged: the backup holds it, as the primary does */
	struct ps_shard_stats a, b;
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &a), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, !p, -1, &b), 0);
	ck_assert_uint_gt(a.applies, 0);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);
	ps_client_free(c);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

/* A partner that accepts the replication dial and never answers: the
 * joining process gives that dial up after limits.connect_timeout_ms (2 s
 * here), not before. */
START_TEST(test_silent_partner_dial_timeout)
{
	write_config(0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)ports[1]),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), fd = -1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	srv[0] = tu_start_replica(cfg_path, logdir, 0, 0, 1);
	struct pollfd pl = { lfd, POLLIN, 0 };
	ck_assert_msg(poll(&pl, 1, (int)(10000 * tu_time_scale())) == 1, "no dial within 10 s");
	fd = accept(lfd, NULL, NULL);
	double t0 = ps_now_s(), took = -1;
	while (ps_now_s() - t0 < 10 * tu_time_scale()) {
		char b[4096];
		struct pollfd pf = { fd, POLLIN, 0 };
		if (poll(&pf, 1, 100) == 1 && read(fd, b, sizeof(b)) <= 0) {
			took = ps_now_s() - t0;
			break;
		}
	}
	fprintf(stderr, "it_replica_cases: a silent partner's dial given up after %.2f s\n", took);
	ck_assert_msg(took >= 1.9 && took < 5 * tu_time_scale(), "the dial to a silent partner "
		      "was given up after %.2f s; limits.connect_timeout_ms is 2000", took);
	close(fd);
	close(lfd);
	stop_all();
	tu_rmtree(logdir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("replica_cases");
	TCase *tc = tcase_create("processes");
	int rc;

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_ack_waits_for_sum_across_failover);
	TU_ADD(tc, test_pending_ack_of_closed_worker);
	TU_ADD(tc, test_resent_push_acked_at_once);
	TU_ADD(tc, test_every_push_average_on_backup);
	TU_ADD(tc, test_backup_rejoin_keeps_primary);
	TU_ADD(tc, test_backup_turns_every_worker_away);
	TU_ADD_LOOP(tc, test_one_way_blocked_elects, 0, 2);
	TU_ADD(tc, test_primary_cut_one_way);
	TU_ADD(tc, test_replication_figures);
	TU_ADD(tc, test_async_push_past_version_acked);
	TU_ADD(tc, test_silent_partner_dial_timeout);
	suite_add_tcase(s, tc);
	tu_secret_setup();
	rc = tu_run_suite(s);
	tu_secret_cleanup();
	nft_unblock();
	return rc;
}
