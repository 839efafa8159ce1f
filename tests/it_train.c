/* it_train.c - end-to-end training: real ps-server and ps-worker processes
 * on loopback train on Fashion-MNIST (Debian's dataset-fashion-mnist).
 *
 * Sync (BSP) and async (SSP) runs must learn (test accuracy well above the
 * 10% of chance), two sync runs with the same seed must end bit-identical
 * (deterministic aggregation), and bad flags, a missing data folder and
 * `--device cuda` without a GPU (or with a CUDA plug-in that cannot load)
 * must fail with a clear message.
 *
 * PS_TEST_DEVICE=cuda runs the training cases with `train.device: cuda`
 * (make gpu-check does, on a GPU machine); by default the config's auto
 * picks the CPU here. */
#include <check.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include "compute.h"
#include "ps_err.h"
#include "test_util.h"

#define FMNIST "/usr/share/datasets/fashion-mnist"

static char tmpdir[64];

/* The dataset's folder: PS_TEST_DATA where the data is elsewhere (a GPU
 * machine's unpacked bundle, scripts/gpu-check.sh), else Debian's. */
static const char *data_dir(void)
{
	const char *d = getenv("PS_TEST_DATA");

	return d && *d ? d : FMNIST;
}

static int have_data(void)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/train-images-idx3-ubyte.gz", data_dir());
	if (access(p, R_OK) == 0)
		return 1;
	snprintf(p, sizeof(p), "%s/train-images-idx3-ubyte", data_dir());
	return access(p, R_OK) == 0;
}

/* Writes a 2-shard config on fresh ports: model preset, more keys of the
 * train section (train), more top-level YAML (extra). */
static void write_cfg(char *path, const char *model, const char *train, const char *extra)
{
	const char *dev = getenv("PS_TEST_DEVICE");
	char y[2048], data[600] = "";

	if (!strstr(train, "data_dir") && getenv("PS_TEST_DATA"))
		snprintf(data, sizeof(data), ", data_dir: '%s'", data_dir());

	snprintf(y, sizeof(y),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "seed: 7\nslice_bytes: 64KiB\n"
		 "model: {preset: %s}\n"
		 "train: {batch: 32, metrics_dir: '%s', %s%s%s%s}\n"
		 "log: {level: warn}\n%s",
		 tu_free_port(), tu_free_port(), model, tmpdir, train,
		 dev && *dev ? ", device: " : "", dev && *dev ? dev : "", data, extra);
	ck_assert_int_eq(tu_write_temp(path, y), 0);
}

