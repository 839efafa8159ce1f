/* it_groups.c - declared tensors with optimizer groups, with real
 * ps-server processes (server/declare.c, server/store.c, server/push.c,
 * server/checkpoint.c, worker/client/ps_client_declare.c): two workers
 * declare six tensors in six groups (sgd with dampening, sgd with Nesterov
 * momentum, adam, adamw, adagrad with lr_decay, reduce), push different
 * gradients and change the learning rates each clock (rank 1 with other
 * rates, which the shards do not use: the lowest rank's apply); the pulled
 * weights equal the torch formulas applied to the mean gradient, computed
 * here in double. Shards killed and restarted from their checkpoints keep
 * the groups and the optimizer state (the weights after further clocks are
 * those of an uninterrupted run, bit for bit);
 * a worker declaring other groups is refused naming the field; bad groups,
 * learning rates and pushes are refused; compression.tensors entries apply
 * by declared name.
 */
#include <check.h>
#include <stddef.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include "config.h"
#include "msg.h"
#include "optim_group.h"
#include "ps_client.h"
#include "ps_client_int.h" /* raw Declare frames, a push with a bad rate */
#include "codec.h"
#include "ps_err.h"
#include "test_util.h"

static char path[64], dir[64];
static struct ps_config cfg;
static pid_t srv[2];
static int port[2];

/* A config without a model: 2 shards, 2 workers, sync, slices of 16
 * floats (tensors cut over both shards), checkpoints on request. The
 * optimizer section (sgd) is what the groups replace. */
static void start_with(const char *extra)
{
	char yaml[1024], err[512];

	snprintf(dir, sizeof(dir), "/tmp/it_groups.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	port[0] = tu_free_port();
	port[1] = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "slice_bytes: 64\n"
		 "optimizer:\n  name: sgd\n  lr: 0.5\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "limits:\n  request_timeout_ms: 5000\n"
		 "log:\n  level: error\n%s", port[0], port[1], dir, extra);
	path[0] = 0;
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
}

static void start(void)
{
	start_with("");
}

static void stop(void)
{
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_int_eq(tu_rmtree(dir), 0);
	unlink(path);
}

static struct ps_client *connect_retry(int rank)
{
	struct ps_client *c = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 100; i++) {
		rc = ps_client_init(&c, &cfg, rank, err, sizeof(err));
		if (rc != -ECONNREFUSED && !strstr(err, "is connected already"))
			break;
		tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "rank %d: %s", rank, err);
	return c;
}

/* The model: one tensor per group. */
#define NT 6
#define MAXN 12
static const char *const names[NT] = { "damp", "nest", "adam", "adamw", "ada", "red" };
static const int64_t counts[NT] = { 12, 7, 10, 9, 5, 4 };
static const int group_of[NT] = { 0, 1, 2, 3, 4, 5 };
static const struct ps_optim_group groups[NT] = {
	{ .kind = "sgd", .lr = 0.1f, .momentum = 0.9f, .dampening = 0.3f, .weight_decay = 0.01f,
	  .average = 1 },
	{ .kind = "sgd", .lr = 0.05f, .momentum = 0.5f, .nesterov = 1, .average = 1 },
	{ .kind = "adam", .lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f,
	  .weight_decay = 0.02f, .average = 1 },
	{ .kind = "adamw", .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	  .weight_decay = 0.1f, .average = 1 },
	{ .kind = "adagrad", .lr = 0.1f, .eps = 1e-10f, .lr_decay = 0.05f,
	  .initial_accumulator = 0.2f, .weight_decay = 0.01f, .average = 1 },
	{ .kind = "reduce", .average = 1 },
};

struct model {
	float v[NT][MAXN];
	int64_t dims[NT][1];
	struct ps_param p[NT];
};

static void model_init(struct model *m, float base)
{
	/* the rows past each tensor's count too: the ranks' models are
	 * compared whole (memcmp), and stack garbage there differs */
	memset(m, 0, sizeof(*m));
	for (int t = 0; t < NT; t++) {
		for (int i = 0; i < counts[t]; i++)
			m->v[t][i] = base + 0.1f * (float)i - 0.05f * (float)t;
		m->dims[t][0] = counts[t];
		m->p[t] = (struct ps_param){ names[t], 1, m->dims[t], m->v[t] };
	}
}

/* Rank r's gradient of element i of tensor t at clock k. */
static float grad(int r, int t, int i, int k)
{
	return (float)sin(1.0 + 0.37 * i + 1.1 * k + 2.3 * r + 0.7 * t);
}

