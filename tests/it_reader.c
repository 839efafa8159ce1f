/* it_reader.c - the read-only role against real shards (docs/security.md,
 * "Readers"):
 *  - a reader (PS_RANK_READER, proving the reader key) pulls the dense
 *    tensors and rows a worker pulls, bit for bit, and is no worker: the
 *    worker's sync clocks go on without it;
 *  - every state-changing request it sends (push, row push, checkpoint,
 *    and on a config without a model, declare) is refused with an Error
 *    naming it, counted in reader_refused, and changes nothing: the
 *    shards' parameter checksums, every row, the table versions and the
 *    checkpoint folder stay as they were; its connection stays open;
 *  - a wrong reader key is refused; the cluster secret cannot act as a
 *    reader, the reader key cannot act as a worker or a monitor; a shard
 *    started without a reader key refuses readers with the reason, and a
 *    shard whose reader key file holds the cluster secret does not start.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "test_util.h"

#define NA 3000
#define NB 500
#define NROWS 200
#define DIM 4

static char cfg_path[64], ckdir[64], reader_key[64], other_key[64];
static char slog[2][80];  /* the shards' logs */
static struct ps_config cfg;
static pid_t srv[2];

/* Two shards, one sync worker, tensors a and b (or declared ones), table e
 * of dim 4, checkpoints on request into a fresh folder. */
static void start(int declare)
{
	char yaml[1500], err[512];
	int port[2] = { tu_free_port(), tu_free_port() };

	while (port[1] == port[0])
		port[1] = tu_free_port();
	strcpy(ckdir, "/tmp/ps-reader-ck-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(ckdir));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [\"%s:%d\", \"%s:%d\"]\n  workers: 1\n"
		 "consistency:\n  mode: sync\nslice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 0.5\n"
		 "model:\n%s"
		 "  embeddings:\n    - {name: e, dim: %d, init: uniform, scale: 0.1, optimizer: sgd, lr: 1}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "limits:\n  connect_timeout_ms: 3000\n  request_timeout_ms: 10000\n"
		 "  reconnect_timeout_ms: 0\nlog:\n  level: warn\n",
		 tu_host(), port[0], tu_host(), port[1],
		 declare ? "" : "  tensors:\n    - {name: a, shape: [3000], init: uniform, scale: 1}\n"
				"    - {name: b, shape: [500], init: zeros}\n",
		 DIM, ckdir);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 2; k++) {
		/* each shard's log beside the checkpoint folder (not in it) */
		snprintf(slog[k], sizeof(slog[k]), "%s-%d.log", ckdir, k);
		srv[k] = tu_start_server_log(cfg_path, k, slog[k]);
	}
	/* until both listen (or one exited: then the caller sees it) */
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < 200; i++) {
			struct sockaddr_in sa = { .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)port[k]),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
			ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
			if (fd >= 0)
				close(fd);
			siginfo_t si = { 0 };
			if (ok || (waitid(P_PID, (id_t)srv[k], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
				   si.si_pid))
				break;
			tu_sleep_ms(50);
		}
}

static void stop(void)
{
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(tu_stop_server(srv[k]) == 0, "shard %d did not stop cleanly (log %s)",
			      k, slog[k]);
		unlink(slog[k]);
	}
	unlink(cfg_path);
	tu_rmtree(ckdir);
}

/* A client of rank (retrying while the shards start); rc its result. */
static int connect_as(struct ps_client **c, int rank, char *err, size_t errlen)
{
	int rc = 0;

	for (int i = 0; i < 100; i++) {
		rc = ps_client_init(c, &cfg, rank, err, errlen);
		if (rc != -ECONNREFUSED && rc != PS_ECLOSED)
			break;
		tu_sleep_ms(100);
	}
	return rc;
}

static uint64_t ids[NROWS];

