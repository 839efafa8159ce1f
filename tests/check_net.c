/* check_net.c - a training step through ps_net_* as the worker runs it
 * (worker/net.h), on the cpu (oneDNN) and ref backends.
 *
 *   - backward makes no host synchronization (the backend's host_syncs
 *     counter does not move), for mlp, cnn and a model with layers of
 *     every kind;
 *   - a push thread waiting on the gradients in push order (last layer
 *     first) receives each pair once its layer is done, while backward
 *     goes on, and the gradients it sees are those the step computes when
 *     nothing runs beside it (bit for bit);
 *   - the gradients are those of the mean loss times the caller's scale
 *     (the 1/batch folded into the backward ops' alpha), against central
 *     differences of the loss through whole forward passes;
 *   - a batch with a bad label is refused before anything is uploaded,
 *     and a step whose loss is not finite hands no gradient to push;
 *   - the input slots alternate: a batch readied while the previous step's
 *     gradients are still to be read does not disturb them.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "config.h"
#include "net.h"
#include "ps_err.h"
#include "test_util.h"

/* The backend under test: every case runs on cpu (oneDNN) and on ref. */
static const struct ps_compute_ops *ops = &ps_compute_cpu_ops;

static void use_cpu(void)
{
	ops = &ps_compute_cpu_ops;
}

static void use_ref(void)
{
	ops = &ps_compute_ref_ops;
}

static void no_teardown(void)
{
}

/* Every layer kind: conv, relu, maxpool, flatten in the middle, dense. */
static const char *const mixed_model =
	"model:\n  input: [2, 8, 8]\n  classes: 5\n  layers:\n"
	"    - {type: conv2d, out: 3, kernel: 3, pad: 1}\n"
	"    - {type: relu}\n"
	"    - {type: maxpool, size: 2}\n"
	"    - {type: flatten}\n"
	"    - {type: dense, out: 7}\n"
	"    - {type: relu}\n"
	"    - {type: dense, out: 5}\n";

static uint64_t rng = 0x243f6a8885a308d3ull;

static float frand(void)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

/* A net for model yaml (a preset name, or "mixed"), weights random. */
struct fixture {
	struct ps_config cfg;
	struct ps_compute *c;
	struct ps_net net;
	float *x;
	int32_t *y;
	int batch;
};

static void fx_open(struct fixture *f, const char *model, int batch)
{
	char yaml[1024], err[512] = "";

	memset(f, 0, sizeof(*f));
	if (strcmp(model, "mixed") == 0)
		snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n%s",
			 mixed_model);
	else
		snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n"
			 "model: {preset: %s}\n", model);
	ck_assert_msg(ps_config_load_string(&f->cfg, yaml, "t.yaml", err, sizeof(err)) == 0, "%s",
		      err);
	ck_assert_int_eq(ops->create(&f->c, NULL, err, sizeof(err)), 0);
	ck_assert_msg(ps_net_init(&f->net, &f->cfg, ops, f->c, batch, err, sizeof(err)) == 0,
		      "%s", err);
	f->batch = batch;
	for (int t = 0; t < f->cfg.ntensors; t++)
		for (int64_t i = 0; i < f->cfg.tensors[t].count; i++)
			f->net.host_w[t][i] = 0.3f * frand();
	ck_assert_int_eq(ps_net_upload_weights(&f->net), 0);
	f->x = malloc((size_t)batch * f->net.in_count * sizeof(float));
	f->y = malloc((size_t)batch * sizeof(int32_t));
	ck_assert(f->x && f->y);
	for (size_t i = 0; i < (size_t)batch * f->net.in_count; i++)
		f->x[i] = frand();
	for (int i = 0; i < batch; i++)
		f->y[i] = (int32_t)(i % f->cfg.model.classes);
}

static void fx_close(struct fixture *f)
{
	ps_net_free(&f->net);
	ops->destroy(f->c);
	free(f->x);
	free(f->y);
}