/* Starts ps-worker with stdout+stderr into out (a file path). */
static pid_t start_worker(const char *cfg, int rank, const char *out, const char *const *extra)
{
	char r[16];
	const char *argv[24] = { "bin/ps-worker", "--config", cfg, "--rank", r };
	int n = 5;

	snprintf(r, sizeof(r), "%d", rank);
	for (; extra && *extra && n < 22; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	return tu_spawn(argv, out);
}

static char *slurp(const char *path)
{
	static char buf[1 << 20];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* Runs 2 shards and 2 workers of cfg to the end. Returns worker 0's test
 * accuracy (from its stdout) and copies its last metrics line to metrics. */
static double run_cluster_x(const char *cfg, char *metrics, size_t mlen,
			    const char *const *extra0);

static double run_cluster(const char *cfg, char *metrics, size_t mlen)
{
	return run_cluster_x(cfg, metrics, mlen, NULL);
}

/* Same, with more flags for worker 0. */
static double run_cluster_x(const char *cfg, char *metrics, size_t mlen,
			    const char *const *extra0)
{
	char out[2][128], mpath[128];
	pid_t srv[2], w[2];
	double acc = -1;
	const char *p;

	for (int i = 0; i < 2; i++)
		srv[i] = tu_start_server(cfg, i);
	/* worker 0 logs at info: its evaluation's line is read below */
	const char *x0[24] = { "--log-level", "info" };
	for (int i = 2; extra0 && *extra0 && i < 20; extra0++)
		x0[i++] = *extra0;
	for (int r = 0; r < 2; r++) {
		snprintf(out[r], sizeof(out[r]), "%s/worker-%d.out", tmpdir, r);
		w[r] = start_worker(cfg, r, out[r], r == 0 ? x0 : NULL);
	}
	for (int r = 0; r < 2; r++) {
		int st = tu_wait_child(w[r]);

		ck_assert_msg(st == 0, "worker %d exited %d:\n%s", r, st, slurp(out[r]));
	}
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(tu_stop_server(srv[i]), 0);
	p = strstr(slurp(out[0]), "epoch 1 test accuracy ");
	ck_assert_msg(p, "no accuracy line:\n%s", slurp(out[0]));
	acc = strtod(p + strlen("epoch 1 test accuracy "), NULL);
	/* the log's line of the same evaluation: the same accuracy, a finite
	 * positive loss, and the test images it was measured on */
	char want[64];
	snprintf(want, sizeof(want), "epoch 1: test accuracy %.4f, test loss ", acc);
	p = strstr(slurp(out[0]), want);
	ck_assert_msg(p, "no '%s' in worker 0's log:\n%s", want, slurp(out[0]));
	char *end;
	double loss = strtod(p + strlen(want), &end);
	/* a mean cross-entropy over 10 classes: chance is ln 10 = 2.30; a
	 * trained model's is below twice that, however the test set is cut
	 * into batches */
	ck_assert_msg(isfinite(loss) && loss > 0 && loss < 2 * log(10.0) && !strncmp(end, " (", 2),
		      "loss in '%.80s'", p);
	long images = strtol(end + 2, &end, 10);
	ck_assert_msg(images >= 1000 && images <= 10000 && !strncmp(end, " images)", 8),
		      "images in '%.80s'", p);
	/* the epoch's own line: the steps, examples and loss of this worker's
	 * share, and its speed */
	p = strstr(slurp(out[0]), "epoch 1: ");
	int steps = 0;
	long seen = 0;
	double tl = NAN, sps = NAN;
	ck_assert_msg(p && sscanf(p, "epoch 1: %d steps, %ld examples, train loss %lf, %lf "
				  "samples/s", &steps, &seen, &tl, &sps) == 4,
		      "no epoch line in worker 0's log:\n%s", slurp(out[0]));
	ck_assert_msg(steps > 0 && seen >= steps && isfinite(tl) && tl > 0 && tl < 2 * log(10.0) &&
		      isfinite(sps) && sps > 0, "epoch line '%.100s'", p);
	snprintf(mpath, sizeof(mpath), "%s/worker-0.jsonl", tmpdir);
	snprintf(metrics, mlen, "%.*s", (int)mlen - 1, slurp(mpath));
	ck_assert_msg(strstr(metrics, "\"test_accuracy\":"), "metrics: %s", metrics);
	/* the log's samples/s and the metrics line's are the same figure of
	 * the same epoch (examples over the epoch's time), one rounded to 0.5;
	 * and that time lies within the run's time so far, time_s */
	const char *q = strstr(metrics, "\"samples_per_s\":"), *ts = strstr(metrics, "\"time_s\":");
	ck_assert_msg(q && ts, "metrics: %s", metrics);
	double msps = strtod(q + strlen("\"samples_per_s\":"), NULL);
	double time_s = strtod(ts + strlen("\"time_s\":"), NULL);
	ck_assert_msg(fabs(msps - sps) <= 0.55, "log says %.0f samples/s, metrics %.1f", sps, msps);
	ck_assert_msg(time_s > 0 && msps * time_s >= 0.99 * seen,
		      "%.1f samples/s over at most %.3f s is fewer than the %ld examples", msps,
		      time_s, seen);
	unlink(mpath);
	snprintf(mpath, sizeof(mpath), "%s/worker-1.jsonl", tmpdir);
	unlink(mpath);
	return acc;
}

/* Same seed, same data, sync: the summed gradients are applied in rank
 * order, so two runs end with the same model and the same test loss, and
 * whether the weights are pulled per layer with each push (the default) or
 * all at once after the step (train.pull: step) changes only when they
 * travel, never which version a step computes with. */
START_TEST(test_sync_mlp_learns_and_is_deterministic)
{
	char cfg[64], m1[4096], m2[4096];
	double a1, a2;

	write_cfg(cfg, "mlp", "limit: 6000", "optimizer: {name: momentum, lr: 0.05, momentum: 0.5}\n");
	a1 = run_cluster(cfg, m1, sizeof(m1));
	printf("sync mlp test accuracy %.4f\n", a1);
	ck_assert_msg(a1 >= 0.75, "sync mlp test accuracy %.4f < 0.75", a1);
	/* the per-layer waits, one per dense layer, in push order */
	const char *wl = strstr(m1, "\"net_wait_layers_s\":{\"fc3.weight\":");
	ck_assert_msg(wl && strstr(wl, "\"fc2.weight\":") && strstr(wl, "\"fc1.weight\":"), "%s", m1);
	unlink(cfg);
	write_cfg(cfg, "mlp", "limit: 6000, pull: step",
		  "optimizer: {name: momentum, lr: 0.05, momentum: 0.5}\n");
	a2 = run_cluster(cfg, m2, sizeof(m2));
	ck_assert_msg(a1 == a2, "two sync runs differ: %.4f vs %.4f", a1, a2);
	ck_assert_str_eq(strstr(m1, "\"test_loss\""), strstr(m2, "\"test_loss\""));
	ck_assert_msg(!strstr(m2, "net_wait_layers_s"), "%s", m2);
	unlink(cfg);
}
END_TEST

START_TEST(test_async_mlp_learns)
{
	char cfg[64], m[4096];
	double a;

	write_cfg(cfg, "mlp", "limit: 6000", "consistency: {mode: async, staleness: 2}\n"
		  "optimizer: {name: momentum, lr: 0.05, momentum: 0.5}\n");
	a = run_cluster(cfg, m, sizeof(m));
	printf("async (staleness 2) mlp test accuracy %.4f\n", a);
	ck_assert_msg(a >= 0.75, "async mlp test accuracy %.4f < 0.75", a);
	ck_assert_msg(strstr(m, "\"consistency\":\"async\""), "%s", m);
	unlink(cfg);
}
END_TEST

/* Reads "key":number from a metrics line. */
static double metric(const char *line, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(line, k);
	ck_assert_msg(p, "no %s in %s", key, line);
	return strtod(p + strlen(k), NULL);
}

/* Issue 4's end-to-end check: top-k 1% with error feedback and LZ4 learns
 * as well as uncompressed pushes (within 3 points) for 30x fewer bytes. */
START_TEST(test_topk_lz4_matches_none)
{
	char cfg[64], m_none[4096], m_topk[4096];
	double a_none, a_topk, ratio;

	write_cfg(cfg, "mlp", "limit: 6000", "optimizer: {name: sgd, lr: 0.1}\n"
		  "compression: {codec: none, lz4: off}\n");
	a_none = run_cluster(cfg, m_none, sizeof(m_none));
	unlink(cfg);
	write_cfg(cfg, "mlp", "limit: 6000", "optimizer: {name: sgd, lr: 0.1}\n"
		  "compression: {codec: topk, ratio: 0.01, error_feedback: true, lz4: on}\n");
	a_topk = run_cluster(cfg, m_topk, sizeof(m_topk));
	unlink(cfg);
	ratio = metric(m_topk, "mb_pushed_raw") / metric(m_topk, "mb_pushed_wire");
	printf("topk 0.01 + lz4: test accuracy %.4f (none %.4f), %.1fx fewer push bytes\n",
	       a_topk, a_none, ratio);
	ck_assert_msg(a_none >= 0.75, "none: %.4f", a_none);
	ck_assert_msg(a_topk > a_none - 0.03, "topk %.4f vs none %.4f", a_topk, a_none);
	ck_assert_msg(ratio > 30, "topk pushed only %.1fx fewer bytes", ratio);
	ck_assert_double_eq_tol(metric(m_none, "mb_pushed_raw"), metric(m_none, "mb_pushed_wire"),
				1e-3);
	ck_assert_msg(strstr(m_topk, "\"codec\":\"topk\""), "%s", m_topk);
}
END_TEST

/* The cnn preset through the same path (conv, pool, relu on the backend). */
START_TEST(test_sync_cnn_learns)
{
	char cfg[64], m[4096];
	double a;

	/* 2 workers x 20 steps of 32: enough to leave chance (10%) far behind */
	write_cfg(cfg, "cnn", "limit: 1280", "optimizer: {name: momentum, lr: 0.01, momentum: 0.9}\n");
	a = run_cluster(cfg, m, sizeof(m));
	ck_assert_msg(a > 0.40, "cnn test accuracy %.4f <= 0.40 after 20 steps", a);
	unlink(cfg);
}
END_TEST

/* ps-worker --config cfg --eval model (no servers); exit status, output in out. */
static int run_eval(const char *cfg, const char *model, char *out, size_t outlen)
{
	const char *argv[] = { "bin/ps-worker", "--config", cfg, "--eval", model, NULL };
	char path[128];
	int st;

	snprintf(path, sizeof(path), "%s/eval.out", tmpdir);
	st = tu_wait_child(tu_spawn(argv, path));
	snprintf(out, outlen, "%.*s", (int)outlen - 1, slurp(path));
	return st;
}

/* --save-model writes the weights of the last pull; --eval of that file,
 * without servers, reports the accuracy worker 0 printed after the epoch
 * (same weights, same test set); a damaged file or another model's file
 * is refused with the reason. */
START_TEST(test_save_model_and_eval)
{
	char cfg[64], cnn[64], m[4096], model[128], out[4096];
	const char *extra[] = { "--save-model", model, NULL };
	double acc, eacc;
	const char *p;

	snprintf(model, sizeof(model), "%s/mlp.model", tmpdir);
	write_cfg(cfg, "mlp", "limit: 6000", "optimizer: {name: momentum, lr: 0.05, momentum: 0.5}\n");
	acc = run_cluster_x(cfg, m, sizeof(m), extra);
	ck_assert_int_eq(run_eval(cfg, model, out, sizeof(out)), 0);
	p = strstr(out, "test accuracy ");
	ck_assert_msg(p, "%s", out);
	eacc = strtod(p + strlen("test accuracy "), NULL);
	ck_assert_msg(fabs(eacc - acc) < 1e-9, "eval %.4f, after training %.4f\n%s", eacc, acc, out);

	/* scripts/ps-plot renders the metrics line to a PNG (with gnuplot:
	 * install-deps.sh installs it; a GPU machine's image may lack it) */
	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		printf("SKIP ps-plot's PNG: gnuplot is not installed (Debian's gnuplot-nox)\n");
	} else {
		char mfile[128], png[128], cmd[512], head[8] = { 0 };
		FILE *mf;

		snprintf(mfile, sizeof(mfile), "%s/plot.jsonl", tmpdir);
		snprintf(png, sizeof(png), "%s/plot.png", tmpdir);
		mf = fopen(mfile, "w");
		ck_assert_ptr_nonnull(mf);
		fputs(m, mf);
		fclose(mf);
		snprintf(cmd, sizeof(cmd), "scripts/ps-plot -o %s %s=mlp >/dev/null", png, mfile);
		ck_assert_int_eq(system(cmd), 0);
		mf = fopen(png, "rb");
		ck_assert_ptr_nonnull(mf);
		ck_assert_int_eq(fread(head, 1, 8, mf), 8);
		fseek(mf, 0, SEEK_END);
		ck_assert_int_gt(ftell(mf), 10000);
		fclose(mf);
		ck_assert_int_eq(memcmp(head, "\x89PNG\r\n\x1a\n", 8), 0);
		snprintf(cmd, sizeof(cmd), "scripts/ps-plot %s/nonexistent.jsonl 2>/dev/null", tmpdir);
		ck_assert_int_ne(system(cmd), 0);
		unlink(png);
		unlink(mfile);
	}

	/* another model's config */
	write_cfg(cnn, "cnn", "limit: 6000", "");
	ck_assert_int_ne(run_eval(cnn, model, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "holds 6 tensors, the config's model has 8"), "%s", out);
	unlink(cnn);
	/* one flipped byte */
	FILE *f = fopen(model, "r+b");
	ck_assert_ptr_nonnull(f);
	fseek(f, 1000, SEEK_SET);
	int c = fgetc(f);
	fseek(f, 1000, SEEK_SET);
	fputc(c ^ 1, f);
	fclose(f);
	ck_assert_int_ne(run_eval(cfg, model, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "checksum mismatch"), "%s", out);
	/* missing */
	unlink(model);
	ck_assert_int_ne(run_eval(cfg, model, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, model) && strstr(out, "No such file"), "%s", out);
	unlink(cfg);
}
END_TEST

/* Runs one worker alone (no servers needed to fail) and returns its exit
 * status; its output is left in out. */
static int run_alone(const char *cfg, const char *const *extra, char *out, size_t outlen)
{
	char path[128];
	pid_t w;
	int st;

	snprintf(path, sizeof(path), "%s/alone.out", tmpdir);
	w = start_worker(cfg, 0, path, extra);
	st = tu_wait_child(w);
	snprintf(out, outlen, "%.*s", (int)outlen - 1, slurp(path));
	return st;
}

START_TEST(test_bad_flags_and_data)
{
	char cfg[64], out[4096];
	static const char *const rank9[] = { "--rank", "9", NULL };
	static const char *const batch0[] = { "--batch", "0", NULL };
	static const char *const dev[] = { "--device", "tpu", NULL };

	write_cfg(cfg, "mlp", "limit: 6000", "");
	ck_assert_int_eq(run_alone(cfg, rank9, out, sizeof(out)), 2);
	ck_assert_msg(strstr(out, "--rank 9") && strstr(out, "workers 0..1"), "%s", out);
	ck_assert_int_eq(run_alone(cfg, batch0, out, sizeof(out)), 2);
	ck_assert_msg(strstr(out, "--batch: expected 1..65536, got '0'"), "%s", out);
	ck_assert_int_eq(run_alone(cfg, dev, out, sizeof(out)), 2);
	ck_assert_msg(strstr(out, "--device: expected cpu, cuda or auto, got 'tpu'"), "%s", out);
	unlink(cfg);

	/* a data folder without the IDX files: the error names the file */
	{
		char train[128];

		snprintf(train, sizeof(train), "data_dir: '%s'", tmpdir);
		write_cfg(cfg, "mlp", train, "");
	}
	ck_assert_int_ne(run_alone(cfg, NULL, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, tmpdir) && strstr(out, "train-images-idx3-ubyte") &&
		      strstr(out, "No such file or directory"), "%s", out);
	unlink(cfg);
}
END_TEST

/* device: cuda on a machine without a usable GPU fails with the reason;
 * auto falls back to the CPU with one log line. */
START_TEST(test_device_cuda_without_gpu)
{
	const struct ps_compute_ops *cuda = NULL;
	struct ps_compute *c = NULL;
	static const char *const devcuda[] = { "--device", "cuda", NULL };
	static const char *const devauto[] = { "--device", "auto", "--log-level", "info", NULL };
	char cfg[64], out[4096], reason[512] = "";

	if (ps_compute_load("cuda", &cuda, reason, sizeof(reason)) == 0 &&
	    cuda->create(&c, NULL, reason, sizeof(reason)) == 0) {
		cuda->destroy(c);
		tu_skip("device-cuda refusal: this machine has a usable GPU");
		return;
	}
	write_cfg(cfg, "mlp", "limit: 6000", "limits: {connect_timeout_ms: 300}\n");
	ck_assert_int_ne(run_alone(cfg, devcuda, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "device cuda requested but not usable: ") && strstr(out, reason),
		      "%s", out);
	ck_assert_msg(!strstr(out, "training mlp"), "trained anyway:\n%s", out);
	/* auto: the same reason once, then the CPU (no servers: it stops there) */
	run_alone(cfg, devauto, out, sizeof(out));
	char *line = strstr(out, "no usable GPU (");
	ck_assert_msg(line && strstr(line, reason) && strstr(line, "); training on the CPU"), "%s",
		      out);
	ck_assert_msg(!strstr(line + 1, "no usable GPU ("), "said twice:\n%s", out);
	unlink(cfg);
}
END_TEST

/* A plug-in file that is not one (a broken install): the worker names the
 * file and dlopen's reason, and still runs --device cpu. */
START_TEST(test_broken_cuda_plugin)
{
	static const char *const devcuda[] = { "--device", "cuda", NULL };
	static const char *const devcpu[] = { "--device", "cpu", "--log-level", "info", NULL };
	char cfg[64], out[4096], dir[128], so[192];

	snprintf(dir, sizeof(dir), "%s/plugin", tmpdir);
	ck_assert_int_eq(mkdir(dir, 0755) == 0 || errno == EEXIST, 1);
	snprintf(so, sizeof(so), "%s/ps-compute-cuda.so", dir);
	FILE *f = fopen(so, "w");
	ck_assert_ptr_nonnull(f);
	fputs("not an ELF file\n", f);
	fclose(f);
	setenv("PS_COMPUTE_PLUGIN_DIR", dir, 1);  /* this test's process only */
	write_cfg(cfg, "mlp", "limit: 6000", "limits: {connect_timeout_ms: 300}\n");
	ck_assert_int_ne(run_alone(cfg, devcuda, out, sizeof(out)), 0);
	ck_assert_msg(strstr(out, "device cuda requested but not usable: cannot load ") &&
		      strstr(out, so), "%s", out);
	run_alone(cfg, devcpu, out, sizeof(out));
	ck_assert_msg(!strstr(out, "cannot load") && !strstr(out, "GPU"),
		      "--device cpu looked for the plug-in:\n%s", out);
	unlink(so);
	rmdir(dir);
	unlink(cfg);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("train");
	TCase *tc = tcase_create("cluster");
	int failed;

	tu_secret_setup();
	setenv("OPENBLAS_NUM_THREADS", "1", 1); /* before any thread: the workers inherit it */
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ps-it-train-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	tcase_set_timeout(tc, 240);
	TU_ADD(tc, test_bad_flags_and_data);
	TU_ADD(tc, test_device_cuda_without_gpu);
	TU_ADD(tc, test_broken_cuda_plugin);
	if (have_data()) {
		TU_ADD(tc, test_sync_mlp_learns_and_is_deterministic);
		TU_ADD(tc, test_async_mlp_learns);
		TU_ADD(tc, test_sync_cnn_learns);
		TU_ADD(tc, test_topk_lz4_matches_none);
		TU_ADD(tc, test_save_model_and_eval);
	} else {
		tu_skip_cases(5, "training runs (5 cases): %s is missing (Debian's "
			      "dataset-fashion-mnist; PS_TEST_DATA names another folder)", data_dir());
	}
	suite_add_tcase(s, tc);
	failed = tu_run_suite_as(s, 1);
	tu_rmtree(tmpdir);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
