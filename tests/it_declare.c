/* it_declare.c - tensors declared at run time, with real ps-server
 * processes (server/declare.c, worker/client/ps_client_declare.c): the
 * config names no model; rank 0's declaration creates the tensors with its
 * values and every other rank starts from them; a declaration that differs
 * is refused naming the difference; a restarted worker continues from the
 * shards' weights; a shard killed and restarted from its checkpoint keeps
 * the declared tensors; 5,000 tensors work; hostile declarations (too
 * many tensors, huge or inconsistent shapes, wrong or non-finite values,
 * a monitor, a frame before the handshake) are refused and change nothing.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_client_int.h" /* raw Declare frames over an authenticated client */
#include "ps_err.h"
#include "ps_time.h"
#include "wire.h"
#include "test_util.h"

static char path[64], dir[64];
static struct ps_config cfg;
static pid_t srv[2];
static int port[2];

/* A config without a model: 2 shards, 2 workers, sync SGD lr 0.5, small
 * slices (tensors cut over both shards), checkpoints on request. */
static void start(int timeout_ms)
{
	char yaml[1024], err[512];

	snprintf(dir, sizeof(dir), "/tmp/it_declare.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	port[0] = tu_free_port();
	port[1] = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "slice_bytes: 64\n"
		 "optimizer:\n  name: sgd\n  lr: 0.5\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n"
		 "limits:\n  request_timeout_ms: %d\n"
		 "log:\n  level: warn\n", port[0], port[1], dir, timeout_ms);
	path[0] = 0;
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(cfg.declare, 1);
	ck_assert_int_eq(cfg.ntensors, 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
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
		/* the shards start, or have not yet seen the connection of the
		 * same rank that the test just closed */
		if (rc != -ECONNREFUSED && !strstr(err, "is connected already"))
			break;
		tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "connect rank %d: %s", rank, err);
	return c;
}

/* The test model: w [3, 7] (21 floats: two slices), b [7], s a scalar. */
#define NP 3
static const int64_t dw[] = { 3, 7 }, db[] = { 7 };
struct model {
	float w[21], b[7], s[1];
	struct ps_param p[NP];
};

static void model_init(struct model *m, float base)
{
	for (int i = 0; i < 21; i++)
		m->w[i] = base + (float)i * 0.5f;
	for (int i = 0; i < 7; i++)
		m->b[i] = base - (float)i;
	m->s[0] = base + 100.0f;
	m->p[0] = (struct ps_param){ "w", 2, dw, m->w };
	m->p[1] = (struct ps_param){ "b", 1, db, m->b };
	m->p[2] = (struct ps_param){ "s", 0, NULL, m->s };
}

/* m holds rank 0's initial values (base 1) minus d in every element */
static void assert_values(const struct model *m, float d, const char *what)
{
	struct model want;

	model_init(&want, 1.0f);
	for (int i = 0; i < 21; i++)
		ck_assert_msg(m->w[i] == want.w[i] - d, "%s: w[%d] %g, want %g", what, i, m->w[i],
			      want.w[i] - d);
	for (int i = 0; i < 7; i++)
		ck_assert_msg(m->b[i] == want.b[i] - d, "%s: b[%d] %g, want %g", what, i, m->b[i],
			      want.b[i] - d);
	ck_assert_msg(m->s[0] == want.s[0] - d, "%s: s %g, want %g", what, m->s[0], want.s[0] - d);
}

/* Both ranks push a unit gradient for clock k (sync: summed, lr 0.5, so
 * every weight moves by exactly 1), then each pulls version k + 1. */
