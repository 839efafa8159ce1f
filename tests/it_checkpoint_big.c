/* it_checkpoint_big.c - a shard checkpoint over 4 GiB (server/checkpoint.c):
 * written on SIGTERM and loaded again by the restarted shard. Its own
 * program, apart from it_checkpoint's cases: it is CPU-bound for 45 to 90 s
 * (filling, checksumming and writing 4.4 GB) and `make test` runs it in a
 * lane beside the others (Makefile IT_BESIDE), off the main lane's path. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "test_client.h"
#include "test_util.h"

static char dir[64], path[64];
static struct ps_config cfg;
static pid_t srv;

/* A checkpoint over 4 GiB (a 4.4 GB tensor beside a small one) is written
 * and loads: its checksum covers every byte with 64-bit lengths (a 32-bit
 * length used to wrap, and the shard refused its own file). 45 to 90 s
 * and 9 GB of memory here (the state and its snapshot). */
START_TEST(test_checkpoint_over_4gib)
{
	enum { SMALL = 16 };
	static float g[SMALL], w[SMALL];
	char yaml[1024], err[512];
	int port = tu_free_port();

	if (getenv("PS_TEST_VALGRIND")) {
		tu_skip("a 4.4 GB shard under valgrind would take hours");
		return;
	}
	if (getenv("PS_TEST_QUICK")) { /* make mutate: one minute per mutant is too long */
		tu_skip("PS_TEST_QUICK is set (the 4.4 GB checkpoint takes about a minute)");
		return;
	}
	strcpy(dir, "/tmp/ps-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: big, shape: [1100000000], init: arange}\n"
		 "    - {name: small, shape: [%d], init: arange}\n"
		 "limits:\n  connect_timeout_ms: 120000\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "log:\n  level: warn\n", port, SMALL, dir);
	path[0] = 0;
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv = tu_start_server(path, 0);
	/* the shard fills 4.4 GB first */
	struct ps_client *c = tu_connect_while_up(&cfg, 0, srv, 180);
	/* three clocks that touch only the small tensor */
	struct ps_tensor tg = { .name = "small", .data = g, .count = SMALL };
	for (uint64_t k = 0; k < 3; k++) {
		for (int i = 0; i < SMALL; i++)
			g[i] = (float)(i % 3 + 1);
		int64_t p = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(p > 0 && ps_client_wait(c, p) == 0, "%s", ps_client_error(c));
	}
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv), 0); /* SIGTERM: the checkpoint */
	char ck[200];
	struct stat st;
	snprintf(ck, sizeof(ck), "%s/shard-0.ckpt", dir);
	ck_assert_int_eq(stat(ck, &st), 0);
	ck_assert_int_gt(st.st_size, (off_t)(UINT64_C(1) << 32));
	/* it loads: the clock and the small tensor's weights come back */
	srv = tu_start_server(path, 0);
	c = tu_connect_while_up(&cfg, 0, srv, 180);
	ck_assert_uint_eq(ps_client_clock(c), 3);
	struct ps_tensor tw = { .name = "small", .data = w, .count = SMALL };
	int64_t q = ps_client_pull(c, 3, &tw, 1);
	ck_assert_int_eq(ps_client_wait(c, q), 0);
	for (int i = 0; i < SMALL; i++)
		ck_assert_msg(w[i] == (float)i - 3.0f * (float)(i % 3 + 1), "small[%d] = %g", i,
			      (double)w[i]);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	ck_assert_int_eq(tu_rmtree(dir), 0);
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("checkpoint_big");
	TCase *tc = tcase_create("over_4gib");

	tcase_set_timeout(tc, 300);
	TU_ADD(tc, test_checkpoint_over_4gib);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