/* Group g's learning rate at clock k as rank r sets it: rank 0 follows a
 * schedule; rank 1 sets three times as much, which must not apply. */
static float lr_of(int g, int k, int r)
{
	return groups[g].lr * (1.0f - 0.1f * (float)k) * (r ? 3.0f : 1.0f);
}

/* The reference: torch's rules on the mean gradient, in double. */
struct ref {
	double w[NT][MAXN], s0[NT][MAXN], s1[NT][MAXN];
};

static void ref_init(struct ref *R)
{
	struct model m;

	model_init(&m, 1.0f);
	memset(R, 0, sizeof(*R));
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < counts[t]; i++) {
			R->w[t][i] = m.v[t][i];
			R->s0[t][i] = groups[t].kind[0] == 'a' && groups[t].kind[2] == 'a' ?
				      groups[t].initial_accumulator : 0.0; /* adagrad */
		}
}

static void ref_step(struct ref *R, int k)
{
	for (int t = 0; t < NT; t++) {
		const struct ps_optim_group *o = &groups[t];
		double lr = lr_of(t, k, 0), wd = o->weight_decay, b1 = o->beta1, b2 = o->beta2;
		double step = k + 1.0;

		for (int i = 0; i < counts[t]; i++) {
			double g = ((double)grad(0, t, i, k) + grad(1, t, i, k)) / 2, *w = &R->w[t][i];
			double *s0 = &R->s0[t][i], *s1 = &R->s1[t][i];

			if (!strcmp(o->kind, "reduce")) {
				*w = g;
				continue;
			}
			if (!strcmp(o->kind, "adamw"))
				*w *= 1 - lr * wd;
			else
				g += wd * *w;
			if (!strcmp(o->kind, "sgd")) {
				*s0 = k == 0 ? g : o->momentum * *s0 + (1 - o->dampening) * g;
				*w -= lr * (o->nesterov ? g + o->momentum * *s0 : *s0);
			} else if (!strcmp(o->kind, "adagrad")) {
				*s0 += g * g;
				*w -= lr / (1 + (step - 1) * o->lr_decay) * g / (sqrt(*s0) + o->eps);
			} else { /* adam, adamw */
				*s0 = b1 * *s0 + (1 - b1) * g;
				*s1 = b2 * *s1 + (1 - b2) * g * g;
				*w -= lr / (1 - pow(b1, step)) * *s0 /
				      (sqrt(*s1) / sqrt(1 - pow(b2, step)) + o->eps);
			}
		}
	}
}

/* |got - want| <= 1e-5 * max(|want|, 0.01) for every weight. */
static void check_ref(const struct model *m, const struct ref *R, const char *what)
{
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < counts[t]; i++) {
			double want = R->w[t][i], got = m->v[t][i];
			ck_assert_msg(fabs(got - want) <= 1e-5 * fmax(fabs(want), 0.01),
				      "%s: %s[%d] = %.9g, want %.9g", what, names[t], i, got, want);
		}
}

/* Both ranks set their rates and push clock k, then pull version k + 1. */
static void step(struct ps_client *cs[2], struct model *ms[2], int k)
{
	for (int r = 0; r < 2; r++) {
		const struct ps_config *cc = ps_client_config(cs[r]);
		float g[NT][MAXN];
		struct ps_tensor gt[NT];

		for (int t = 0; t < NT; t++) {
			ck_assert_int_eq(ps_client_set_lr(cs[r], t, lr_of(t, k, r)), 0);
			for (int i = 0; i < counts[t]; i++)
				g[t][i] = grad(r, t, i, k);
			gt[t] = ps_tensor_of(cc, t, g[t]);
		}
		int64_t id = ps_client_push(cs[r], (uint64_t)k, gt, NT, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(cs[r], id) == 0, "push rank %d: %s", r,
			      ps_client_error(cs[r]));
	}
	for (int r = 0; r < 2; r++) {
		const struct ps_config *cc = ps_client_config(cs[r]);
		struct ps_tensor w[NT];

		for (int t = 0; t < NT; t++)
			w[t] = ps_tensor_of(cc, t, ms[r]->v[t]);
		int64_t id = ps_client_pull(cs[r], (uint64_t)k + 1, w, NT);
		ck_assert_msg(id > 0 && ps_client_wait(cs[r], id) == 0, "pull rank %d: %s", r,
			      ps_client_error(cs[r]));
	}
}