/* Forward and backward of the fixture's batch; the pass number. */
static uint64_t fx_step(struct fixture *f, float scale)
{
	uint64_t gen;

	ck_assert_int_eq(ps_net_load_batch(&f->net, f->x, f->y, f->batch), 0);
	ck_assert_msg(ps_net_forward(&f->net) == 0, "%s", f->c->err);
	ck_assert_msg(ps_net_backward(&f->net, scale, &gen) == 0, "%s", f->c->err);
	return gen;
}

/* Copies every gradient tensor (host_g) after waiting for all pairs. */
static float **fx_grads(struct fixture *f, uint64_t gen)
{
	float **g = calloc((size_t)f->cfg.ntensors, sizeof(float *));
	int wt, bt;

	ck_assert_ptr_nonnull(g);
	for (int k = 0; k < f->net.ngrads; k++) {
		ck_assert_msg(ps_net_grad_wait(&f->net, gen, k, &wt, &bt) == 0, "%s", f->net.err);
		int t2[2] = { wt, bt };
		for (int j = 0; j < 2; j++) {
			size_t bytes = (size_t)f->cfg.tensors[t2[j]].count * sizeof(float);
			g[t2[j]] = malloc(bytes);
			ck_assert_ptr_nonnull(g[t2[j]]);
			memcpy(g[t2[j]], f->net.host_g[t2[j]], bytes);
		}
	}
	return g;
}

static void free_grads(struct fixture *f, float **g)
{
	for (int t = 0; t < f->cfg.ntensors; t++)
		free(g[t]);
	free(g);
}

static const char *const models[] = { "mlp", "cnn", "mixed" };

/* ---- no host synchronization inside backward ---- */

START_TEST(test_backward_no_host_sync)
{
	struct fixture f;
	float loss;
	int correct;

	fx_open(&f, models[_i], 8);
	ck_assert_int_eq(ps_net_load_batch(&f.net, f.x, f.y, f.batch), 0);
	ck_assert_int_eq(ps_net_forward(&f.net), 0);
	unsigned long before = f.c->host_syncs;
	uint64_t gen;
	ck_assert_int_eq(ps_net_backward(&f.net, 1.0f, &gen), 0);
	ck_assert_msg(f.c->host_syncs == before, "%s: backward made %lu host syncs", models[_i],
		      f.c->host_syncs - before);
	/* and the counter is live: a sync counts */
	ck_assert_int_eq(ops->sync(f.c), 0);
	ck_assert_uint_eq(f.c->host_syncs, before + 1);
	ck_assert_int_eq(ps_net_loss(&f.net, &loss, &correct), 0);
	ck_assert(isfinite(loss) && loss > 0.0f);
	free_grads(&f, fx_grads(&f, gen));
	fx_close(&f);
}
END_TEST

/* ---- a push thread gets each pair while later layers still compute ---- */

struct watcher {
	struct fixture *f;
	uint64_t gen;
	int order[PS_MAX_LAYERS];     /* layers whose pair arrived, in order */
	int below_done[PS_MAX_LAYERS];/* pairs of lower layers already queued then */
	int n, rc;
};

static void *watch(void *arg)
{
	struct watcher *w = arg;
	struct ps_net *net = &w->f->net;
	int wt, bt;

	for (int k = 0; k < net->ngrads; k++) {
		w->rc = ps_net_grad_wait(net, w->gen, k, &wt, &bt);
		if (w->rc)
			return NULL;
		pthread_mutex_lock(&net->mu);
		w->below_done[w->n] = net->queued;
		pthread_mutex_unlock(&net->mu);
		w->order[w->n++] = wt;
	}
	return NULL;
}

