/* it_client_api.c - the parts of the public client API a binding relies
 * on (worker/client/ps_client_api.c), against a real shard: the opaque
 * config handle and its accessors (and the file:line error), and the waits
 * of ps_client_wait_timeout and ps_client_done on a pull that cannot be
 * answered until a second worker pushes: the timeout leaves the request
 * pending, done says 0 then 1, and the request is waited for once; the
 * stats calls of a program built with an older, shorter struct
 * ps_shard_stats (ps_client_stats_sized): its fields filled, nothing
 * written past it; a rank outside the workers refused before connecting;
 * a shard whose name does not resolve, or that never answers the Hello,
 * named with the limit that ran out.
 */
#include <check.h>
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "ps_client.h"
#include "ps_time.h"
#include "test_util.h"

static char path[64];
static pid_t srv = -1;

/* One shard, two workers, sync; tensors a (10) and c (5), table e (dim 4);
 * with start, its shard is started. */
static struct ps_config *start_cluster(int start)
{
	char yaml[1024], err[512];
	struct ps_config *cfg;

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 2\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [10], init: zeros}\n"
		 "    - {name: c, shape: [5], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: 4, init: zeros}\n"
		 "log:\n  level: warn\n", tu_free_port());
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_open(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	if (start)
		srv = tu_start_server(path, 0);
	return cfg;
}

static struct ps_client *connect_rank(const struct ps_config *cfg, int rank)
{
	struct ps_client *c = NULL;
	char err[512];
	int rc;

	for (double t0 = ps_now_s(); ; tu_sleep_ms(20)) {
		rc = ps_client_init(&c, cfg, rank, err, sizeof(err));
		if (rc != -ECONNREFUSED || ps_now_s() - t0 > 10)
			break;
	}
	ck_assert_msg(rc == 0, "rank %d: %s", rank, err);
	return c;
}