struct declarer {
	struct ps_client *c;
	struct model *m;
	int rc;
};

static void *declare_thread(void *arg)
{
	struct declarer *d = arg;

	d->rc = ps_client_declare_groups(d->c, d->m->p, NT, groups, NT, group_of);
	return NULL;
}

/* Ranks 0 and 1 declare at once; rank 0's values (base 1) seed the shards. */
static void declare_both(struct ps_client *cs[2], struct model *ms[2])
{
	struct declarer d1 = { cs[1], ms[1], -1 };
	pthread_t th;

	model_init(ms[0], 1.0f);
	model_init(ms[1], 50.0f);
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	ck_assert_msg(ps_client_declare_groups(cs[0], ms[0]->p, NT, groups, NT, group_of) == 0,
		      "rank 0: %s", ps_client_error(cs[0]));
	pthread_join(th, NULL);
	ck_assert_msg(d1.rc == 0, "rank 1: %s", ps_client_error(cs[1]));
}

START_TEST(test_groups_train_and_restart)
{
	struct model m0, m1, *ms[2] = { &m0, &m1 };
	struct ps_client *cs[2];
	struct ps_shard_stats st;
	struct ref R;
	int k = 0;

	start();
	cs[0] = connect_retry(0);
	cs[1] = connect_retry(1);
	declare_both(cs, ms);
	ref_init(&R);
	check_ref(&m1, &R, "rank 1 after declaring");
	for (; k < 3; k++) {
		step(cs, ms, k);
		ref_step(&R, k);
		check_ref(&m0, &R, "rank 0");
		ck_assert_int_eq(memcmp(m0.v, m1.v, sizeof(m0.v)), 0);
	}
	for (int s = 0; s < 2; s++) {
		ck_assert_int_eq(ps_client_checkpoint(cs[0], s, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: %s", s, st.checkpoint_error);
	}
	ps_client_free(cs[0]);
	ps_client_free(cs[1]);

	/* both shards killed (no checkpoint at exit) and restarted from the
	 * files: the groups and every slice's optimizer state and step count
	 * come back, so the run goes on as the reference does */
	for (int s = 0; s < 2; s++) {
		kill(srv[s], SIGKILL);
		ck_assert_int_eq(tu_wait_child(srv[s]), 128 + SIGKILL);
		srv[s] = tu_start_server(path, s);
	}
	cs[1] = connect_retry(1);
	ck_assert_int_eq(ps_client_from_checkpoint(cs[1]), 1);
	/* the restarted shards refuse other groups, naming the field */
	struct ps_optim_group other[NT];
	memcpy(other, groups, sizeof(other));
	other[0].dampening = 0.4f;
	model_init(&m1, 50.0f);
	ck_assert_int_eq(ps_client_declare_groups(cs[1], m1.p, NT, other, NT, group_of), PS_ECONFIG);
	const char *e = ps_client_error(cs[1]);
	ck_assert_msg(strstr(e, "optimizer group 0: dampening is 0.3 on the shard, 0.4 in this "
			     "declaration"), "%s", e);
	ps_client_free(cs[1]);
	/* every field the shard compares, each differing alone, named with
	 * both values (the shard's first) */
	static const struct {
		int g;
		const char *kind;
		size_t off;
		float v;
		int iv;
		const char *said;
	} diff[] = {
		{ 2, "adamw", 0, 0, 0, "optimizer group 2: kind is adam on the shard, adamw in" },
		{ 0, NULL, offsetof(struct ps_optim_group, momentum), 0, 0,
		  "optimizer group 0: kind is sgd (momentum) on the shard, sgd in" },
		{ 0, NULL, offsetof(struct ps_optim_group, momentum), 0.8f, 0,
		  "optimizer group 0: momentum is 0.9 on the shard, 0.8 in" },
		{ 1, NULL, offsetof(struct ps_optim_group, nesterov), 0, 1,
		  "optimizer group 1: nesterov is 1 on the shard, 0 in" },
		{ 2, NULL, offsetof(struct ps_optim_group, beta1), 0.7f, 0,
		  "optimizer group 2: beta1 is 0.8 on the shard, 0.7 in" },
		{ 2, NULL, offsetof(struct ps_optim_group, beta2), 0.98f, 0,
		  "optimizer group 2: beta2 is 0.99 on the shard, 0.98 in" },
		{ 2, NULL, offsetof(struct ps_optim_group, eps), 2e-6f, 0,
		  "optimizer group 2: eps is 1e-06 on the shard, 2e-06 in" },
		{ 0, NULL, offsetof(struct ps_optim_group, weight_decay), 0.02f, 0,
		  "optimizer group 0: weight_decay is 0.01 on the shard, 0.02 in" },
		{ 4, NULL, offsetof(struct ps_optim_group, lr_decay), 0.06f, 0,
		  "optimizer group 4: lr_decay is 0.05 on the shard, 0.06 in" },
		{ 4, NULL, offsetof(struct ps_optim_group, initial_accumulator), 0.3f, 0,
		  "optimizer group 4: initial_accumulator is 0.2 on the shard, 0.3 in" },
		{ 3, NULL, offsetof(struct ps_optim_group, average), 0, 1,
		  "optimizer group 3: average is 1 on the shard, 0 in" },
	};
	for (size_t i = 0; i < sizeof(diff) / sizeof(diff[0]); i++) {
		memcpy(other, groups, sizeof(other));
		char *f = (char *)&other[diff[i].g] + diff[i].off;
		if (diff[i].kind)
			other[diff[i].g].kind = diff[i].kind;
		else if (diff[i].iv)
			*(int *)f = (int)diff[i].v;
		else
			*(float *)f = diff[i].v;
		cs[1] = connect_retry(1);
		ck_assert_int_eq(ps_client_declare_groups(cs[1], m1.p, NT, other, NT, group_of),
				 PS_ECONFIG);
		e = ps_client_error(cs[1]);
		ck_assert_msg(strstr(e, diff[i].said) && strstr(e, " this declaration"),
			      "'%s' not in '%s'", diff[i].said, e);
		ps_client_free(cs[1]);
	}
	cs[1] = connect_retry(1);
	int swapped[NT];
	memcpy(swapped, group_of, sizeof(swapped));
	swapped[1] = 0;
	ck_assert_int_eq(ps_client_declare_groups(cs[1], m1.p, NT, groups, NT, swapped), PS_ECONFIG);
	e = ps_client_error(cs[1]);
	ck_assert_msg(strstr(e, "tensor #1 ('nest') is in optimizer group 1 on the shard, 0 in "
			     "this declaration"), "%s", e);
	ps_client_free(cs[1]);
	cs[1] = connect_retry(1);
	/* plain ps_client_declare: no groups, refused too */
	ck_assert_int_eq(ps_client_declare(cs[1], m1.p, NT), PS_ECONFIG);
	e = ps_client_error(cs[1]);
	ck_assert_msg(strstr(e, "6 optimizer groups, this declaration 0"), "%s", e);
	ps_client_free(cs[1]);
	cs[0] = connect_retry(0);
	cs[1] = connect_retry(1);
	declare_both(cs, ms);
	check_ref(&m0, &R, "rank 0 after the restart");
	check_ref(&m1, &R, "rank 1 after the restart");
	for (; k < 6; k++) {
		step(cs, ms, k);
		ref_step(&R, k);
		check_ref(&m0, &R, "rank 0 after the restart");
	}
	ps_client_free(cs[0]);
	ps_client_free(cs[1]);
	stop();

	/* and bit for bit as a run that was never interrupted */
	float restarted[NT][MAXN];
	memcpy(restarted, m0.v, sizeof(restarted));
	start();
	cs[0] = connect_retry(0);
	cs[1] = connect_retry(1);
	declare_both(cs, ms);
	for (k = 0; k < 6; k++)
		step(cs, ms, k);
	for (int t = 0; t < NT; t++)
		for (int i = 0; i < counts[t]; i++)
			ck_assert_msg(m0.v[t][i] == restarted[t][i], "%s[%d]: %a uninterrupted, %a "
				      "through the restart", names[t], i, m0.v[t][i], restarted[t][i]);
	ps_client_free(cs[0]);
	ps_client_free(cs[1]);
	stop();
}
END_TEST

/* A raw Declare of one tensor "a"[4] with the given groups and group_of,
 * to shard k, as rank 0's with values (but no payload: every check before
 * the payload's length refuses first): the shard's answer. */
static int raw_declare(struct ps_client *c, int k, Ps__OptimGroup **gs, size_t ng,
		       uint32_t *gof, size_t ngof)
{
	Ps__Declare m = PS__DECLARE__INIT;
	struct req *r = ps__client_req_new(c, REQ_DECLARE);
	static char name_a[] = "a";
	char *nm[1] = { name_a };
	uint32_t nd[1] = { 1 };
	int64_t dims[1] = { 4 };

	ck_assert_ptr_nonnull(r);
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_names = 1;
	m.names = nm;
	m.n_ndims = 1;
	m.ndims = nd;
	m.n_dims = 1;
	m.dims = dims;
	m.values = 1;
	m.n_groups = ng;
	m.groups = gs;
	m.n_group_of = ngof;
	m.group_of = gof;
	ck_assert_int_eq(ps__client_pack_part(&r->parts[k], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_int_gt(id, 0);
	return ps_client_wait(c, id);
}

START_TEST(test_groups_refused)
{
	struct model m0, m1, *ms[2] = { &m0, &m1 };
	struct ps_client *cs[2], *c;
	struct ps_optim_group bad[NT];
	int gof[NT];
	const char *e;
	int rc;

	start();
	c = connect_retry(0);
	model_init(&m0, 1.0f);
	/* the client's own checks: nothing is sent */
	memcpy(bad, groups, sizeof(bad));
	bad[2].kind = "rmsprop";
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, bad, NT, group_of), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c), "optimizer group 2: unknown kind 'rmsprop'"), "%s",
		      ps_client_error(c));
	memcpy(bad, groups, sizeof(bad));
	bad[3].beta2 = 1.0f;
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, bad, NT, group_of), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c), "optimizer group 3: beta2 is 1"), "%s",
		      ps_client_error(c));
	/* each bound of each field (group 2, adam): the interval named, its
	 * open ends refused at the end itself */
	static const struct {
		size_t off;
		const char *field;
		float v;
		const char *interval;
	} bounds[] = {
		{ offsetof(struct ps_optim_group, momentum), "momentum", -1.0f, "[0, 1e+06]" },
		{ offsetof(struct ps_optim_group, dampening), "dampening", 1.5f, "[0, 1]" },
		{ offsetof(struct ps_optim_group, beta1), "beta1", 1.0f, "[0, 1)" },
		{ offsetof(struct ps_optim_group, beta1), "beta1", -0.5f, "[0, 1)" },
		{ offsetof(struct ps_optim_group, beta2), "beta2", -0.5f, "[0, 1)" },
		{ offsetof(struct ps_optim_group, weight_decay), "weight_decay", -1.0f, "[0, 1e+06]" },
		{ offsetof(struct ps_optim_group, lr_decay), "lr_decay", -1.0f, "[0, 1e+06]" },
		{ offsetof(struct ps_optim_group, initial_accumulator), "initial_accumulator", -1.0f,
		  "[0, 1e+30]" },
		{ offsetof(struct ps_optim_group, eps), "eps", 0.0f, "(0, 1e+06]" },
	};
	for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++) {
		char want[160];
		memcpy(bad, groups, sizeof(bad));
		memcpy((char *)&bad[2] + bounds[i].off, &bounds[i].v, sizeof(float));
		snprintf(want, sizeof(want), "optimizer group 2: %s is %g, expected %s",
			 bounds[i].field, (double)bounds[i].v, bounds[i].interval);
		ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, bad, NT, group_of),
				 PS_ECONFIG);
		ck_assert_msg(strstr(ps_client_error(c), want), "'%s' not in '%s'", want,
			      ps_client_error(c));
	}
	memcpy(gof, group_of, sizeof(gof));
	gof[4] = NT;
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, groups, NT, gof), -EINVAL);
	ck_assert_msg(strstr(ps_client_error(c), "parameter 'ada': optimizer group 6, expected "
			     "0..5"), "%s", ps_client_error(c));
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, groups, 0, group_of), -EINVAL);
	ck_assert_msg(strstr(ps_client_error(c), "0 optimizer groups: expected 1..64, with groups "
			     "and group_of given"), "%s", ps_client_error(c));
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, groups, PS_MAX_GROUPS + 1, group_of),
			 -EINVAL);
	ck_assert_int_eq(ps_client_set_lr(c, 0, 0.1f), -EINVAL); /* nothing declared */

	/* a peer's Declare: every group checked before anything is built */
	Ps__OptimGroup g0 = PS__OPTIM_GROUP__INIT, *gp[1] = { &g0 };
	uint32_t one = 0;
	static char rms[] = "rmsprop", adam[] = "adam";
	g0.kind = rms;
	g0.lr = 0.1f;
	rc = raw_declare(c, 0, gp, 1, &one, 1);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ECONFIG && strstr(e, "unknown kind 'rmsprop'"), "%d %s", rc, e);
	g0.kind = adam;
	g0.beta1 = 0.9f;
	g0.beta2 = 0.999f;
	g0.eps = NAN;
	rc = raw_declare(c, 0, gp, 1, &one, 1);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ECONFIG && strstr(e, "optimizer group 0: eps is nan"), "%d %s", rc, e);
	g0.eps = 1e-8f;
	one = 1;
	rc = raw_declare(c, 0, gp, 1, &one, 1);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_EPROTO && strstr(e, "tensor 0 ('a'): optimizer group 1, only 1 "
						"groups"), "%d %s", rc, e);
	one = 0;
	rc = raw_declare(c, 0, gp, 1, &one, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_EPROTO && strstr(e, "one index per tensor"), "%d %s", rc, e);
	ps_client_free(c);

	/* the shards still take an honest declaration */
	cs[0] = connect_retry(0);
	cs[1] = connect_retry(1);
	declare_both(cs, ms);
	ck_assert_int_eq(ps_client_set_lr(cs[0], NT, 0.1f), -EINVAL);
	ck_assert_msg(strstr(ps_client_error(cs[0]), "optimizer group 6: the declared tensors "
			     "have 6 groups"), "%s", ps_client_error(cs[0]));
	ck_assert_int_eq(ps_client_set_lr(cs[0], 1, NAN), -EINVAL);
	ck_assert_msg(strstr(ps_client_error(cs[0]), "optimizer group 1: learning rate nan"), "%s",
		      ps_client_error(cs[0]));
	ck_assert_int_eq(ps_client_set_lr(cs[0], 1, -0.5f), -EINVAL);
	ck_assert_int_eq(ps_client_set_lr(cs[0], -1, 0.5f), -EINVAL);

	/* a push whose rate for group 4 is NaN (past set_lr's check): the
	 * shards refuse it whole, naming the group */
	const struct ps_config *cc = ps_client_config(cs[0]);
	float ones[MAXN] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	struct ps_tensor gt[NT];
	for (int t = 0; t < NT; t++)
		gt[t] = ps_tensor_of(cc, t, ones);
	pthread_mutex_lock(&cs[0]->mu);
	cs[0]->group_lr[4] = NAN;
	pthread_mutex_unlock(&cs[0]->mu);
	int64_t id = ps_client_push(cs[0], 0, gt, NT, 0);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(cs[0], id), -EINVAL);
	e = ps_client_error(cs[0]);
	ck_assert_msg(strstr(e, "optimizer group 4: learning rate nan"), "%s", e);
	/* a push with rates for 2 groups of the 6: refused whole too */
	cs[0]->own_cfg->ngroups = 2;
	id = ps_client_push(cs[0], 0, gt, NT, 0);
	cs[0]->own_cfg->ngroups = NT;
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(cs[0], id), PS_EPROTO);
	e = ps_client_error(cs[0]);
	ck_assert_msg(strstr(e, "push carries 2 group learning rates, the declared tensors have 6 "
			     "optimizer groups"), "%s", e);
	/* nothing of it applied: a normal clock 0 still gives the reference */
	pthread_mutex_lock(&cs[0]->mu);
	cs[0]->group_lr[4] = groups[4].lr;
	pthread_mutex_unlock(&cs[0]->mu);
	struct ref R;
	ref_init(&R);
	step(cs, ms, 0);
	ref_step(&R, 0);
	check_ref(&m0, &R, "after the refused push");
	ps_client_free(cs[0]);
	ps_client_free(cs[1]);
	stop();
}
END_TEST