START_TEST(test_push_order_and_values)
{
	struct fixture f;
	struct watcher w = { 0 };
	pthread_t th;

	fx_open(&f, models[_i], 16);
	/* the reference: the same step with nobody waiting */
	float **ref = fx_grads(&f, fx_step(&f, 0.5f));
	/* again, with the watcher started before backward */
	ck_assert_int_eq(ps_net_load_batch(&f.net, f.x, f.y, f.batch), 0);
	ck_assert_int_eq(ps_net_forward(&f.net), 0);
	w.f = &f;
	w.gen = f.net.gen + 1;
	ck_assert_int_eq(pthread_create(&th, NULL, watch, &w), 0);
	uint64_t gen;
	ck_assert_int_eq(ps_net_backward(&f.net, 0.5f, &gen), 0);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	ck_assert_uint_eq(gen, w.gen);
	ck_assert_int_eq(w.rc, 0);
	ck_assert_int_eq(w.n, f.net.ngrads);
	/* weight tensors come last layer first: descending tensor numbers */
	for (int k = 1; k < w.n; k++)
		ck_assert_msg(w.order[k] < w.order[k - 1], "pair %d (tensor %d) after tensor %d", k,
			      w.order[k], w.order[k - 1]);
	/* each pair was handed over once queued, never before */
	for (int k = 0; k < w.n; k++)
		ck_assert_int_ge(w.below_done[k], k + 1);
	for (int t = 0; t < f.cfg.ntensors; t++)
		ck_assert_msg(memcmp(ref[t], f.net.host_g[t],
				     (size_t)f.cfg.tensors[t].count * sizeof(float)) == 0,
			      "%s: tensor %s differs with a push thread", models[_i],
			      f.cfg.tensors[t].name);
	free_grads(&f, ref);
	fx_close(&f);
}
END_TEST

/* ---- gradients are those of scale * mean loss ---- */

static double loss_at(struct fixture *f)
{
	float loss;
	int correct;

	ck_assert_int_eq(ps_net_upload_weights(&f->net), 0);
	ck_assert_int_eq(ps_net_load_batch(&f->net, f->x, f->y, f->batch), 0);
	ck_assert_int_eq(ps_net_forward(&f->net), 0);
	ck_assert_int_eq(ps_net_loss(&f->net, &loss, &correct), 0);
	return f->net.stats->loss_sum / f->batch;  /* the double behind loss */
}

START_TEST(test_gradient_of_mean_loss)
{
	const float scale = 0.5f, eps = 1e-3f;
	struct fixture f;

	fx_open(&f, "mixed", 6);
	float **g = fx_grads(&f, fx_step(&f, scale));
	for (int t = 0; t < f.cfg.ntensors; t++) {
		for (int probe = 0; probe < 6; probe++) {
			int64_t i = (int64_t)((frand() + 1.0f) * 0.5f * (float)f.cfg.tensors[t].count) %
				    f.cfg.tensors[t].count;
			float v = f.net.host_w[t][i];
			f.net.host_w[t][i] = v + eps;
			double lp = loss_at(&f);
			f.net.host_w[t][i] = v - eps;
			double lm = loss_at(&f);
			f.net.host_w[t][i] = v;
			double num = scale * (lp - lm) / (2.0 * eps), ana = g[t][i];
			double tol = 2e-2 * fmax(fmax(fabs(num), fabs(ana)), 1e-2);
			ck_assert_msg(fabs(num - ana) <= tol, "%s[%lld]: backward %.6g, differences "
				      "%.6g", f.cfg.tensors[t].name, (long long)i, ana, num);
		}
	}
	ck_assert_int_eq(ps_net_upload_weights(&f.net), 0);
	free_grads(&f, g);
	fx_close(&f);
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_bad_label_and_nonfinite_loss)
{
	struct fixture f;
	float *x;
	int32_t *y;
	uint64_t gen;
	int wt, bt;

	fx_open(&f, "mixed", 4);
	/* a label outside [0, classes): refused by batch_ready, nothing readied */
	ck_assert_int_eq(ps_net_batch_buffers(&f.net, &x, &y), 0);
	memcpy(x, f.x, (size_t)4 * f.net.in_count * sizeof(float));
	memcpy(y, f.y, 4 * sizeof(int32_t));
	y[2] = 5;
	ck_assert_int_eq(ps_net_batch_ready(&f.net, 4), -EINVAL);
	ck_assert_msg(strstr(f.c->err, "label 5 of example 2 is outside [0, 5)"), "%s", f.c->err);
	ck_assert_int_eq(ps_net_forward(&f.net), -EINVAL);  /* no batch is ready */
	ck_assert_int_eq(ps_net_batch_ready(&f.net, 0), -EINVAL);
	ck_assert_int_eq(ps_net_batch_ready(&f.net, 5), -EINVAL);

	/* a NaN weight: the loss is not finite, so no pair is handed over */
	f.net.host_w[f.cfg.ntensors - 1][0] = NAN;  /* the last bias: relu would mask it */
	ck_assert_int_eq(ps_net_upload_weights(&f.net), 0);
	gen = fx_step(&f, 1.0f);
	ck_assert_int_eq(ps_net_grad_wait(&f.net, gen, 0, &wt, &bt), PS_ENOFINITE);
	ck_assert_msg(strstr(f.net.err, "not finite"), "%s", f.net.err);
	/* a pass that never was is not waited for forever */
	ck_assert_int_eq(ps_net_grad_wait(&f.net, gen - 1, 0, &wt, &bt), -ESTALE);
	ck_assert_int_eq(ps_net_grad_wait(&f.net, gen, f.net.ngrads, &wt, &bt), -EINVAL);
	fx_close(&f);
}
END_TEST