START_TEST(test_config_handle)
{
	struct ps_config *cfg = start_cluster(0);
	char bad[64], err[512];
	struct ps_config *none = (struct ps_config *)1;

	ck_assert_int_eq(ps_config_ntensors(cfg), 2);
	ck_assert_str_eq(ps_config_tensor_name(cfg, 1), "c");
	ck_assert_int_eq(ps_config_tensor_count(cfg, 0), 10);
	ck_assert_ptr_null(ps_config_tensor_name(cfg, 2));
	ck_assert_int_eq(ps_config_tensor_count(cfg, -1), PS_ENOTENSOR);
	ck_assert_int_eq(ps_config_ntables(cfg), 1);
	ck_assert_str_eq(ps_config_table_name(cfg, 0), "e");
	ck_assert_int_eq(ps_config_table_dim(cfg, 0), 4);
	ck_assert_int_eq(ps_config_nshards(cfg), 1);
	ck_assert_int_eq(ps_config_sync(cfg), 1);
	ck_assert_str_eq(ps_config_path(cfg), path);
	struct ps_tensor t = ps_tensor_of(cfg, 1, NULL);
	ck_assert_str_eq(t.name, "c");
	ck_assert_int_eq(t.count, 5);
	ck_assert_str_eq(ps_version(), "1.0");
	ck_assert_int_eq(ps_config_nworkers(cfg), 2);
	ck_assert_int_eq(ps_config_staleness(cfg), 0);
	ck_assert_int_eq(ps_config_connect_timeout_ms(cfg), 10000);   /* the default */
	ps_config_close(cfg);
	/* an async config with its own staleness, workers and connect timeout */
	ck_assert_int_eq(tu_write_temp(bad, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 3\n"
				       "consistency:\n  mode: async\n  staleness: 7\n"
				       "limits:\n  connect_timeout_ms: 1234\n"
				       "model:\n  tensors:\n    - {name: a, shape: [3]}\n"), 0);
	ck_assert_msg(ps_config_open(&cfg, bad, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_config_sync(cfg), 0);
	ck_assert_int_eq(ps_config_nworkers(cfg), 3);
	ck_assert_int_eq(ps_config_staleness(cfg), 7);
	ck_assert_int_eq(ps_config_connect_timeout_ms(cfg), 1234);
	ck_assert_int_eq(ps_config_ntables(cfg), 0);
	ps_config_close(cfg);
	unlink(bad);

	ck_assert_int_eq(tu_write_temp(bad, "cluster:\n  servers: [127.0.0.1:1]\n  nonsense: 3\n"), 0);
	ck_assert_int_eq(ps_config_open(&none, bad, err, sizeof(err)), PS_ECONFIG);
	ck_assert_ptr_null(none);
	char want[80];
	snprintf(want, sizeof(want), "%s:3", bad);
	ck_assert_msg(strstr(err, want), "%s", err);
	unlink(bad);
	ck_assert_int_eq(ps_config_open(&none, "/nonexistent/x.yaml", err, sizeof(err)), -ENOENT);
	unlink(path);
}
END_TEST

/* For test_wait_timeout_and_done: a Stats request of client arg 0.3 s
 * from now, completed while another thread waits on the client. */
static void *stats_later(void *arg)
{
	struct ps_shard_stats st;

	tu_sleep_ms(300);
	ck_assert_int_eq(ps_client_stats(arg, 0, &st), 0);
	return NULL;
}

START_TEST(test_wait_timeout_and_done)
{
	struct ps_config *cfg = start_cluster(1);
	struct ps_client *c0 = connect_rank(cfg, 0), *c1 = connect_rank(cfg, 1);
	float g[5] = { 1, 2, 3, 4, 5 }, g1[5] = { 10, 10, 10, 10, 10 }, w[5] = { 0 };
	struct ps_tensor tg = ps_tensor_of(cfg, 1, g), tw = ps_tensor_of(cfg, 1, w);
	struct ps_tensor tg1 = ps_tensor_of(cfg, 1, g1);
	int64_t pull;

	ck_assert_int_eq(ps_client_wait(c0, ps_client_push(c0, 0, &tg, 1, PS_PUSH_END_CLOCK)), 0);
	pull = ps_client_pull(c0, 1, &tw, 1); /* needs rank 1's clock 0 too */
	ck_assert_int_gt(pull, 0);
	ck_assert_int_eq(ps_client_done(c0, pull), 0);
	double t0 = ps_now_s();
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 0.2), PS_ETIMEDOUT);
	double waited = ps_now_s() - t0;
	ck_assert_msg(waited >= 0.19 && waited < 5, "waited %.3f s", waited);
	ck_assert_msg(strstr(ps_client_error(c0), "not complete within"), "%s", ps_client_error(c0));
	ck_assert_int_eq(ps_client_done(c0, pull), 0); /* still pending */
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 0), PS_ETIMEDOUT);
	/* a fraction that carries into the seconds (for all but a thousandth of
	 * the clock's nanoseconds): the whole time waited, no error */
	t0 = ps_now_s();
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 0.999), PS_ETIMEDOUT);
	waited = ps_now_s() - t0;
	ck_assert_msg(waited >= 0.99 && waited < 5, "waited %.3f s for 0.999 s", waited);
	ck_assert_msg(strstr(ps_client_error(c0), "not complete within"), "%s", ps_client_error(c0));

	/* another request of c0 completing meanwhile (a wake-up of the same
	 * condition) does not end the wait early */
	pthread_t other;
	ck_assert_int_eq(pthread_create(&other, NULL, stats_later, c0), 0);
	t0 = ps_now_s();
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 1.5), PS_ETIMEDOUT);
	waited = ps_now_s() - t0;
	pthread_join(other, NULL);
	ck_assert_msg(waited >= 1.49 && waited < 10, "waited %.3f s for 1.5 s while another "
		      "request completed", waited);

	ck_assert_int_eq(ps_client_wait(c1, ps_client_push(c1, 0, &tg1, 1, PS_PUSH_END_CLOCK)), 0);
	for (int i = 0; i < 500 && ps_client_done(c0, pull) == 0; i++)
		tu_sleep_ms(10);
	ck_assert_int_eq(ps_client_done(c0, pull), 1);
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 5), 0);
	ck_assert_uint_eq(tw.version, 1);
	for (int i = 0; i < 5; i++)
		ck_assert_msg(w[i] == -(g[i] + g1[i]), "w[%d] = %g", i, w[i]);
	/* waited once: no longer pending */
	ck_assert_int_eq(ps_client_done(c0, pull), -EINVAL);
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, 1), -EINVAL);
	ck_assert_int_eq(ps_client_wait(c0, pull), -EINVAL);
	/* a negative timeout waits as ps_client_wait does */
	pull = ps_client_pull(c0, 1, &tw, 1);
	ck_assert_int_eq(ps_client_wait_timeout(c0, pull, -1), 0);

	ps_client_free(c1);
	ps_client_free(c0);
	ps_config_close(cfg);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	unlink(path);
}
END_TEST