/* compression.tensors of a config without a model apply by declared name,
 * on the client and on the shards alike; an entry that names no declared
 * tensor refuses the declaration (the client's, and a peer's at the shard). */
START_TEST(test_declared_codec_overrides)
{
	struct model m0, m1, *ms[2] = { &m0, &m1 };
	struct ps_client *cs[2], *c;
	struct ps_shard_stats st;
	const char *e;
	int rc;

	start_with("compression:\n  tensors:\n    - {name: adam, codec: fp16}\n");
	c = connect_retry(0);
	/* the client: "adam" missing from the list */
	model_init(&m0, 1.0f);
	m0.p[2].name = "adam2";
	ck_assert_int_eq(ps_client_declare_groups(c, m0.p, NT, groups, NT, group_of), PS_ECONFIG);
	e = ps_client_error(c);
	ck_assert_msg(strstr(e, path) && strstr(e, "compression.tensors[0] names 'adam', which is "
						   "not a declared tensor"), "%s", e);
	/* a peer's Declare of "a" alone: the shard refuses it the same way */
	Ps__OptimGroup g0 = PS__OPTIM_GROUP__INIT, *gp[1] = { &g0 };
	static char sgd[] = "sgd";
	uint32_t zero = 0;
	g0.kind = sgd;
	g0.lr = 0.1f;
	ps_client_free(c);
	c = connect_retry(0);
	for (int k = 0; k < 2; k++) {
		rc = raw_declare(c, k, gp, 1, &zero, 1);
		e = ps_client_error(c);
		ck_assert_msg(rc == PS_ECONFIG && strstr(e, "compression.tensors[0] names 'adam'"),
			      "shard %d: %d %s", k, rc, e);
	}
	ps_client_free(c);
	/* the honest declaration: "adam" is pushed as fp16, the rest raw, and
	 * the shards take both */
	cs[0] = connect_retry(0);
	cs[1] = connect_retry(1);
	declare_both(cs, ms);
	ck_assert_int_eq(ps_client_config(cs[0])->tensors[2].codec, PS_CODEC_FP16);
	ck_assert_int_eq(ps_client_config(cs[0])->tensors[0].codec, PS_CODEC_NONE);
	step(cs, ms, 0);
	uint64_t raw16 = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(cs[0], k, &st), 0);
		raw16 += st.push_raw_bytes[PS_CODEC_FP16];
	}
	ck_assert_uint_eq(raw16, 2 * 10 * sizeof(float)); /* both ranks' adam[10] */
	ps_client_free(cs[0]);
	ps_client_free(cs[1]);
	stop();
}
END_TEST

