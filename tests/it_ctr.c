/* it_ctr.c - the ctr preset end to end: ps-ctrgen writes a click log and
 * a held-out continuation, 2 real shards and 2 ps-worker processes train
 * on it over loopback (embedding rows through pull_rows / push_rows), and
 * worker 0's held-out AUC after one epoch must be within 0.01 of the best
 * achievable AUC that ps-ctrgen prints for the held-out file: sync, then
 * async. Then the fields spread over tables of different dims (even
 * fields in one of dim 16, odd ones in one of dim 8, and a third table
 * that the model does not use): the same AUC bound, rows in both tables
 * the fields use on the shards (ps_client_stats), none in the third.
 * Also: the config is refused without an embedding table, and without its
 * click-log paths.
 *
 * PS_TEST_DEVICE=cuda trains with `train.device: cuda` (make gpu-check
 * does, on a GPU machine), and the workers' metrics must say so; by
 * default the config's auto picks the CPU here.
 *
 * Size: 600,000 training examples (scale 0.001: 9,266 categorical values)
 * and 50,000 held out; one epoch, batch 1024: about 12 s per run on the
 * 2-core test machine. Fewer examples leave the AUC short of the bound
 * (200,000: 0.013 below), more epochs overfit. */
#include <check.h>
#include <inttypes.h>
#include <fcntl.h>
#include <sys/stat.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_util.h"

static char tmpdir[64];
static double best_auc;         /* ps-ctrgen's ceiling for the held-out file */

static char *slurp(const char *path)
{
	static char buf[1 << 16];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* Writes the click logs once (suite setup): train.tsv and test.tsv. */
static void make_data(void)
{
	char train[128], test[128], out[128];
	const char *a1[] = { "bin/ps-ctrgen", "--out", train, "--samples", "600000", "--scale",
			     "0.001", "--seed", "3", NULL };
	const char *a2[] = { "bin/ps-ctrgen", "--out", test, "--samples", "50000", "--skip",
			     "600000", "--scale", "0.001", "--seed", "3", NULL };
	const char *p;

	snprintf(train, sizeof(train), "%s/train.tsv", tmpdir);
	snprintf(test, sizeof(test), "%s/test.tsv", tmpdir);
	snprintf(out, sizeof(out), "%s/gen.out", tmpdir);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a1, out)), 0);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a2, out)), 0);
	p = strstr(slurp(out), "best achievable AUC ");
	ck_assert_msg(p, "no AUC in ps-ctrgen's output: %s", slurp(out));
	best_auc = strtod(p + strlen("best achievable AUC "), NULL);
	ck_assert(best_auc > 0.6 && best_auc < 1.0);
}

/* PS_TEST_DEVICE, the device the workers are to train on; NULL: the
 * config's default (auto). */
static const char *test_device(void)
{
	const char *dev = getenv("PS_TEST_DEVICE");

	return dev && *dev ? dev : NULL;
}

/* A 2-shard, 2-worker ctr config on fresh ports; model adds keys to the
 * model section, train to the train section. */
static void write_cfg(char *path, const char *mode, const char *model, const char *train)
{
	const char *dev = test_device();
	char y[2048];

	snprintf(y, sizeof(y),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "consistency: {mode: %s}\nseed: 7\n"
		 "model:\n  preset: ctr\n%s"
		 "optimizer: {name: adam, lr: 0.001}\n"
		 "train: {batch: 1024, epochs: 1, metrics_dir: '%s'%s%s%s%s}\n"
		 "log: {level: warn}\n",
		 tu_free_port(), tu_free_port(), mode, model, tmpdir, *train ? ", " : "", train,
		 dev ? ", device: " : "", dev ? dev : "");
	ck_assert_int_eq(tu_write_temp(path, y), 0);
}

#define TABLE "  embeddings:\n    - {name: cat, dim: 16, init: uniform, scale: 0.01, " \
	      "optimizer: rowwise_adagrad, lr: 0.05}\n"

/* The even fields in table ev (dim 16), the odd ones in od (dim 8), and a
 * table the ctr model leaves to other clients. */
#define TABLES3 "  embeddings:\n" \
	"    - {name: ev, dim: 16, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, " \
	"lr: 0.05, fields: [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24]}\n" \
	"    - {name: od, dim: 8, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, " \
	"lr: 0.05, fields: [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25]}\n" \
	"    - {name: other, dim: 4, fields: []}\n"