START_TEST(test_stats_sized)
{
	struct ps_config *cfg = start_cluster(1);
	struct ps_client *c0 = connect_rank(cfg, 0);
	float g[5] = { 1, 2, 3, 4, 5 };
	struct ps_tensor tg = ps_tensor_of(cfg, 1, g);
	/* an older program's struct: it ended before reader_refused */
	size_t old = offsetof(struct ps_shard_stats, reader_refused);
	unsigned char *buf = malloc(sizeof(struct ps_shard_stats) + 64);
	struct ps_shard_stats *st = (struct ps_shard_stats *)buf, whole;

	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(ps_client_wait(c0, ps_client_push(c0, 0, &tg, 1, PS_PUSH_END_CLOCK)), 0);
	memset(buf, 0xA5, sizeof(struct ps_shard_stats) + 64);
	ck_assert_int_eq(ps_client_stats_sized(c0, 0, st, old), 0);
	ck_assert_int_eq(st->shard, 0);
	ck_assert_uint_eq(st->pushes, 1);
	ck_assert_msg(st->uptime_s > 0, "uptime %g", st->uptime_s);
	for (size_t i = old; i < sizeof(struct ps_shard_stats) + 64; i++)
		ck_assert_msg(buf[i] == 0xA5, "byte %zu past the caller's %zu written", i, old);
	/* a program built with a longer struct than the library's: the rest zeroed */
	memset(buf, 0xA5, sizeof(struct ps_shard_stats) + 64);
	ck_assert_int_eq(ps_client_checkpoint_sized(c0, 0, 0, st, sizeof(*st) + 64), 0);
	ck_assert_uint_eq(st->pushes, 1);
	for (size_t i = sizeof(*st); i < sizeof(*st) + 64; i++)
		ck_assert_msg(buf[i] == 0, "byte %zu past the library's struct not zeroed", i);
	/* the macro passes the whole struct's size; too small a size is refused */
	ck_assert_int_eq(ps_client_stats(c0, 0, &whole), 0);
	ck_assert_uint_eq(whole.pushes, 1);
	ck_assert_int_eq(ps_client_stats_sized(c0, 0, st, 2), -EINVAL);
	/* the entry point of programs built before the macros: the whole struct */
	memset(&whole, 0, sizeof(whole));
	ck_assert_int_eq((ps_client_stats)(c0, 0, &whole), 0);
	ck_assert_uint_eq(whole.pushes, 1);
	/* ... and its checkpoint call: no checkpoint.dir, refused with the reason */
	memset(&whole, 0, sizeof(whole));
	ck_assert_int_eq((ps_client_checkpoint)(c0, 0, 1, &whole), 0);
	ck_assert_uint_eq(whole.pushes, 1);
	ck_assert_msg(whole.checkpoint_status != 0 &&
		      strstr(whole.checkpoint_error, "checkpoints are off (no checkpoint.dir)"),
		      "status %d, '%s'", whole.checkpoint_status, whole.checkpoint_error);
	/* a re-shard's stop asked by a monitor: refused too, with the reason */
	struct ps_client *mon;
	char merr[256];
	ck_assert_msg(ps_client_init(&mon, cfg, -1, merr, sizeof(merr)) == 0, "%s", merr);
	ck_assert_int_eq(ps_client_stop_at(mon, 0, 5, 0, &whole), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(mon), "a stop for a re-shard needs checkpoint.dir: "
			     "the new shards start from the checkpoints written at the stop"),
		      "%s", ps_client_error(mon));
	/* ... also through an older program's struct and a longer one:
	 * nothing written past the older one's end, the longer one's tail
	 * zeroed; a size below the stats' first fields, a shard outside the
	 * config and clock 0 without PS_STOP_CANCEL: refused, nothing sent */
	memset(buf, 0xA5, sizeof(struct ps_shard_stats) + 64);
	ck_assert_int_eq(ps_client_stop_at_sized(mon, 0, 5, 0, st, old), PS_ESTATE);
	for (size_t i = old; i < sizeof(struct ps_shard_stats) + 64; i++)
		ck_assert_msg(buf[i] == 0xA5, "stop: byte %zu past the caller's %zu written", i, old);
	memset(buf, 0xA5, sizeof(struct ps_shard_stats) + 64);
	ck_assert_int_eq(ps_client_stop_at_sized(mon, 0, 5, 0, st, sizeof(*st) + 64), PS_ESTATE);
	for (size_t i = sizeof(*st); i < sizeof(*st) + 64; i++)
		ck_assert_msg(buf[i] == 0, "stop: byte %zu past the library's struct not zeroed", i);
	ck_assert_int_eq(ps_client_stop_at_sized(mon, 0, 5, 0, st, 2), -EINVAL);
	ck_assert_int_eq(ps_client_stop_at(mon, 1, 5, 0, &whole), -EINVAL);
	ck_assert_int_eq(ps_client_stop_at(mon, -1, 5, 0, &whole), -EINVAL);
	ck_assert_int_eq(ps_client_stop_at(mon, 0, 0, 0, &whole), -EINVAL);
	ck_assert_int_eq(ps_client_stop_at_sized(mon, 0, 5, 0, NULL, sizeof(whole)), -EINVAL);
	ps_client_free(mon);
	/* a shard outside the config: refused, nothing sent */
	ck_assert_int_eq(ps_client_stats(c0, 1, &whole), -EINVAL);
	ck_assert_int_eq(ps_client_stats(c0, -1, &whole), -EINVAL);
	char why[100];
	ck_assert_ptr_null(ps_client_shard_error(c0, 1, why, sizeof(why)));
	ck_assert_ptr_null(ps_client_shard_error(c0, -1, why, sizeof(why)));
	ck_assert_ptr_null(ps_client_shard_error(c0, 0, why, sizeof(why))); /* ready */
	free(buf);
	ps_client_free(c0);
	ps_config_close(cfg);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	unlink(path);
}
END_TEST