/* Async mode: a reduce group is refused (no clock to combine), by the
 * client and by the shard. */
START_TEST(test_groups_reduce_async)
{
	char yaml[512], p[64] = "", err[512];
	struct ps_config acfg;
	struct ps_client *c = NULL;
	pid_t pid;
	int pt = tu_free_port(), rc = -1;

	snprintf(yaml, sizeof(yaml), "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "consistency:\n  mode: async\nlog:\n  level: error\n", pt);
	ck_assert_int_eq(tu_write_temp(p, yaml), 0);
	ck_assert_msg(ps_config_load(&acfg, p, err, sizeof(err)) == 0, "%s", err);
	pid = tu_start_server(p, 0);
	for (int i = 0; i < 100 && rc; i++) {
		rc = ps_client_init(&c, &acfg, 0, err, sizeof(err));
		if (rc)
			tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "%s", err);
	float v[4] = { 0 };
	int64_t d4[1] = { 4 };
	struct ps_param pa = { "a", 1, d4, v };
	struct ps_optim_group red = { .kind = "reduce", .average = 1 };
	int g0 = 0;
	ck_assert_int_eq(ps_client_declare_groups(c, &pa, 1, &red, 1, &g0), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c), "kind reduce") &&
		      strstr(ps_client_error(c), "needs consistency.mode sync"), "%s",
		      ps_client_error(c));
	Ps__OptimGroup m = PS__OPTIM_GROUP__INIT, *gp[1] = { &m };
	static char reduce[] = "reduce";
	uint32_t one = 0;
	m.kind = reduce;
	rc = raw_declare(c, 0, gp, 1, &one, 1);
	ck_assert_msg(rc == PS_ECONFIG && strstr(ps_client_error(c), "needs consistency.mode sync"),
		      "%d %s", rc, ps_client_error(c));
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unlink(p);
}
END_TEST

