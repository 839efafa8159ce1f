/* it_reshard_live.c - re-sharding while the workers run (docs/elastic.md,
 * "Re-sharding while the workers run"), with real shard processes and two
 * worker clients (threads, one libps client each) that stay up throughout.
 *
 *  - sync training with integer gradients and sgd at lr 1 on 2 shards;
 *    the workers are held at clock 4, the shards stopped there
 *    (ps-stat --reshard-stop: B = 4), their checkpoints moved aside, 3
 *    shards started from them (ps-server --reshard-from) and the workers'
 *    $PS_CONFIG_FOLLOW file pointed at the 3-shard config; the workers,
 *    let go, push clock 4 into the stopped or gone shards, follow the new
 *    map and go on. At clock 8 the same back to 2 shards, this time
 *    stopped through ps_client_stop_at with the workers let go between
 *    the stop and its commit (their pushes for B refused with
 *    PS_ERESHARD, kept, and sent again on the new map). After 12 clocks
 *    every weight equals its initial value minus the exact sum of both
 *    workers' gradients (a push for B applied twice or lost would show)
 *    and is bit-identical to 12 clocks on 2 shards without a re-shard;
 *    each shard exited 0 at its stop, and the 3-shard ones say they
 *    re-sharded from 2; a new shard killed (kill -9) after it wrote its
 *    checkpoint of the new map, before the workers were pointed at it,
 *    and started again with the same flags, loses nothing (the exact sums);
 *  - refusals: a worker asking for a stop (only a monitor may), a stop
 *    below a clock a shard took already (PS_ECLOCK, naming the clock); a
 *    worker pointed at a config that differs in optimizer.lr does not
 *    follow it, and its request fails naming the key once its reconnects
 *    time out.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <time.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-live-XXXXXX"
#include "test_reshard.h"
#include "test_replica.h"
#include "test_util.h"

#define NA 3000
#define NB 1000
#define NW 2
#define NCLK 12

static struct ps_config cfg0; /* the workers' first config (2 shards) */
static const char *extra_yaml = ""; /* appended to every config write_cfg writes */
static int pairs;                   /* write_cfg: cluster.replicas: 1, a backup per shard */

/* Writes the n-shard config (fresh ports) to dir/NAME.yaml; its path in out. */
static void write_cfg(const char *name, int n, char *out, size_t len)
{
	char yaml[2048], servers[256] = "", backups[300] = "";

	tu_servers_list(n, servers, sizeof(servers));
	for (int k = 0, o = 0; pairs && k < n; k++)
		o += snprintf(backups + o, sizeof(backups) - (size_t)o, "%s127.0.0.1:%d%s",
			      k ? ", " : "  backups: [", tu_free_port(),
			      k == n - 1 ? "]\n  replicas: 1\n" : "");
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n%s  workers: %d\n%s"
		 "slice_bytes: 1024\nseed: 5\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "    - {name: b, shape: [%d], init: arange}\n"
		 "limits:\n  reconnect_timeout_ms: 60000\n  request_timeout_ms: 60000\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\nlog:\n  level: warn\n%s",
		 servers, backups, NW, pairs ? "replication: {timeout_ms: 600}\n" : "", NA, NB,
		 ck, extra_yaml);
	tu_write_named(dir, name, yaml, out, len);
}

static pid_t start_shard(const char *path, int k, const char *old, int old_n)
{
	return live_start(path, k, 0, old, old_n);
}

/* ---- the workers: threads, each with its own client ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t gate;            /* workers wait before pushing this clock */
static uint64_t progress[NW];    /* clocks each has finished (pushed and pulled) */
static int follow;               /* with $PS_CONFIG_FOLLOW */

struct wk {
	int rank;
	float init_a[NA], init_b[NB], a[NA], b[NB];
	int rc;
	char err[700];
	struct ps_client *c;
};
static struct wk wks[NW];