/* ---- the next batch readied while the step's gradients are read ---- */

START_TEST(test_double_buffered_input)
{
	struct fixture f;

	fx_open(&f, "cnn", 4);
	float **ref = fx_grads(&f, fx_step(&f, 1.0f));
	/* step again, and ready other data before reading its gradients */
	uint64_t gen = fx_step(&f, 1.0f);
	float *x;
	int32_t *y;
	ck_assert_int_eq(ps_net_batch_buffers(&f.net, &x, &y), 0);
	ck_assert_ptr_ne(x, f.net.host_x[f.net.cur]);
	for (size_t i = 0; i < (size_t)4 * f.net.in_count; i++)
		x[i] = 5.0f * frand();
	for (int i = 0; i < 4; i++)
		y[i] = 9 - i;
	ck_assert_int_eq(ps_net_batch_ready(&f.net, 4), 0);
	float **got = fx_grads(&f, gen);
	for (int t = 0; t < f.cfg.ntensors; t++)
		ck_assert_msg(memcmp(ref[t], got[t], (size_t)f.cfg.tensors[t].count * 4) == 0,
			      "tensor %s changed by the next batch", f.cfg.tensors[t].name);
	/* and that batch is what the next forward computes on */
	float loss, loss2;
	int correct;
	ck_assert_int_eq(ps_net_forward(&f.net), 0);
	ck_assert_int_eq(ps_net_loss(&f.net, &loss, &correct), 0);
	ck_assert_int_eq(ps_net_load_batch(&f.net, f.x, f.y, 4), 0);
	ck_assert_int_eq(ps_net_forward(&f.net), 0);
	ck_assert_int_eq(ps_net_loss(&f.net, &loss2, &correct), 0);
	ck_assert_msg(loss != loss2, "the readied batch was not the one computed on");
	free_grads(&f, ref);
	free_grads(&f, got);
	fx_close(&f);
}
END_TEST

static void add_cases(Suite *s, const char *name, void (*fixture)(void))
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, fixture, no_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_backward_no_host_sync, 0, 3);
	tcase_add_loop_test(tc, test_push_order_and_values, 0, 3);
	tcase_add_test(tc, test_gradient_of_mean_loss);
	tcase_add_test(tc, test_bad_label_and_nonfinite_loss);
	tcase_add_test(tc, test_double_buffered_input);
	suite_add_tcase(s, tc);
}

int main(void)
{
	Suite *s = suite_create("net");

	add_cases(s, "cpu", use_cpu);
	add_cases(s, "ref", use_ref);
	return tu_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