/* ps_optim_group_check, which the client and the shard run on every
 * declared group: each bounded field one step past each of its bounds
 * alone (and NaN) refused with the group, the field, the value and the
 * interval; eps only where the kind divides by it; nesterov only for
 * momentum without dampening; reduce only in sync; a kind past the list.
 * No shard: the function. */
START_TEST(test_group_check_every_bound)
{
	struct ps_optim_cfg a = { .kind = PS_OPT_ADAM, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f,
				  .eps = 1e-8f }, b;
	char why[300];

	ck_assert_msg(ps_optim_group_check(3, &a, 1, why, sizeof(why)) == 0, "%s", why);
#define BAD(field, v, text)                                                                \
	do {                                                                               \
		b = a;                                                                     \
		b.field = v;                                                               \
		why[0] = 0;                                                                \
		ck_assert_msg(ps_optim_group_check(3, &b, 0, why, sizeof(why)) == PS_ECONFIG && \
			      strcmp(why, text) == 0, #field " = " #v ": '%s', '%s' expected",  \
			      why, text);                                                  \
	} while (0)
	BAD(kind, PS_OPT_COUNT, "optimizer group 3: unknown kind 6");
	BAD(lr, -0.5f, "optimizer group 3: learning rate -0.5 is not finite and >= 0");
	BAD(lr, NAN, "optimizer group 3: learning rate nan is not finite and >= 0");
	BAD(momentum, -1.0f, "optimizer group 3: momentum is -1, expected [0, 1e+06]");
	BAD(momentum, 2e6f, "optimizer group 3: momentum is 2e+06, expected [0, 1e+06]");
	BAD(dampening, -0.5f, "optimizer group 3: dampening is -0.5, expected [0, 1]");
	BAD(dampening, 1.5f, "optimizer group 3: dampening is 1.5, expected [0, 1]");
	BAD(beta1, -0.5f, "optimizer group 3: beta1 is -0.5, expected [0, 1)");
	BAD(beta1, 1.0f, "optimizer group 3: beta1 is 1, expected [0, 1)");
	BAD(beta2, -0.5f, "optimizer group 3: beta2 is -0.5, expected [0, 1)");
	BAD(beta2, 1.0f, "optimizer group 3: beta2 is 1, expected [0, 1)");
	BAD(beta2, INFINITY, "optimizer group 3: beta2 is inf, expected [0, 1)");
	BAD(weight_decay, -1.0f, "optimizer group 3: weight_decay is -1, expected [0, 1e+06]");
	BAD(weight_decay, 2e6f, "optimizer group 3: weight_decay is 2e+06, expected [0, 1e+06]");
	BAD(lr_decay, -1.0f, "optimizer group 3: lr_decay is -1, expected [0, 1e+06]");
	BAD(lr_decay, 2e6f, "optimizer group 3: lr_decay is 2e+06, expected [0, 1e+06]");
	BAD(initial_accumulator, -1.0f,
	    "optimizer group 3: initial_accumulator is -1, expected [0, 1e+30]");
	BAD(initial_accumulator, 2e30f,
	    "optimizer group 3: initial_accumulator is 2e+30, expected [0, 1e+30]");
	BAD(eps, 0.0f, "optimizer group 3: eps is 0, expected (0, 1e+06]");
	BAD(eps, 2e6f, "optimizer group 3: eps is 2e+06, expected (0, 1e+06]");
	BAD(nesterov, 1, "optimizer group 3: nesterov needs sgd with momentum > 0 and dampening 0 "
	    "(as torch.optim.SGD)");
	/* eps is read by adam, adamw and adagrad only */
	for (int k = PS_OPT_SGD; k < PS_OPT_COUNT; k++) {
		b = a;
		b.kind = (enum ps_optim_kind)k;
		b.eps = 0.0f;
		int rc = ps_optim_group_check(3, &b, 0, why, sizeof(why));
		ck_assert_msg(rc == (k == PS_OPT_ADAM || k == PS_OPT_ADAMW || k == PS_OPT_ADAGRAD
				     ? PS_ECONFIG : 0), "kind %d with eps 0: %d", k, rc);
	}
	/* nesterov: momentum without dampening only */
	a.kind = PS_OPT_MOMENTUM;
	a.momentum = 0.9f;
	b = a;
	b.nesterov = 1;
	ck_assert_msg(ps_optim_group_check(3, &b, 0, why, sizeof(why)) == 0, "%s", why);
	b.dampening = 0.5f;
	ck_assert_int_eq(ps_optim_group_check(3, &b, 0, why, sizeof(why)), PS_ECONFIG);
	/* reduce: sync only */
	a.kind = PS_OPT_REDUCE;
	ck_assert_int_eq(ps_optim_group_check(3, &a, 0, why, sizeof(why)), 0);
	ck_assert_int_eq(ps_optim_group_check(3, &a, 1, why, sizeof(why)), PS_ECONFIG);
	ck_assert_msg(strstr(why, "optimizer group 3: kind reduce ") &&
		      strstr(why, "needs consistency.mode sync"), "%s", why);
#undef BAD
}
END_TEST

int main(void)
{
	Suite *s = suite_create("groups");
	TCase *tc = tcase_create("groups");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_groups_train_and_restart);
	TU_ADD(tc, test_groups_refused);
	TU_ADD(tc, test_groups_reduce_async);
	TU_ADD(tc, test_declared_codec_overrides);
	TU_ADD(tc, test_group_check_every_bound);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