/* ps_client_init refuses a rank outside the workers at once, naming it and
 * the range, before it connects to anything (no shard is started): rank 2
 * of 2 workers (the first past the end), and -3, below the reader's. */
START_TEST(test_rank_outside_workers)
{
	struct ps_config *cfg = start_cluster(0);
	struct ps_client *c = (struct ps_client *)1;
	char err[512] = "";
	double t0 = ps_now_s();

	ck_assert_int_eq(ps_client_init(&c, cfg, 2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, "rank 2 outside 0..1 (cluster.workers is 2)"), "%s", err);
	err[0] = 0;
	ck_assert_int_eq(ps_client_init(&c, cfg, PS_RANK_READER - 1, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "rank -3: a worker rank is 0 or more"), "%s", err);
	ck_assert_msg(ps_now_s() - t0 < 1.0, "refusing a rank took %.2f s", ps_now_s() - t0);
	ps_config_close(cfg);
	unlink(path);
}
END_TEST

/* A socket listening on 127.0.0.1:port that never accepts: the kernel
 * completes the connections, nobody reads or answers them. */
static int listen_silent(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	ck_assert_int_ge(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(fd, 8), 0);
	return fd;
}

/* Shards a client cannot reach, each named with the limit that ran out:
 * a worker whose shard's name never resolves (a .invalid name) fails
 * after limits.connect_timeout_ms, PS_ERESOLVE, naming the shard, its
 * address and the limit; a monitor whose shard accepts the connection and
 * never answers the Hello starts anyway, and that shard's error names the
 * handshake that did not come within the limit. */
START_TEST(test_unreachable_shard_named)
{
	struct ps_config *cfg;
	struct ps_client *c = NULL;
	char yaml[1024], err[512] = "", why[512];
	int port = tu_free_port();
	double t0;

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [nosuch.invalid:%d]\n  workers: 1\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [10], init: zeros}\n"
		 "limits:\n  connect_timeout_ms: 1000\n"
		 "log:\n  level: warn\n", port);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_open(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	t0 = ps_now_s();
	ck_assert_int_eq(ps_client_init(&c, cfg, 0, err, sizeof(err)), PS_ERESOLVE);
	double took = ps_now_s() - t0;
	snprintf(why, sizeof(why), "shard 0 (nosuch.invalid:%d): the name did not resolve within "
		 "1000 ms (limits.connect_timeout_ms)", port);
	ck_assert_msg(strstr(err, why), "%s", err);
	ck_assert_msg(took >= 0.95 && took < 5.0 * tu_time_scale(), "gave up after %.2f s, "
		      "limits.connect_timeout_ms is 1000", took);
	ps_config_close(cfg);
	unlink(path);

	/* a listener that takes the connection and never says a word */
	int lfd = listen_silent(port);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [10], init: zeros}\n"
		 "limits:\n  connect_timeout_ms: 500\n"
		 "log:\n  level: warn\n", port);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_open(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	t0 = ps_now_s();
	ck_assert_msg(ps_client_init(&c, cfg, -1, err, sizeof(err)) == 0, "monitor: %s", err);
	took = ps_now_s() - t0;
	ck_assert_ptr_nonnull(ps_client_shard_error(c, 0, why, sizeof(why)));
	ck_assert_msg(strstr(why, "no handshake within 500 ms (limits.connect_timeout_ms)") &&
		      strstr(why, "shard 0 (127.0.0.1:"), "%s", why);
	ck_assert_msg(took >= 0.45 && took < 5.0 * tu_time_scale(), "the monitor started after "
		      "%.2f s, limits.connect_timeout_ms is 500", took);
	ps_client_free(c);
	close(lfd);
	ps_config_close(cfg);
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("client_api");
	TCase *tc = tcase_create("client_api");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_config_handle);
	TU_ADD(tc, test_wait_timeout_and_done);
	TU_ADD(tc, test_stats_sized);
	TU_ADD(tc, test_rank_outside_workers);
	TU_ADD(tc, test_unreachable_shard_named);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