/* A few clocks of dense and row pushes from worker w. */
static void train(struct ps_client *w, int clocks)
{
	static float ga[NA], gb[NB], rg[NROWS * DIM];
	struct ps_tensor t[2] = { { .name = "a", .data = ga, .count = NA },
				  { .name = "b", .data = gb, .count = NB } };

	for (int i = 0; i < NROWS; i++)
		ids[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	for (int c = 0; c < clocks; c++) {
		uint64_t clock = ps_client_clock(w);
		for (int i = 0; i < NA; i++)
			ga[i] = (float)((i * 7 + c) % 13) * 0.01f;
		for (int i = 0; i < NB; i++)
			gb[i] = (float)((i + c) % 5) * 0.1f;
		for (int i = 0; i < NROWS * DIM; i++)
			rg[i] = (float)((i * 3 + c) % 11) * 0.05f;
		ck_assert_msg(ps_client_push_rows(w, "e", clock, ids, NROWS, rg, 0) == 0, "%s",
			      ps_client_error(w));
		int64_t id = ps_client_push(w, clock, t, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(w, id) == 0, "%s", ps_client_error(w));
	}
}

/* c's pull of a, b and every row. */
static void pull_all(struct ps_client *c, uint64_t min_version, float *a, float *b, float *rows)
{
	struct ps_tensor t[2] = { { .name = "a", .data = a, .count = NA },
				  { .name = "b", .data = b, .count = NB } };
	int64_t id = ps_client_pull(c, min_version, t, 2);

	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	ck_assert_msg(ps_client_pull_rows(c, "e", 0, ids, NROWS, rows) == 0, "%s",
		      ps_client_error(c));
}

static int files_in(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

START_TEST(test_reader_pulls_what_a_worker_pulls)
{
	static float wa[NA], wb[NB], wr[NROWS * DIM], ra[NA], rb[NB], rr[NROWS * DIM];
	struct ps_client *w, *r;
	char err[512];

	start(0);
	ck_assert_msg(connect_as(&r, PS_RANK_READER, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(connect_as(&w, 0, err, sizeof(err)) == 0, "%s", err);
	/* sync with one worker: its clocks complete although a reader is
	 * connected (a reader is no worker) */
	train(w, 3);
	pull_all(w, 3, wa, wb, wr);
	struct ps_shard_stats st0[2];
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stats(w, k, &st0[k]) == 0, "%s", ps_client_error(w));
	pull_all(r, 3, ra, rb, rr);
	ck_assert(!memcmp(wa, ra, sizeof(wa)) && !memcmp(wb, rb, sizeof(wb)));
	ck_assert(!memcmp(wr, rr, sizeof(wr)));
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_msg(ps_client_stats(r, k, &st) == 0, "%s", ps_client_error(r));
		ck_assert_int_eq(st.nworkers, 1);
		ck_assert_uint_eq(st.worker_clock[0], 3);
		ck_assert_uint_eq(st.reader_refused, 0);
		/* the reader keeps no clock (its pull names clock 0, below
		 * the worker's 3): the largest gap a pull was let through at
		 * is the worker's alone, the same as before the reader came */
		ck_assert_msg(st.max_clock_gap == st0[k].max_clock_gap && st.max_clock_gap <= 1,
			      "shard %d: max_clock_gap %" PRIu64 " after the reader's pull, %" PRIu64
			      " before", k, st.max_clock_gap, st0[k].max_clock_gap);
	}
	ps_client_free(r);
	ps_client_free(w);
	stop();
}
END_TEST

START_TEST(test_reader_changes_nothing)
{
	static float a0[NA], b0[NB], r0[NROWS * DIM], a1[NA], b1[NB], r1[NROWS * DIM];
	static float g[NA], rg[NROWS * DIM];
	struct ps_shard_stats before[2], after[2];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };
	struct ps_client *w, *r;
	char err[512];
	int64_t id;
	int rc;

	start(0);
	ck_assert_msg(connect_as(&w, 0, err, sizeof(err)) == 0, "%s", err);
	train(w, 2);
	ck_assert_msg(connect_as(&r, PS_RANK_READER, err, sizeof(err)) == 0, "%s", err);
	pull_all(r, 2, a0, b0, r0);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(ps_client_stats(r, k, &before[k]), 0);
	for (int i = 0; i < NA; i++)
		g[i] = 1.0f;
	for (int i = 0; i < NROWS * DIM; i++)
		rg[i] = 1.0f;
	/* a dense push, for the worker's next clock and for an old one */
	for (int clock = 2; clock >= 0; clock -= 2) {
		id = ps_client_push(r, (uint64_t)clock, &t, 1, PS_PUSH_END_CLOCK);
		rc = id < 0 ? (int)id : ps_client_wait(r, id);
		ck_assert_int_eq(rc, PS_EREFUSED);
		ck_assert_msg(strstr(ps_client_error(r), "a reader may only pull: push refused"),
			      "%s", ps_client_error(r));
	}
	rc = ps_client_push_rows(r, "e", 2, ids, NROWS, rg, 0);
	ck_assert_int_eq(rc, PS_EREFUSED);
	ck_assert_msg(strstr(ps_client_error(r), "a reader may only pull: row push refused"),
		      "%s", ps_client_error(r));
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		rc = ps_client_checkpoint(r, k, 1, &st);
		ck_assert_int_eq(rc, PS_EREFUSED);
		ck_assert_msg(strstr(ps_client_error(r), "checkpoint refused"), "%s",
			      ps_client_error(r));
	}
	ck_assert_int_eq(files_in(ckdir), 0);
	/* nothing changed, and the reader still reads */
	pull_all(r, 2, a1, b1, r1);
	ck_assert(!memcmp(a0, a1, sizeof(a0)) && !memcmp(b0, b1, sizeof(b0)));
	ck_assert(!memcmp(r0, r1, sizeof(r0)));
	uint64_t refused = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(r, k, &after[k]), 0);
		ck_assert_uint_eq(after[k].param_checksum, before[k].param_checksum);
		ck_assert_uint_eq(after[k].tables[0].version, before[k].tables[0].version);
		ck_assert_uint_eq(after[k].tables[0].rows, before[k].tables[0].rows);
		ck_assert_uint_eq(after[k].worker_clock[0], 2);
		refused += after[k].reader_refused;
	}
	/* 2 dense pushes + 1 row push reach both shards (sync: every shard
	 * gets the row push frame), 1 checkpoint request each */
	ck_assert_uint_eq(refused, 2 * 2 + 2 + 2);
	/* the worker goes on as before */
	train(w, 1);
	ps_client_free(r);
	ps_client_free(w);
	stop();
}
END_TEST