/* Rows and rows pushed of each table (at most 4), summed over the 2 shards
 * of cfg, through a monitor connection. */
static void table_rows(const char *cfg, int ntables, uint64_t *rows, uint64_t *pushed)
{
	static struct ps_config c;
	struct ps_client *mon = NULL;
	char err[512];

	ck_assert_msg(ps_config_load(&c, cfg, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_client_init(&mon, &c, -1, err, sizeof(err)) == 0, "%s", err);
	for (int t = 0; t < ntables; t++)
		rows[t] = pushed[t] = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_int_eq(st.ntables, ntables);
		for (int t = 0; t < ntables; t++) {
			rows[t] += st.tables[t].rows;
			pushed[t] += st.tables[t].pushed_rows;
		}
	}
	ps_client_free(mon);
}

/* Trains mode with 2 shards and 2 workers and the model's tables; worker
 * 0's held-out AUC, and per table (ntables) its rows and rows pushed. */
static double train(const char *mode, const char *tables, int ntables, uint64_t *rows,
		    uint64_t *pushed, char *metrics, size_t mlen)
{
	char cfg[64], tr[300], out[2][128], mpath[128], rank[2][4];
	const char *argv[2][6];
	pid_t srv[2], w[2];
	const char *p;
	double auc;

	snprintf(tr, sizeof(tr), "train_file: '%s/train.tsv', test_file: '%s/test.tsv'", tmpdir,
		 tmpdir);
	write_cfg(cfg, mode, tables, tr);
	for (int i = 0; i < 2; i++)
		srv[i] = tu_start_server(cfg, i);
	double t0 = ps_now_s();
	for (int r = 0; r < 2; r++) {
		snprintf(out[r], sizeof(out[r]), "%s/worker-%d.out", tmpdir, r);
		snprintf(rank[r], sizeof(rank[r]), "%d", r);
		const char *a[] = { "bin/ps-worker", "--config", cfg, "--rank", rank[r], NULL };
		memcpy(argv[r], a, sizeof(a));
		w[r] = tu_spawn(argv[r], out[r]);
	}
	for (int r = 0; r < 2; r++) {
		int st = tu_wait_child(w[r]);
		ck_assert_msg(st == 0, "worker %d exited %d:\n%s", r, st, slurp(out[r]));
	}
	/* progress (stderr not a terminal): a line at the epoch's first step,
	 * then one each 10 s, not one a step */
	double took = ps_now_s() - t0;
	for (int r = 0; r < 2; r++) {
		int lines = 0;
		for (p = slurp(out[r]); (p = strstr(p, "epoch 1/1  step ")); p++)
			lines++;
		ck_assert_msg(lines >= 1 && lines <= 2 + (int)(took / 10), "worker %d: %d progress "
			      "lines in %.1f s (one at the start, then one each 10 s):\n%.1500s", r,
			      lines, took, slurp(out[r]));
	}
	table_rows(cfg, ntables, rows, pushed);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(tu_stop_server(srv[i]), 0);
	p = strstr(slurp(out[0]), "epoch 1 test auc ");
	ck_assert_msg(p, "no AUC line:\n%s", slurp(out[0]));
	auc = strtod(p + strlen("epoch 1 test auc "), NULL);
	snprintf(mpath, sizeof(mpath), "%s/worker-0.jsonl", tmpdir);
	snprintf(metrics, mlen, "%.*s", (int)mlen - 1, slurp(mpath));
	ck_assert_msg(strstr(metrics, "\"test_auc\":") && strstr(metrics, "\"test_logloss\":") &&
		      strstr(metrics, "\"samples_per_s\":"), "metrics: %s", metrics);
	/* trained where PS_TEST_DEVICE asked, never fallen back to the CPU */
	const char *dev = test_device() ? test_device() : "cpu";
	char want[64];
	snprintf(want, sizeof(want), "\"device\":\"%s\"", dev);
	ck_assert_msg(strstr(metrics, want), "worker 0 trained elsewhere than %s: %s", want,
		      metrics);
	fprintf(stderr, "ctr %s on %s: worker 0 %.0f samples/s, %.1f s for 2 workers\n", mode, dev,
		strtod(strstr(metrics, "\"samples_per_s\":") + strlen("\"samples_per_s\":"), NULL),
		took);
	unlink(mpath);
	snprintf(mpath, sizeof(mpath), "%s/worker-1.jsonl", tmpdir);
	unlink(mpath);
	unlink(cfg);
	return auc;
}