static void step(struct ps_client *c0, struct model *m0, struct ps_client *c1, struct model *m1,
		 uint64_t k)
{
	static float ones[21];
	struct ps_client *cs[2] = { c0, c1 };
	struct model *ms[2] = { m0, m1 };

	for (int i = 0; i < 21; i++)
		ones[i] = 1.0f;
	for (int r = 0; r < 2; r++) {
		const struct ps_config *cc = ps_client_config(cs[r]);
		struct ps_tensor g[NP];
		for (int i = 0; i < NP; i++)
			g[i] = ps_tensor_of(cc, i, ones);
		int64_t id = ps_client_push(cs[r], k, g, NP, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(cs[r], id) == 0, "push rank %d: %s", r,
			      ps_client_error(cs[r]));
	}
	for (int r = 0; r < 2; r++) {
		const struct ps_config *cc = ps_client_config(cs[r]);
		struct ps_tensor w[NP] = { ps_tensor_of(cc, 0, ms[r]->w), ps_tensor_of(cc, 1, ms[r]->b),
					   ps_tensor_of(cc, 2, ms[r]->s) };
		int64_t id = ps_client_pull(cs[r], k + 1, w, NP);
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

	d->rc = ps_client_declare(d->c, d->m->p, NP);
	return NULL;
}

START_TEST(test_declare_and_train)
{
	struct model m0, m1, m2;
	struct ps_client *c0, *c1, *c2;
	const char *e;

	start(1500);
	c1 = connect_retry(1);
	/* rank 1 alone: waits for rank 0's declaration, then says so */
	model_init(&m1, 50.0f);
	double t0 = ps_now_s();
	ck_assert_int_eq(ps_client_declare(c1, m1.p, NP), PS_ETIMEDOUT);
	e = ps_client_error(c1);
	ck_assert_msg(strstr(e, "rank 0") && strstr(e, "request_timeout_ms"), "%s", e);
	ck_assert_msg(ps_now_s() - t0 >= 1.4, "gave up after %.2f s", ps_now_s() - t0);
	ps_client_free(c1);

	/* rank 1 declares while rank 0 does: rank 1 gets rank 0's values */
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	model_init(&m0, 1.0f);
	model_init(&m1, 50.0f);
	struct declarer d1 = { c1, &m1, -1 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	ck_assert_msg(ps_client_declare(c0, m0.p, NP) == 0, "rank 0: %s", ps_client_error(c0));
	pthread_join(th, NULL);
	ck_assert_msg(d1.rc == 0, "rank 1: %s", ps_client_error(c1));
	assert_values(&m0, 0.0f, "rank 0 after declaring");
	assert_values(&m1, 0.0f, "rank 1 after declaring");
	ck_assert_int_eq(ps_config_ntensors(ps_client_config(c1)), NP);
	ck_assert_int_eq(ps_config_tensor_count(ps_client_config(c1), 0), 21);
	ck_assert_int_eq(ps_config_ntensors(&cfg), 0); /* the caller's config is untouched */
	ck_assert_int_eq(ps_client_declare(c0, m0.p, NP), PS_ESTATE);

	step(c0, &m0, c1, &m1, 0);
	assert_values(&m0, 1.0f, "rank 0 after clock 0");
	assert_values(&m1, 1.0f, "rank 1 after clock 0");

	/* rank 1 stops; a differing declaration: a shape, a name, a missing
	 * tensor */
	ps_client_free(c1);
	static const int64_t db6[] = { 6 };
	c2 = connect_retry(1);
	model_init(&m2, 9.0f);
	m2.p[1].dims = db6;
	ck_assert_int_eq(ps_client_declare(c2, m2.p, NP), PS_ECONFIG);
	e = ps_client_error(c2);
	ck_assert_msg(strstr(e, "the shard has b[7]") && strstr(e, "declares b[6]") &&
		      strstr(e, "#1"), "%s", e);
	ps_client_free(c2);
	c2 = connect_retry(1);
	model_init(&m2, 9.0f);
	m2.p[0].name = "weight";
	ck_assert_int_eq(ps_client_declare(c2, m2.p, NP), PS_ECONFIG);
	e = ps_client_error(c2);
	ck_assert_msg(strstr(e, "the shard has w[3,7]") && strstr(e, "declares weight[3,7]"), "%s", e);
	ps_client_free(c2);
	c2 = connect_retry(1);
	model_init(&m2, 9.0f);
	ck_assert_int_eq(ps_client_declare(c2, m2.p, NP - 1), PS_ECONFIG);
	e = ps_client_error(c2);
	ck_assert_msg(strstr(e, "the shard has s[]") && strstr(e, "declares (none)"), "%s", e);
	/* nothing changed: the refused arrays are left alone */
	ck_assert(m2.w[0] == 9.0f);
	ps_client_free(c2);

	/* a monitor may not declare */
	c2 = connect_retry(-1);
	ck_assert_int_ne(ps_client_declare(c2, m2.p, NP), 0);
	e = ps_client_error(c2);
	ck_assert_msg(strstr(e, "only a worker may declare"), "%s", e);
	ps_client_free(c2);

	/* rank 1 restarted: re-declares and continues from the shards' weights */
	c1 = connect_retry(1);
	model_init(&m1, 50.0f);
	ck_assert_msg(ps_client_declare(c1, m1.p, NP) == 0, "%s", ps_client_error(c1));
	assert_values(&m1, 1.0f, "restarted rank 1 after declaring");
	ck_assert_uint_eq(ps_client_clock(c1), 1);
	step(c0, &m0, c1, &m1, 1);
	assert_values(&m0, 2.0f, "rank 0 after clock 1");
	assert_values(&m1, 2.0f, "rank 1 after clock 1");

	/* rank 0 restarted: its new values are not used */
	ps_client_free(c0);
	c0 = connect_retry(0);
	model_init(&m0, 70.0f);
	ck_assert_msg(ps_client_declare(c0, m0.p, NP) == 0, "%s", ps_client_error(c0));
	assert_values(&m0, 2.0f, "restarted rank 0 after declaring");
	ps_client_free(c0);
	ps_client_free(c1);
	stop();
}
END_TEST

START_TEST(test_declared_shard_restart)
{
	struct model m0, m1;
	struct ps_client *c0, *c1;
	struct ps_shard_stats st;
	char ck[128];
	struct stat sb;

	start(5000);
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	model_init(&m0, 1.0f);
	model_init(&m1, 50.0f);
	struct declarer d1 = { c1, &m1, -1 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	ck_assert_msg(ps_client_declare(c0, m0.p, NP) == 0, "rank 0: %s", ps_client_error(c0));
	pthread_join(th, NULL);
	ck_assert_msg(d1.rc == 0, "rank 1: %s", ps_client_error(c1));
	step(c0, &m0, c1, &m1, 0);
	step(c0, &m0, c1, &m1, 1);
	assert_values(&m0, 2.0f, "after 2 clocks");
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_checkpoint(c0, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: %s", k, st.checkpoint_error);
	}
	ps_client_free(c0);
	ps_client_free(c1);

	/* shard 1 killed (no checkpoint at exit) and restarted from the file */
	kill(srv[1], SIGKILL);
	ck_assert_int_eq(tu_wait_child(srv[1]), 128 + SIGKILL);
	snprintf(ck, sizeof(ck), "%s/shard-1.ckpt", dir);
	ck_assert_int_eq(stat(ck, &sb), 0);
	srv[1] = tu_start_server(path, 1);
	/* rank 1 first: the shards must have the tensors without rank 0 */
	c1 = connect_retry(1);
	ck_assert_int_eq(ps_client_from_checkpoint(c1), 1);
	model_init(&m1, 50.0f);
	ck_assert_msg(ps_client_declare(c1, m1.p, NP) == 0, "rank 1: %s", ps_client_error(c1));
	assert_values(&m1, 2.0f, "rank 1 after the restart");
	/* and the restarted shard still refuses another model */
	c0 = connect_retry(0);
	model_init(&m0, 1.0f);
	static const int64_t dw2[] = { 7, 3 };
	m0.p[0].dims = dw2;
	ck_assert_int_eq(ps_client_declare(c0, m0.p, NP), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c0), "declares w[7,3]"), "%s", ps_client_error(c0));
	ps_client_free(c0);
	c0 = connect_retry(0);
	model_init(&m0, 1.0f);
	ck_assert_msg(ps_client_declare(c0, m0.p, NP) == 0, "rank 0: %s", ps_client_error(c0));
	step(c0, &m0, c1, &m1, 2);
	assert_values(&m0, 3.0f, "rank 0 after clock 2");
	assert_values(&m1, 3.0f, "rank 1 after clock 2");
	ps_client_free(c0);
	ps_client_free(c1);

	/* the whole cluster stopped (checkpoints at SIGTERM) and started again */
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	c1 = connect_retry(1);
	model_init(&m1, 50.0f);
	ck_assert_msg(ps_client_declare(c1, m1.p, NP) == 0, "rank 1: %s", ps_client_error(c1));
	assert_values(&m1, 3.0f, "rank 1 after the cluster's restart");
	ck_assert_uint_eq(ps_client_clock(c1), 3);
	ps_client_free(c1);
	stop();
}
END_TEST

#define MANY 5000

START_TEST(test_declare_many_tensors)
{
	static float v0[MANY][3], v1[MANY][3], g[3] = { 1, 1, 1 };
	static struct ps_param p0[MANY], p1[MANY];
	static char names[MANY][16];
	static const int64_t d3[] = { 3 };
	static struct ps_tensor t[MANY];
	struct ps_client *c0, *c1;

	start(5000);
	for (int i = 0; i < MANY; i++) {
		snprintf(names[i], sizeof(names[i]), "layer%d.w", i);
		for (int j = 0; j < 3; j++) {
			v0[i][j] = (float)(i * 3 + j);
			v1[i][j] = -1.0f;
		}
		p0[i] = (struct ps_param){ names[i], 1, d3, v0[i] };
		p1[i] = (struct ps_param){ names[i], 1, d3, v1[i] };
	}
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	ck_assert_msg(ps_client_declare(c0, p0, MANY) == 0, "rank 0: %s", ps_client_error(c0));
	ck_assert_msg(ps_client_declare(c1, p1, MANY) == 0, "rank 1: %s", ps_client_error(c1));
	ck_assert_int_eq(ps_config_ntensors(ps_client_config(c1)), MANY);
	for (int i = 0; i < MANY; i++)
		for (int j = 0; j < 3; j++)
			ck_assert_msg(v1[i][j] == (float)(i * 3 + j), "tensor %d[%d]: %g", i, j, v1[i][j]);
	/* one clock through all of them */
	struct ps_client *cs[2] = { c0, c1 };
	for (int r = 0; r < 2; r++) {
		for (int i = 0; i < MANY; i++)
			t[i] = ps_tensor_of(ps_client_config(cs[r]), i, g);
		int64_t id = ps_client_push(cs[r], 0, t, MANY, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(cs[r], id) == 0, "push: %s",
			      ps_client_error(cs[r]));
	}
	for (int i = 0; i < MANY; i++)
		t[i] = ps_tensor_of(ps_client_config(c1), i, v1[i]);
	int64_t id = ps_client_pull(c1, 1, t, MANY);
	ck_assert_msg(id > 0 && ps_client_wait(c1, id) == 0, "pull: %s", ps_client_error(c1));
	for (int i = 0; i < MANY; i++)
		ck_assert_msg(v1[i][2] == (float)(i * 3 + 2) - 1.0f, "tensor %d: %g", i, v1[i][2]);
	/* one more than the limit is refused before anything is sent */
	ps_client_free(c1);
	c1 = connect_retry(1);
	ck_assert_int_eq(ps_client_declare(c1, p1, PS_MAX_TENSORS + 1), PS_ETOOBIG);
	ck_assert_msg(strstr(ps_client_error(c1), "expected 1..8192"), "%s", ps_client_error(c1));
	ps_client_free(c0);
	ps_client_free(c1);
	stop();
}
END_TEST

/* Sends a hand-made Declare to shard k over c's authenticated connection;
 * returns the shard's answer (0, or the Error's code). */
static int raw_declare(struct ps_client *c, int k, size_t nnames, char **names, size_t nndims,
		       uint32_t *ndims, size_t ndim, int64_t *dims, int values, const void *payload,
		       size_t plen)
{
	Ps__Declare m = PS__DECLARE__INIT;
	struct req *r = ps__client_req_new(c, REQ_DECLARE);
	struct ps_iov *iov = malloc(sizeof(*iov));

	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_nonnull(iov);
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_names = nnames;
	m.names = names;
	m.n_ndims = nndims;
	m.ndims = ndims;
	m.n_dims = ndim;
	m.dims = dims;
	m.values = values;
	if (plen) {
		iov->base = payload;
		iov->len = plen;
		r->parts[k].iov = iov;
		r->parts[k].niov = 1;
	} else {
		free(iov);
	}
	ck_assert_int_eq(ps__client_pack_part(&r->parts[k], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_int_gt(id, 0);
	return ps_client_wait(c, id);
}

/* The shard stays up, with no tensors: an honest declaration still works. */
static void honest_after(const char *what)
{
	struct model m0;
	struct ps_client *c0 = connect_retry(0);

	model_init(&m0, 1.0f);
	ck_assert_msg(ps_client_declare(c0, m0.p, NP) == 0, "after %s: %s", what,
		      ps_client_error(c0));
	assert_values(&m0, 0.0f, what);
	ps_client_free(c0);
}

START_TEST(test_declare_hostile)
{
	static char *names[PS_MAX_TENSORS + 1];
	static uint32_t nd[PS_MAX_TENSORS + 1];
	static char name_a[] = "a", name_b[] = "b";
	int64_t dims[4];
	float vals[4] = { 1, 2, 3, 4 };
	struct ps_client *c;
	const char *e;
	int rc;

	start(5000);
	c = connect_retry(0);
	for (int i = 0; i <= PS_MAX_TENSORS; i++) {
		names[i] = name_a;
		nd[i] = 0;
	}
	/* too many tensors */
	rc = raw_declare(c, 0, PS_MAX_TENSORS + 1, names, PS_MAX_TENSORS + 1, nd, 0, dims, 0, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ETOOBIG && strstr(e, "expected 1..8192 tensors"), "%d %s", rc, e);
	/* a huge dim, and dims whose product overflows */
	names[0] = name_a;
	nd[0] = 1;
	dims[0] = INT64_C(1) << 40;
	rc = raw_declare(c, 0, 1, names, 1, nd, 1, dims, 1, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ETOOBIG && strstr(e, "dim 0 is 1099511627776"), "%d %s", rc, e);
	nd[0] = 3;
	dims[0] = dims[1] = dims[2] = INT64_C(1) << 20;
	rc = raw_declare(c, 0, 1, names, 1, nd, 3, dims, 1, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ETOOBIG && strstr(e, "dim 1 is 1048576"), "%d %s", rc, e);
	/* shapes that do not add up, names twice */
	nd[0] = 3;
	dims[0] = 2;
	rc = raw_declare(c, 0, 1, names, 1, nd, 1, dims, 1, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_EPROTO && strstr(e, "3 dims, only 1 left"), "%d %s", rc, e);
	rc = raw_declare(c, 0, 2, names, 1, nd, 1, dims, 1, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ETOOBIG && strstr(e, "one shape each"), "%d %s", rc, e);
	names[1] = name_a;
	nd[0] = nd[1] = 1;
	dims[0] = dims[1] = 1;
	rc = raw_declare(c, 0, 2, names, 2, nd, 2, dims, 1, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_EPROTO && strstr(e, "'a' declared twice"), "%d %s", rc, e);
	/* initial values: the wrong length, not finite */
	names[1] = name_b;
	dims[0] = 4; /* a[4] (16 bytes, one slice), b[1] */
	rc = raw_declare(c, 0, 2, names, 2, nd, 2, dims, 1, vals, 8);
	e = ps_client_error(c);
	ck_assert_msg(rc == PS_ESHAPE && strstr(e, "bytes of initial values"), "%d %s", rc, e);
	rc = raw_declare(c, 0, 2, names, 2, nd, 2, dims, 0, NULL, 0);
	e = ps_client_error(c);
	ck_assert_msg(rc == -EAGAIN && strstr(e, "waiting for rank 0"), "%d %s", rc, e);
	ps_client_free(c);
	/* the shards' share of a[4], b[1] with a NaN: find the shard holding
	 * a (its 16 bytes) by trying both */
	c = connect_retry(0);
	vals[1] = NAN;
	int nan_refused = 0;
	for (int k = 0; k < 2; k++) {
		rc = raw_declare(c, k, 2, names, 2, nd, 2, dims, 1, vals, 16);
		if (rc == PS_ENOFINITE) {
			ck_assert_msg(strstr(ps_client_error(c), "not finite"), "%s", ps_client_error(c));
			nan_refused = 1;
		}
	}
	ck_assert_msg(nan_refused, "no shard refused the NaN");
	ps_client_free(c);
	/* a Declare before the handshake: the connection is closed */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port[1]),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	uint8_t hdr[PS_WIRE_HDR_LEN], buf[64];
	struct ps_frame_hdr h = { .version = PS_PROTOCOL_VERSION, .type = PS_MSG_DECLARE,
				  .meta_len = 2 };
	ps_wire_encode_hdr(hdr, &h);
	ck_assert_int_eq(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	ck_assert_int_eq(write(fd, "\x08\x01", 2), 2);
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	ck_assert_int_eq(poll(&pf, 1, 10000), 1);
	ck_assert_int_le(read(fd, buf, sizeof(buf)), 0);
	close(fd);
	/* after all of it, the shards have no tensors and take rank 0's */
	honest_after("the hostile declarations");
	stop();
}
END_TEST

/* The client's own checks of a declaration, before anything is sent: a
 * name's length (0 and 64 bytes), the number of dims (-1 and 9), a dim of
 * 0 and one whose product passes 2^36 elements, a name twice; each
 * refused naming the parameter, and the client declares the good model
 * after them. A config that names its model has nothing to declare. */
START_TEST(test_declare_client_refusals)
{
	static char longname[65];
	int64_t d2[2] = { 3, 4 }, d0[1] = { 0 }, dbig[2] = { INT64_C(1) << 20, INT64_C(1) << 17 };
	float v[12] = { 0 }, w[12] = { 0 };
	char want[200];
	struct ps_client *c;
	const char *e;

	memset(longname, 'n', 64);
	start(5000);
	c = connect_retry(0);
	static const struct {
		int name_kind, ndims, dims_kind, twice, rc;
		const char *said;
	} bad[] = {
		{ 1, 2, 0, 0, -EINVAL, "parameter 0: name of 0 bytes, expected 1..63" },
		{ 2, 2, 0, 0, -EINVAL, "parameter 0: name of 64 bytes, expected 1..63" },
		{ 0, -1, 0, 0, -EINVAL, "parameter 'x': -1 dims (expected 0..8), dims and data given" },
		{ 0, 9, 0, 0, -EINVAL, "parameter 'x': 9 dims (expected 0..8), dims and data given" },
		{ 0, 1, 1, 0, PS_ETOOBIG, "parameter 'x': dim 0 is 0, expected >= 1 and at most "
		  "68719476736 elements" },
		{ 0, 2, 2, 0, PS_ETOOBIG, "parameter 'x': dim 1 is 131072, expected >= 1 and at most "
		  "68719476736 elements" },
		{ 0, 2, 0, 1, -EINVAL, "parameter 'x' declared twice (#0 and #1)" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct ps_param p[2] = {
			{ bad[i].name_kind == 1 ? "" : bad[i].name_kind == 2 ? longname : "x",
			  bad[i].ndims, bad[i].dims_kind == 1 ? d0 : bad[i].dims_kind == 2 ? dbig : d2, v },
			{ bad[i].twice ? "x" : "y", 2, d2, w },
		};
		int rc = ps_client_declare(c, p, 2);
		e = ps_client_error(c);
		ck_assert_msg(strstr(e, bad[i].said), "case %zu: '%s' not in '%s'", i, bad[i].said, e);
		ck_assert_msg(rc == bad[i].rc, "case %zu: rc %d, expected %d", i, rc, bad[i].rc);
	}
	/* nothing was declared: the good model still is */
	struct ps_param good[2] = { { "x", 2, d2, v }, { "y", 2, d2, w } };
	v[5] = 5.0f;
	ck_assert_msg(ps_client_declare(c, good, 2) == 0, "%s", ps_client_error(c));
	ck_assert_msg(v[5] == 5.0f, "x[5] = %g", (double)v[5]);
	ps_client_free(c);
	stop();

	/* a config that names its model: nothing to declare, nothing sent */
	char p[64] = "", yaml[256], err[512];
	struct ps_config mcfg;
	snprintf(yaml, sizeof(yaml), "cluster:\n  servers: [127.0.0.1:%d]\n  workers: 1\n"
		 "model:\n  tensors:\n    - {name: x, shape: [3, 4]}\n", port[0]);
	ck_assert_int_eq(tu_write_temp(p, yaml), 0);
	ck_assert_msg(ps_config_load(&mcfg, p, err, sizeof(err)) == 0, "%s", err);
	pid_t one = tu_start_server(p, 0);
	c = NULL;
	for (int i = 0; i < 100 && ps_client_init(&c, &mcfg, 0, err, sizeof(err)); i++)
		tu_sleep_ms(50);
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_int_eq(ps_client_declare(c, good, 1), PS_ECONFIG);
	snprintf(want, sizeof(want), "%s names its model (model.preset, .layers or .tensors): "
		 "there is nothing to declare", p);
	ck_assert_msg(strstr(ps_client_error(c), want), "'%s' not in '%s'", want,
		      ps_client_error(c));
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(one), 0);
	unlink(p);
}
END_TEST

START_TEST(test_declare_config)
{
	char p[64] = "", err[512];
	struct ps_config *c = NULL;

	/* replicas follow a declaration (it_replica_decl): such a config loads */
	ck_assert_int_eq(tu_write_temp(p, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
				       "  replicas: 1\n  backups: [127.0.0.1:2]\n"), 0);
	ck_assert_msg(ps_config_open(&c, p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_config_declared(c), 1);
	ps_config_close(c);
	unlink(p);
	p[0] = 0;
	ck_assert_int_eq(tu_write_temp(p, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"), 0);
	ck_assert_int_eq(ps_config_open(&c, p, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_config_declared(c), 1);
	ck_assert_int_eq(ps_config_ntensors(c), 0);
	/* --dump-config of it loads back, still without a model */
	char d[64] = "";
	ck_assert_int_eq(tu_write_temp(d, ""), 0);
	FILE *f = fopen(d, "w");
	ck_assert_ptr_nonnull(f);
	ps_config_dump(c, f);
	fclose(f);
	ps_config_close(c);
	ck_assert_msg(ps_config_open(&c, d, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_config_declared(c), 1);
	ps_config_close(c);
	unlink(d);
	unlink(p);
	p[0] = 0;
	ck_assert_int_eq(tu_write_temp(p, "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
				       "model:\n  preset: mlp\n"), 0);
	ck_assert_int_eq(ps_config_open(&c, p, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_config_declared(c), 0);
	ps_config_close(c);
	unlink(p);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("declare");
	TCase *tc = tcase_create("declare");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_declare_config);
	TU_ADD(tc, test_declare_client_refusals);
	TU_ADD(tc, test_declare_and_train);
	TU_ADD(tc, test_declared_shard_restart);
	TU_ADD(tc, test_declare_many_tensors);
	TU_ADD(tc, test_declare_hostile);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