/* A reader's refused requests are each counted, and logged one by one up
 * to 16, then at each power of two (a reader that keeps asking does not
 * flood the log): 40 refused checkpoint requests, 17 lines. */
START_TEST(test_reader_refusals_logged)
{
	struct ps_shard_stats st;
	struct ps_client *r;
	char err[512], line[200];
	int lines = 0, at[40], nat = 0;

	start(0);
	ck_assert_msg(connect_as(&r, PS_RANK_READER, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < 40; i++)
		ck_assert_int_eq(ps_client_checkpoint(r, 0, 1, &st), PS_EREFUSED);
	ck_assert_int_eq(ps_client_stats(r, 0, &st), 0);
	ck_assert_uint_eq(st.reader_refused, 40);
	ck_assert_int_eq(ps_client_stats(r, 1, &st), 0);
	ck_assert_uint_eq(st.reader_refused, 0);
	ps_client_free(r);
	FILE *f = fopen(slog[0], "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "checkpoint refused (a reader may only pull; ");
		if (!p)
			continue;
		lines++;
		if (nat < 40)
			at[nat++] = atoi(p + strlen("checkpoint refused (a reader may only pull; "));
	}
	fclose(f);
	ck_assert_msg(lines == 17, "%d lines of refusals logged for 40 (17 due: 1..16 and 32; "
		      "log %s)", lines, slog[0]);
	for (int i = 0; i < 16; i++)
		ck_assert_int_eq(at[i], i + 1);
	ck_assert_int_eq(at[16], 32);
	stop();
}
END_TEST

START_TEST(test_reader_declare_refused)
{
	static float a[64];
	int64_t dims[1] = { 64 };
	struct ps_param p = { .name = "w", .ndims = 1, .dims = dims, .data = a };
	struct ps_client *w, *r;
	char err[512];

	start(1);
	ck_assert_msg(connect_as(&r, PS_RANK_READER, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_client_declare(r, &p, 1), PS_EREFUSED);
	ck_assert_msg(strstr(ps_client_error(r), "a reader may only pull: declare refused"),
		      "%s", ps_client_error(r));
	ck_assert_msg(connect_as(&w, 0, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < 64; i++)
		a[i] = (float)i;
	ck_assert_msg(ps_client_declare(w, &p, 1) == 0, "%s", ps_client_error(w));
	ps_client_free(w);
	ps_client_free(r);
	stop();
}
END_TEST

START_TEST(test_reader_keys)
{
	struct ps_client *c;
	char err[512], saved_secret[256], saved_reader[256];
	int rc;

	snprintf(saved_secret, sizeof(saved_secret), "%s", getenv("PS_SECRET_FILE"));
	snprintf(saved_reader, sizeof(saved_reader), "%s", getenv("PS_READER_KEY_FILE"));
	start(0);
	ck_assert_msg(connect_as(&c, PS_RANK_READER, err, sizeof(err)) == 0, "%s", err);
	ps_client_free(c);
	/* a reader with another key */
	setenv("PS_READER_KEY_FILE", other_key, 1);
	rc = connect_as(&c, PS_RANK_READER, err, sizeof(err));
	ck_assert_int_eq(rc, PS_EAUTH);
	ck_assert_msg(strstr(err, "reader key"), "%s", err);
	/* the cluster secret does not make a reader */
	setenv("PS_READER_KEY_FILE", saved_secret, 1);
	ck_assert_int_eq(connect_as(&c, PS_RANK_READER, err, sizeof(err)), PS_EAUTH);
	/* the reader key makes no worker and no monitor */
	setenv("PS_READER_KEY_FILE", saved_reader, 1);
	setenv("PS_SECRET_FILE", saved_reader, 1);
	ck_assert_int_eq(connect_as(&c, 0, err, sizeof(err)), PS_EAUTH);
	ck_assert_int_eq(connect_as(&c, -1, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_shard_error(c, 0, err, sizeof(err)) != NULL, "monitor connected");
	ck_assert_msg(strstr(err, "secret"), "%s", err);
	ps_client_free(c);
	setenv("PS_SECRET_FILE", saved_secret, 1);
	/* a reader without a key of its own is told where to put one */
	unsetenv("PS_READER_KEY_FILE");
	ck_assert_int_eq(ps_client_init(&c, &cfg, PS_RANK_READER, err, sizeof(err)), PS_EAUTH);
	ck_assert_msg(strstr(err, "security.reader_key_file"), "%s", err);
	stop();
	/* shards without a reader key refuse readers, saying why */
	start(0);
	setenv("PS_READER_KEY_FILE", saved_reader, 1);
	rc = connect_as(&c, PS_RANK_READER, err, sizeof(err));
	ck_assert_int_eq(rc, PS_EREFUSED);
	ck_assert_msg(strstr(err, "no reader key"), "%s", err);
	stop();
	/* a reader key file holding the cluster secret: the shard does not start */
	setenv("PS_READER_KEY_FILE", saved_secret, 1);
	start(0);
	for (int k = 0; k < 2; k++)
		ck_assert_int_ne(tu_wait_child(srv[k]), 0);
	unlink(cfg_path);
	tu_rmtree(ckdir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reader");
	TCase *tc = tcase_create("reader");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	if (tu_write_secret(reader_key) || tu_write_secret(other_key))
		return 1;
	setenv("PS_READER_KEY_FILE", reader_key, 1);
	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_reader_pulls_what_a_worker_pulls);
	TU_ADD(tc, test_reader_changes_nothing);
	TU_ADD(tc, test_reader_declare_refused);
	TU_ADD(tc, test_reader_refusals_logged);
	TU_ADD(tc, test_reader_keys);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	unlink(reader_key);
	unlink(other_key);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