START_TEST(test_sync_and_async_reach_the_ceiling)
{
	char m[4096];
	uint64_t rows[4], pushed[4];
	double auc;

	make_data();
	auc = train("sync", TABLE, 1, rows, pushed, m, sizeof(m));
	fprintf(stderr, "ctr sync: held-out AUC %.4f, best achievable %.4f\n", auc, best_auc);
	ck_assert_msg(auc >= best_auc - 0.01, "sync AUC %.4f, ceiling %.4f", auc, best_auc);
	auc = train("async", TABLE, 1, rows, pushed, m, sizeof(m));
	fprintf(stderr, "ctr async: held-out AUC %.4f, best achievable %.4f\n", auc, best_auc);
	ck_assert_msg(auc >= best_auc - 0.01, "async AUC %.4f, ceiling %.4f", auc, best_auc);
	ck_assert_uint_gt(rows[0], 0);
	/* the fields over two tables of different dims, and one unused */
	auc = train("sync", TABLES3, 3, rows, pushed, m, sizeof(m));
	fprintf(stderr, "ctr sync, 3 tables: held-out AUC %.4f, best achievable %.4f; rows %"
		PRIu64 " (dim 16), %" PRIu64 " (dim 8), %" PRIu64 " (unused)\n", auc, best_auc,
		rows[0], rows[1], rows[2]);
	ck_assert_msg(auc >= best_auc - 0.01, "3 tables: AUC %.4f, ceiling %.4f", auc, best_auc);
	/* every even field's values in ev, every odd one's in od: with ids
	 * mixed with the field (ps_criteo_id), two tables of about half the
	 * categorical values each, both trained */
	ck_assert_uint_gt(rows[0], 1000);
	ck_assert_uint_gt(rows[1], 1000);
	ck_assert_uint_gt(pushed[0], 0);
	ck_assert_uint_gt(pushed[1], 0);
	ck_assert_uint_eq(rows[2], 0);
	ck_assert_uint_eq(pushed[2], 0);
}
END_TEST

/* ctr without a table, or without its files: refused with a reason. */
START_TEST(test_config_errors)
{
	char cfg[64], out[128], err[512];
	static struct ps_config c;
	const char *argv[] = { "bin/ps-worker", "--config", cfg, "--rank", "0", NULL };

	write_cfg(cfg, "sync", "", "");
	ck_assert_int_eq(ps_config_load(&c, cfg, err, sizeof(err)), PS_ECONFIG);
	ck_assert_msg(strstr(err, ":7: key 'model.preset': ctr bags its categorical fields"),
		      "%s", err);
	unlink(cfg);
	write_cfg(cfg, "sync", TABLE, "");
	ck_assert_int_eq(ps_config_load(&c, cfg, err, sizeof(err)), 0);
	ck_assert_int_eq(c.model.input[2], 26 * 16 + 13);
	unlink(cfg);
	write_cfg(cfg, "sync", TABLES3, "");
	ck_assert_int_eq(ps_config_load(&c, cfg, err, sizeof(err)), 0);
	ck_assert_int_eq(c.model.input[2], 13 * 16 + 13 * 8 + 13);
	ck_assert_int_eq(c.model.classes, 2);
	ck_assert_int_eq(c.ntensors, 6);
	snprintf(out, sizeof(out), "%s/nofile.out", tmpdir);
	ck_assert_int_ne(tu_wait_child(tu_spawn(argv, out)), 0);
	ck_assert_msg(strstr(slurp(out), "set train.train_file and train.test_file"), "%s",
		      slurp(out));
	unlink(cfg);
}
END_TEST

/* ps-worker's ctr preset when training cannot go on: a click log with
 * fewer examples than a batch is refused with both numbers; a shard killed
 * (SIGKILL) mid-training ends both workers within the reconnect limit
 * (1 s) with status 1 and the clock and shard at fault, never a hang. */