static float grad(int rank, uint64_t k, int i)
{
	return (float)((int)((i * (rank + 1) + (int)k * 3) % 7) - 3);
}

/* Waits until f(arg) holds under mu, 120 s at most; 0 or -1. */
static int wait_until(int (*f)(void *), void *arg)
{
	return tu_wait_cond(&mu, &cv, f, arg, 120);
}

static int gate_open(void *arg)
{
	return *(uint64_t *)arg < gate;
}

static int all_at(void *arg)
{
	for (int r = 0; r < NW; r++)
		if (progress[r] < *(uint64_t *)arg)
			return 0;
	return 1;
}

static void *worker(void *arg)
{
	struct wk *w = arg;
	static __thread float ga[NA], gb[NB];
	struct ps_tensor tg[2] = { { .name = "a", .data = ga, .count = NA },
				   { .name = "b", .data = gb, .count = NB } };
	struct ps_tensor tw[2] = { { .name = "a", .data = w->a, .count = NA },
				   { .name = "b", .data = w->b, .count = NB } };
	struct ps_tensor ti[2] = { { .name = "a", .data = w->init_a, .count = NA },
				   { .name = "b", .data = w->init_b, .count = NB } };
	int64_t id;

	for (int i = 0; i < 150; i++) { /* the shards may not listen yet */
		w->rc = ps_client_init(&w->c, &cfg0, w->rank, w->err, sizeof(w->err));
		if (w->rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(100);
	}
	if (w->rc)
		return NULL;
	id = ps_client_pull(w->c, 0, ti, 2);
	if (id < 0 || (w->rc = ps_client_wait(w->c, id)))
		goto fail;
	for (uint64_t k = 0; k < NCLK; k++) {
		if (wait_until(gate_open, &k)) {
			snprintf(w->err, sizeof(w->err), "clock %" PRIu64 ": the gate stayed shut", k);
			w->rc = -1;
			return NULL;
		}
		for (int i = 0; i < NA; i++)
			ga[i] = grad(w->rank, k, i);
		for (int i = 0; i < NB; i++)
			gb[i] = grad(w->rank, k, i + 17);
		id = ps_client_push(w->c, k, tg, 2, PS_PUSH_END_CLOCK);
		if (id < 0 || (w->rc = ps_client_wait(w->c, id)))
			goto fail;
		id = ps_client_pull(w->c, k + 1, tw, 2);
		if (id < 0 || (w->rc = ps_client_wait(w->c, id)))
			goto fail;
		pthread_mutex_lock(&mu);
		progress[w->rank] = k + 1;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
	}
	return NULL;
fail:
	if (!w->rc)
		w->rc = (int)id;
	snprintf(w->err, sizeof(w->err), "rank %d: %s", w->rank, ps_client_error(w->c));
	return NULL;
}

static void set_gate(uint64_t g)
{
	pthread_mutex_lock(&mu);
	gate = g;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void start_workers(pthread_t *th)
{
	memset(progress, 0, sizeof(progress));
	for (int r = 0; r < NW; r++) {
		wks[r].rank = r;
		wks[r].rc = 0;
		wks[r].err[0] = 0;
		ck_assert_int_eq(pthread_create(&th[r], NULL, worker, &wks[r]), 0);
	}
}

static void join_workers(pthread_t *th)
{
	for (int r = 0; r < NW; r++) {
		pthread_join(th[r], NULL);
		ck_assert_msg(wks[r].rc == 0, "worker %d: %s (%s)", r, wks[r].err,
			      ps_strerror(wks[r].rc));
	}
}

static void free_workers(void)
{
	for (int r = 0; r < NW; r++) {
		ps_client_free(wks[r].c);
		wks[r].c = NULL;
	}
}

START_TEST(test_workers_stay_2_3_2)
{
	static float ref_a[NA], ref_b[NB];
	char c2[160], c3[160], c2b[160], old[200], err[600], out[200], log[200];
	pid_t srv[3];
	pthread_t th[NW];
	struct ps_client *mon;
	struct ps_shard_stats st;

	strcpy(dir, "/tmp/ps-reshard-live-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* the reference: 12 clocks on 2 shards, no re-shard, not following */
	write_cfg("ref", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2, k, NULL, 0);
	unsetenv("PS_CONFIG_FOLLOW");
	gate = UINT64_MAX;
	start_workers(th);
	join_workers(th);
	memcpy(ref_a, wks[0].a, sizeof(ref_a));
	memcpy(ref_b, wks[0].b, sizeof(ref_b));
	free_workers();
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	ck_assert_int_eq(tu_rmtree(ck), 0);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* the same with the workers following 2 -> 3 -> 2 */
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	live_point_at(c2);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	follow = 1;
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2, k, NULL, 0);
	set_gate(4);
	start_workers(th);
	uint64_t at = 4;
	ck_assert_msg(wait_until(all_at, &at) == 0, "the workers did not reach clock 4: %s %s",
		      wks[0].err, wks[1].err);

	/* a worker may not stop the shards */
	ck_assert_int_eq(ps_client_stop_at(wks[0].c, 0, 4, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(wks[0].c), "monitor"), "%s",
		      ps_client_error(wks[0].c));

	/* 2 -> 3: ps-stat stops them at 4 */
	snprintf(out, sizeof(out), "%s/pstat-1.out", dir);
	const char *pstat[] = { "bin/ps-stat", "--config", c2, "--reshard-stop", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(pstat, out)), 0);
	ck_assert_msg(tu_log_says(out, "every shard stops at clock 4"), "ps-stat (%s) did not stop "
		      "at clock 4", out);
	set_gate(8); /* their pushes for 4 meet stopped or gone shards */
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	live_move_old("from2", 2, pairs, old, sizeof(old));
	write_cfg("c3", 3, c3, sizeof(c3));
	for (int k = 0; k < 3; k++)
		srv[k] = start_shard(c3, k, old, 2);
	/* a new shard killed (kill -9) once it wrote its checkpoint of the
	 * new map, before the workers are pointed at it: started again with
	 * the same flags, it takes that checkpoint */
	struct ps_config *cfg3 = malloc(sizeof(*cfg3));
	ck_assert_ptr_nonnull(cfg3);
	ck_assert_msg(ps_config_load(cfg3, c3, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 3; k++)
		ck_assert_msg(tu_wait_listen(cfg3->shards[k].port), "new shard %d does not listen", k);
	kill(srv[1], SIGKILL);
	ck_assert_int_eq(tu_wait_exit(srv[1]), 128 + SIGKILL);
	srv[1] = start_shard(c3, 1, old, 2);
	ck_assert_msg(tu_wait_listen(cfg3->shards[1].port), "new shard 1 does not listen again");
	live_point_at(c3);
	at = 8;
	ck_assert_msg(wait_until(all_at, &at) == 0, "the workers did not reach clock 8 on 3 "
		      "shards: %s %s", wks[0].err, wks[1].err);

	/* 3 -> 2: stopped by hand, the workers let go before the commit */
	ck_assert_int_eq(ps_client_init(&mon, cfg3, -1, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_client_stop_at(mon, 0, 3, 0, &st), PS_ECLOCK); /* clock 7 taken */
	ck_assert_msg(strstr(ps_client_error(mon), "stop at 8 or later"), "%s",
		      ps_client_error(mon));
	for (int k = 0; k < 3; k++) {
		ck_assert_msg(ps_client_stop_at(mon, k, 8, 0, &st) == 0, "shard %d: %s", k,
			      ps_client_error(mon));
		ck_assert_uint_eq(st.stop_at, 8);
		ck_assert_uint_eq(st.top_clock, 8);
	}
	set_gate(UINT64_MAX); /* their pushes for 8 are refused, kept */
	for (int k = 0; k < 3; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 8, PS_STOP_COMMIT, &st) == 0, "shard %d: %s",
			      k, ps_client_error(mon));
	ps_client_free(mon);
	free(cfg3);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	live_move_old("from3", 3, pairs, old, sizeof(old));
	write_cfg("c2b", 2, c2b, sizeof(c2b));
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2b, k, old, 3);
	live_point_at(c2b);
	join_workers(th);

	/* exact sums, and bit-identical to the run without re-shards */
	for (int r = 0; r < NW; r++)
		for (int i = 0; i < NA + NB; i++) {
			float want = i < NA ? wks[0].init_a[i] : wks[0].init_b[i - NA];
			float got = i < NA ? wks[r].a[i] : wks[r].b[i - NA];
			for (uint64_t k = 0; k < NCLK; k++)
				for (int q = 0; q < NW; q++)
					want -= grad(q, k, i < NA ? i : i - NA + 17);
			ck_assert_msg(got == want, "worker %d: %s[%d] = %g, the exact sum gives %g", r,
				      i < NA ? "a" : "b", i < NA ? i : i - NA, got, want);
		}
	ck_assert_msg(!memcmp(wks[0].a, ref_a, sizeof(ref_a)) &&
		      !memcmp(wks[0].b, ref_b, sizeof(ref_b)),
		      "weights after 2 -> 3 -> 2 under running workers differ from 2 throughout");
	free_workers();
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-2.log", dir);
	ck_assert_msg(tu_log_says(log, "re-sharded from 2 to 3 shards"), "%s: no re-shard said",
		      log);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-0.log", dir);
	ck_assert_msg(tu_log_says(log, "stopped at clock 8 with its checkpoint written"),
		      "%s: no stop at clock 8 said", log);
	unsetenv("PS_CONFIG_FOLLOW");
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* Error feedback through a live re-shard: workers pushing with topk
 * (tensor a) and q8 (tensor b), compression.error_feedback on and LZ4 on,
 * follow 2 -> 3 shards at clock 4, their pushes for clock 4 refused at the
 * stop and cut again for the new map from the bytes they were encoded
 * into; after 12 clocks the weights are bit-identical to 12 clocks on 2
 * shards without a re-shard (encoding those pushes again would have added
 * each tensor's residual twice). */
START_TEST(test_error_feedback_2_3)
{
	static float ref_a[NA], ref_b[NB];
	char c2[160], c3[160], old[200], err[600], out[200];
	pid_t srv[3];
	pthread_t th[NW];
	uint64_t at = 4;

	extra_yaml = "compression:\n  codec: topk\n  ratio: 0.05\n  error_feedback: true\n"
		     "  lz4: on\n  tensors:\n    - {name: b, codec: q8}\n";
	strcpy(dir, "/tmp/ps-reshard-ef-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* the reference: 12 clocks on 2 shards, no re-shard */
	write_cfg("ref", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2, k, NULL, 0);
	unsetenv("PS_CONFIG_FOLLOW");
	gate = UINT64_MAX;
	start_workers(th);
	join_workers(th);
	memcpy(ref_a, wks[0].a, sizeof(ref_a));
	memcpy(ref_b, wks[0].b, sizeof(ref_b));
	ck_assert_msg(memcmp(ref_a, wks[0].init_a, sizeof(ref_a)), "nothing was trained");
	free_workers();
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	ck_assert_int_eq(tu_rmtree(ck), 0);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* the same with the workers following 2 -> 3 at clock 4 */
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	live_point_at(c2);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2, k, NULL, 0);
	set_gate(4);
	start_workers(th);
	ck_assert_msg(wait_until(all_at, &at) == 0, "the workers did not reach clock 4: %s %s",
		      wks[0].err, wks[1].err);
	snprintf(out, sizeof(out), "%s/pstat.out", dir);
	const char *pstat[] = { "bin/ps-stat", "--config", c2, "--reshard-stop", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(pstat, out)), 0);
	ck_assert_msg(tu_log_says(out, "every shard stops at clock 4"), "ps-stat (%s) did not stop "
		      "at clock 4", out);
	set_gate(UINT64_MAX); /* their pushes for 4, encoded once, are refused and kept */
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	live_move_old("from2", 2, pairs, old, sizeof(old));
	write_cfg("c3", 3, c3, sizeof(c3));
	for (int k = 0; k < 3; k++)
		srv[k] = start_shard(c3, k, old, 2);
	live_point_at(c3);
	join_workers(th);
	for (int r = 0; r < NW; r++)
		ck_assert_msg(!memcmp(wks[r].a, ref_a, sizeof(ref_a)) &&
			      !memcmp(wks[r].b, ref_b, sizeof(ref_b)),
			      "worker %d: weights with topk and q8 error feedback after 2 -> 3 "
			      "differ from 2 shards throughout", r);
	free_workers();
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	unsetenv("PS_CONFIG_FOLLOW");
	extra_yaml = "";
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* Replicated shards through a live re-shard: 2 pairs (cluster.replicas:
 * 1) stopped by ps-stat at clock 4 (the stop reaches each backup through
 * replication: all 4 processes write their checkpoints at 4 and exit 0),
 * 3 pairs started from the 4 files, the workers follow; then the primary
 * of new shard 0 is killed (kill -9) and its backup takes over. After 12
 * clocks every weight is its initial value minus the exact sum of both
 * workers' gradients. */
START_TEST(test_pairs_2_3)
{
	char c2[160], c3[160], old[200], err[600], out[200], log[200];
	pid_t srv[6];
	pthread_t th[NW];
	uint64_t at = 4;

	pairs = 1;
	strcpy(dir, "/tmp/ps-reshard-pairs-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	live_point_at(c2);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	for (int k = 0; k < 4; k++)
		srv[k] = live_start(c2, k % 2, k / 2, NULL, 0);
	set_gate(4);
	start_workers(th);
	ck_assert_msg(wait_until(all_at, &at) == 0, "the workers did not reach clock 4: %s %s",
		      wks[0].err, wks[1].err);
	/* a stop asked of shard 0 without its commit is the backup's too once
	 * the primary answers (ps-stat below asks the same stop again) */
	struct ps_client *mon;
	struct ps_shard_stats st, bst;
	ck_assert_int_eq(ps_client_init(&mon, &cfg0, -1, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_stop_at(mon, 0, 4, 0, &st) == 0, "%s", ps_client_error(mon));
	int r0 = tu_replica_primary(&cfg0, 0);
	ck_assert_msg(r0 >= 0, "shard 0 has no primary");
	ck_assert_int_eq(tu_replica_stats(&cfg0, 0, !r0, -1, &bst), 0);
	ck_assert_msg(bst.stop_at == 4 && !bst.stop_committed, "shard 0's backup: stop at %"
		      PRIu64 " (committed %d) after its primary took a stop at 4",
		      (uint64_t)bst.stop_at, (int)bst.stop_committed);
	/* cancelled (ps-stat would find it in progress), on the backup too */
	ck_assert_msg(ps_client_stop_at(mon, 0, 0, PS_STOP_CANCEL, &st) == 0, "%s",
		      ps_client_error(mon));
	ps_client_free(mon);
	ck_assert_int_eq(tu_replica_stats(&cfg0, 0, !r0, -1, &bst), 0);
	ck_assert_msg(bst.stop_at == 0, "shard 0's backup: stop at %" PRIu64 " after the cancel",
		      (uint64_t)bst.stop_at);
	snprintf(out, sizeof(out), "%s/pstat.out", dir);
	const char *pstat[] = { "bin/ps-stat", "--config", c2, "--reshard-stop", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(pstat, out)), 0);
	ck_assert_msg(tu_log_says(out, "every shard stops at clock 4"), "ps-stat (%s) did not stop "
		      "at clock 4", out);
	set_gate(8); /* their pushes for 4 are refused by the primaries, kept */
	for (int k = 0; k < 4; k++)
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old process %d did not exit 0 at the stop", k);
	for (int k = 0; k < 2; k++) {
		snprintf(log, sizeof(log), "%s/c2.yaml-shard-%d-r1.log", dir, k);
		ck_assert_msg(tu_log_says(log, "stopped at clock 4 with its checkpoint written; "
					  "exiting (the backup, as its primary does)"),
			      "%s: the backup did not stop at clock 4 as a backup", log);
	}
	live_move_old("from2", 2, pairs, old, sizeof(old)); /* both files of each pair */
	write_cfg("c3", 3, c3, sizeof(c3));
	for (int k = 0; k < 6; k++)
		srv[k] = live_start(c3, k % 3, k / 3, old, 2);
	live_point_at(c3);
	at = 8;
	ck_assert_msg(wait_until(all_at, &at) == 0, "the workers did not reach clock 8 on 3 "
		      "pairs: %s %s", wks[0].err, wks[1].err);
	/* the primary of new shard 0 (replica 0: equal state at the start) */
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-0.log", dir);
	ck_assert_msg(tu_log_says(log, "now the primary of shard 0"), "%s: not the primary", log);
	/* the backup holding the state before the kill: alone, the new
	 * primary acknowledges at once, and the workers reached clock 8 within
	 * 10 ms of its election, before replica 1 had joined (CI, once); a
	 * process that never held the state cannot take over */
	{
		static struct ps_config c3cfg;
		char err[512];
		ck_assert_msg(ps_config_load(&c3cfg, c3, err, sizeof(err)) == 0, "%s", err);
		ck_assert_msg(tu_wait_pair(&c3cfg, 0, 20) == 0, "new shard 0's pair did not form with "
			      "replica 0 serving (logs in %s)", dir);
	}
	kill(srv[0], SIGKILL);
	ck_assert_int_eq(tu_wait_exit(srv[0]), 128 + SIGKILL);
	set_gate(UINT64_MAX);
	join_workers(th);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-0-r1.log", dir);
	ck_assert_msg(tu_log_says(log, "now the primary of shard 0"), "%s: no takeover", log);
	for (int r = 0; r < NW; r++)
		for (int i = 0; i < NA + NB; i++) {
			float want = i < NA ? wks[0].init_a[i] : wks[0].init_b[i - NA];
			float got = i < NA ? wks[r].a[i] : wks[r].b[i - NA];
			for (uint64_t k = 0; k < NCLK; k++)
				for (int q = 0; q < NW; q++)
					want -= grad(q, k, i < NA ? i : i - NA + 17);
			ck_assert_msg(got == want, "worker %d: %s[%d] = %g, the exact sum gives %g", r,
				      i < NA ? "a" : "b", i < NA ? i : i - NA, got, want);
		}
	free_workers();
	for (int k = 1; k < 6; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	unsetenv("PS_CONFIG_FOLLOW");
	pairs = 0;
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* A worker following a re-shard to a config that differs in more than
 * cluster.servers: not taken, and its request fails once its reconnects
 * time out, naming the key; likewise a config that does not load and a
 * pointer file gone. A pointer file that is missing or empty at the
 * start: ps_client_init refuses, naming it. */
START_TEST(test_other_config_not_followed)
{
	char c1[160], bad[160], err[600], yaml[1024];
	static struct ps_config cfg1;
	struct ps_client *c = NULL;
	float w[5] = { 0 };
	struct ps_tensor t = { .name = "a", .data = w, .count = 5 };
	pid_t srv;
	int64_t id;
	int rc = -1;

	strcpy(dir, "/tmp/ps-reshard-live-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (int i = 0; i < 2; i++) {
		snprintf(yaml, sizeof(yaml),
			 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
			 "optimizer:\n  name: sgd\n  lr: %s\n"
			 "model:\n  tensors:\n    - {name: a, shape: [5], init: zeros}\n"
			 "limits:\n  reconnect_timeout_ms: 1500\nlog:\n  level: warn\n",
			 tu_free_port(), i ? "0.5" : "1");
		snprintf(i ? bad : c1, sizeof(c1), "%s/%s.yaml", dir, i ? "bad" : "c1");
		FILE *f = fopen(i ? bad : c1, "w");
		ck_assert_ptr_nonnull(f);
		fputs(yaml, f);
		fclose(f);
	}
	ck_assert_msg(ps_config_load(&cfg1, c1, err, sizeof(err)) == 0, "%s", err);
	/* the pointer then names bad.yaml; by a path relative to its own
	 * folder a config that does not load; or the pointer file is gone.
	 * A worker whose reconnects timed out does not look again: a new one
	 * for each */
	char want[3][400];
	snprintf(want[0], sizeof(want[0]), "in more than cluster.servers (first: "
		 "'optimizer.lr: 0.5')");
	snprintf(want[1], sizeof(want[1]), "the re-shard's config %s/missing.yaml does not load: ",
		 dir);
	snprintf(want[2], sizeof(want[2]), "$PS_CONFIG_FOLLOW: cannot read %s/current: No such file",
		 dir);
	for (int i = 0; i < 3; i++) {
		live_point_at(c1);
		setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
		srv = start_shard(c1, 0, NULL, 0);
		rc = -1;
		for (int j = 0; j < 150 && rc; j++) {
			rc = ps_client_init(&c, &cfg1, 0, err, sizeof(err));
			if (rc == -ECONNREFUSED)
				tu_sleep_ms(100);
			else
				ck_assert_msg(rc == 0, "%s", err);
		}
		ck_assert_int_eq(rc, 0);
		ck_assert_int_eq(tu_stop_server(srv), 0);
		if (i == 2)
			ck_assert_int_eq(unlink(live_ptr), 0);
		else
			live_point_at(i ? "missing.yaml" : bad);
		id = ps_client_pull(c, 0, &t, 1);
		ck_assert_msg(id > 0, "%s", ps_client_error(c));
		ck_assert_int_eq(ps_client_wait(c, id), PS_ETIMEDOUT);
		ck_assert_msg(strstr(ps_client_error(c), "a re-shard was not followed") &&
			      strstr(ps_client_error(c), want[i]), "%s; '%s' expected",
			      ps_client_error(c), want[i]);
		ps_client_free(c);
		c = NULL;
	}
	/* a pointer that cannot be read, or holds no path, fails the start */
	for (int i = 0; i < 2; i++) {
		if (i == 1) {
			FILE *f = fopen(live_ptr, "w");
			ck_assert_ptr_nonnull(f);
			fputs(" \r\n", f);
			fclose(f);
		}
		rc = ps_client_init(&c, &cfg1, 0, err, sizeof(err));
		ck_assert_msg(rc == PS_ECONFIG && !c, "%d %s", rc, err);
		ck_assert_msg(strstr(err, i ? "is empty: it holds the path of the cluster's current "
					      "config" : "cannot read"), "%s", err);
		ck_assert_msg(strstr(err, live_ptr), "the pointer file is not named: %s", err);
	}
	unlink(live_ptr);
	unsetenv("PS_CONFIG_FOLLOW");
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_live");
	TCase *tc = tcase_create("live");

	tcase_set_timeout(tc, 300);
	TU_ADD(tc, test_workers_stay_2_3_2);
	TU_ADD(tc, test_other_config_not_followed);
	TU_ADD(tc, test_error_feedback_2_3);
	TU_ADD(tc, test_pairs_2_3);
	suite_add_tcase(s, tc);
	/* the pairs' replication key too, when not run by run-tests.sh */
	tu_secret_setup();
	int rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