START_TEST(test_worker_errors)
{
	char cfg[64], y[2048], out[2][128], rank[2][4], few[128], fewout[128];
	const char *gen[] = { "bin/ps-ctrgen", "--out", few, "--samples", "10", "--scale",
			      "0.001", "--seed", "3", NULL };
	int port[2] = { tu_free_port(), tu_free_port() };
	pid_t srv[2], w[2];

	snprintf(few, sizeof(few), "%s/few.tsv", tmpdir);
	snprintf(fewout, sizeof(fewout), "%s/few.out", tmpdir);
	ck_assert_int_eq(tu_wait_child(tu_spawn(gen, fewout)), 0);
	for (int f = 0; f < 2; f++) {
		char trainf[160];
		/* 0: the whole click log; 1: ten examples */
		if (f)
			snprintf(trainf, sizeof(trainf), "%s", few);
		else
			snprintf(trainf, sizeof(trainf), "%s/train.tsv", tmpdir);
		if (!f && access(trainf, F_OK))
			make_data(); /* when run alone */
		snprintf(y, sizeof(y),
			 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
			 "consistency: {mode: sync}\nseed: 7\n"
			 "model:\n  preset: ctr\n" TABLE
			 "optimizer: {name: adam, lr: 0.001}\n"
			 "train: {batch: 1024, epochs: 1, train_file: '%s', test_file: '%s/test.tsv'}\n"
			 "limits: {reconnect_timeout_ms: 1000, request_timeout_ms: 20000}\n"
			 "log: {level: info}\n", port[0], port[1], trainf, tmpdir);
		ck_assert_int_eq(tu_write_temp(cfg, y), 0);
		for (int i = 0; i < 2; i++)
			srv[i] = tu_start_server(cfg, i);
		for (int r = 0; r < 2; r++) {
			snprintf(out[r], sizeof(out[r]), "%s/err-%d-%d.out", tmpdir, f, r);
			snprintf(rank[r], sizeof(rank[r]), "%d", r);
			const char *a[] = { "bin/ps-worker", "--config", cfg, "--rank", rank[r], NULL };
			w[r] = tu_spawn(a, out[r]);
		}
		if (f) {
			for (int r = 0; r < 2; r++) {
				ck_assert_int_eq(tu_wait_exit(w[r]), 1);
				ck_assert_msg(strstr(slurp(out[r]), "10 examples give no full batch of "
						     "1024"), "worker %d:\n%s", r, slurp(out[r]));
			}
		} else {
			/* training: its first clocks ended on shard 1 */
			int t;
			for (t = 0; t < 600 && !strstr(slurp(out[0]), "training ctr"); t++)
				tu_sleep_ms(100);
			ck_assert_msg(t < 600, "worker 0 did not start training:\n%s", slurp(out[0]));
			tu_sleep_ms(1000);
			kill(srv[1], SIGKILL);
			tu_wait_child(srv[1]);
			double t0 = ps_now_s();
			for (int r = 0; r < 2; r++) {
				char want[160];
				int st = tu_wait_exit(w[r]);
				ck_assert_msg(st == 1, "worker %d exited %d after shard 1's kill:\n%s", r,
					      st, slurp(out[r]));
				snprintf(want, sizeof(want), "shard 1 (127.0.0.1:%d): unreachable for 1000 "
					 "ms (limits.reconnect_timeout_ms)", port[1]);
				ck_assert_msg(strstr(slurp(out[r]), " at clock ") &&
					      strstr(slurp(out[r]), want), "worker %d does not name the "
					      "clock and %s:\n%s", r, want, slurp(out[r]));
			}
			ck_assert_msg(ps_now_s() - t0 < 30 * tu_time_scale(), "the workers took %.1f s "
				      "to give up", ps_now_s() - t0);
		}
		for (int i = 0; i < 2; i++)
			if (f || i == 0)
				ck_assert_int_eq(tu_stop_server(srv[i]), 0);
		unlink(cfg);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ctr");
	TCase *tc = tcase_create("cluster");
	int failed;

	tu_secret_setup();
	setenv("OPENBLAS_NUM_THREADS", "1", 1); /* the workers inherit it */
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ps-it-ctr-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	tcase_set_timeout(tc, 300);
	TU_ADD(tc, test_config_errors);
	TU_ADD(tc, test_sync_and_async_reach_the_ceiling);
	TU_ADD(tc, test_worker_errors);
	suite_add_tcase(s, tc);
	failed = tu_run_suite_as(s, 1);
	tu_rmtree(tmpdir);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
