/* it_decl_tables.c - embedding tables declared at run time, with real
 * ps-server processes (server/decl_tables.c,
 * worker/client/ps_client_tables.c): two tables of different dims and
 * optimizers beside a YAML one; rank 0's declaration creates them and rank
 * 1 waits for it; two workers push integer row gradients and every row is
 * the exact sum; a differing declaration is refused naming the table, the
 * field and both values; bad declarations (dim 0, unknown optimizer, the
 * name of a YAML table, too many tables) are refused, by the client and
 * by the shards; a restarted worker re-declares; a shard restarted from
 * its checkpoint (or from an incremental one, or with declared tensors and
 * optimizer groups beside the tables) has the tables and their rows
 * before anyone declares.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include "config.h"
#include "ps_client.h"
#include "ps_client_int.h" /* raw DeclareTables frames */
#include "ps_err.h"
#include "table_decl.h"
#include "test_util.h"

static char path[64], dir[64];
static struct ps_config cfg;
static pid_t srv[2];
static int port[2];

/* 2 shards, 2 workers, sync; one YAML table (yaml_t, dim 2, sgd lr 1,
 * zeros), no dense model; checkpoints on request. */
static void start_with(const char *ckpt_extra)
{
	char yaml[1024], err[512];

	snprintf(dir, sizeof(dir), "/tmp/it_decl_tables.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	port[0] = tu_free_port();
	port[1] = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "model:\n  embeddings:\n    - {name: yaml_t, dim: 2, init: zeros, optimizer: sgd, "
		 "lr: 1}\n"
		 "checkpoint:\n  dir: %s\n  on_request: true\n  min_interval_s: 0\n%s"
		 "limits:\n  request_timeout_ms: 5000\n"
		 "log:\n  level: warn\n", port[0], port[1], dir, ckpt_extra);
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
	ck_assert_msg(rc == 0, "connect rank %d: %s", rank, err);
	return c;
}

/* The declared tables: emb_a (dim 4, sgd lr 1, zeros: a row is minus the
 * sum of its gradients), emb_b (dim 3, sgd lr 0.5, const 10: 10 minus half
 * the sum), emb_c (dim 5, rowwise_adagrad, the defaults otherwise). */
#define NT 3
static struct ps_table_decl decl[NT];

static void decl_init(void)
{
	memset(decl, 0, sizeof(decl));
	decl[0] = (struct ps_table_decl){ .name = "emb_a", .dim = 4, .init = "zeros",
					  .optimizer = "sgd", .lr = 1.0f };
	decl[1] = (struct ps_table_decl){ .name = "emb_b", .dim = 3, .init = "const",
					  .init_value = 10.0f, .optimizer = "sgd", .lr = 0.5f };
	decl[2] = (struct ps_table_decl){ .name = "emb_c", .dim = 5 };
}

struct declarer {
	struct ps_client *c;
	const struct ps_table_decl *t;
	int n, rc;
};

static void *declare_thread(void *arg)
{
	struct declarer *d = arg;

	d->rc = ps_client_declare_tables(d->c, d->t, d->n);
	return NULL;
}

/* Rank 1 declares in a thread (it waits for rank 0), rank 0 here. */
static void declare_both(struct ps_client *c0, struct ps_client *c1)
{
	struct declarer d1 = { c1, decl, NT, -1 };
	pthread_t th;

	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	tu_sleep_ms(200); /* rank 1 first: refused -EAGAIN, asks again */
	ck_assert_msg(ps_client_declare_tables(c0, decl, NT) == 0, "rank 0: %s",
		      ps_client_error(c0));
	pthread_join(th, NULL);
	ck_assert_msg(d1.rc == 0, "rank 1: %s", ps_client_error(c1));
}

#define NIDS 40
/* Rank r's gradient of element j of row id at clock k: small integers. */
static float grad(int r, uint64_t id, int j, uint64_t k)
{
	return (float)((int)((id * 7 + (uint64_t)j * 3 + k * 5 + (uint64_t)r * 11) % 9) - 4);
}

/* Rank r pushes ids (every id of rank 0, the even ones of rank 1) to
 * table t (dim) at clock k. */
static void push(struct ps_client *c, int r, const char *t, int dim, uint64_t k)
{
	uint64_t ids[NIDS];
	float g[NIDS * 8];
	size_t n = 0;

	for (uint64_t id = 1; id <= NIDS; id++) {
		if (r == 1 && id % 2)
			continue;
		ids[n] = id * 1000003u;
		for (int j = 0; j < dim; j++)
			g[n * (size_t)dim + (size_t)j] = grad(r, id, j, k);
		n++;
	}
	ck_assert_msg(ps_client_push_rows(c, t, k, ids, n, g, 0) == 0, "push %s rank %d: %s", t,
		      r, ps_client_error(c));
}

/* Sum of every rank's gradients of row id element j over clocks 0..k-1. */
static float sum(uint64_t id, int j, uint64_t clocks)
{
	float s = 0;

	for (uint64_t k = 0; k < clocks; k++)
		for (int r = 0; r < 2; r++)
			if (r == 0 || id % 2 == 0)
				s += grad(r, id, j, k);
	return s;
}

/* Rows of emb_a, emb_b and yaml_t after `clocks` clocks: exact sums. */
static void check_rows(struct ps_client *c, uint64_t clocks, const char *what)
{
	const struct { const char *t; int dim; float base, lr; } tabs[] = {
		{ "emb_a", 4, 0.0f, 1.0f }, { "emb_b", 3, 10.0f, 0.5f }, { "yaml_t", 2, 0.0f, 1.0f },
	};
	uint64_t ids[NIDS];
	float out[NIDS * 8];

	for (uint64_t id = 1; id <= NIDS; id++)
		ids[id - 1] = id * 1000003u;
	for (size_t t = 0; t < sizeof(tabs) / sizeof(tabs[0]); t++) {
		ck_assert_msg(ps_client_pull_rows(c, tabs[t].t, clocks, ids, NIDS, out) == 0,
			      "%s: pull %s: %s", what, tabs[t].t, ps_client_error(c));
		for (uint64_t id = 1; id <= NIDS; id++)
			for (int j = 0; j < tabs[t].dim; j++) {
				float want = tabs[t].base - tabs[t].lr * sum(id, j, clocks);
				float got = out[(id - 1) * (uint64_t)tabs[t].dim + (uint64_t)j];
				ck_assert_msg(got == want, "%s: %s row %llu [%d] = %g, want %g", what,
					      tabs[t].t, (unsigned long long)id, j, got, want);
			}
	}
}

static void clock_step(struct ps_client *c0, struct ps_client *c1, uint64_t k)
{
	struct ps_client *cs[2] = { c0, c1 };

	for (int r = 0; r < 2; r++) {
		push(cs[r], r, "emb_a", 4, k);
		push(cs[r], r, "emb_b", 3, k);
		push(cs[r], r, "emb_c", 5, k);
		push(cs[r], r, "yaml_t", 2, k);
	}
}

/* ps_table_decl_diff, which a declaration of a table the shard holds, a
 * restart from a checkpoint and ps-export go by: each key of a table,
 * changed alone, is named with both values in the whole text, a's first
 * (a key left out of the comparison would let a table be declared again
 * with another setting; a wrong key or value would mislead whoever reads
 * it); equal tables compare equal. No shard: the function itself. */
START_TEST(test_decl_diff_every_key)
{
	struct ps_table_cfg a, b;
	char why[300], want[300];

	ps_table_decl_defaults(&a);
	snprintf(a.name, sizeof(a.name), "e");
	a.dim = 4;
	a.init = PS_INIT_UNIFORM;
	a.init_value = 0.05f;
	a.optimizer = PS_ROPT_SGD;
	ck_assert_int_eq(ps_table_decl_diff(&a, &a, "here", "there", why, sizeof(why)), 0);
#define DIFF(k, field, v)                                                                  \
	do {                                                                               \
		b = a;                                                                     \
		b.field = v;                                                               \
		snprintf(want, sizeof(want), "table 'e': %s differs: %.9g here, %.9g there", \
			 k, (double)a.field, (double)b.field);                             \
		why[0] = 0;                                                                \
		ck_assert_msg(ps_table_decl_diff(&a, &b, "here", "there", why, sizeof(why)) == 1 && \
			      strcmp(why, want) == 0, "%s: '%s', '%s' expected", k, why, want); \
	} while (0)
	DIFF("dim", dim, 5);
	DIFF("scale", init_value, 0.5f);
	DIFF("lr", lr, a.lr * 2);
	DIFF("eps", eps, a.eps * 2);
	DIFF("beta1", beta1, 0.5f);
	DIFF("beta2", beta2, 0.75f);
	DIFF("initial_accumulator", initial_accumulator, a.initial_accumulator + 1);
	DIFF("l1", l1, a.l1 + 1);
	DIFF("l2", l2, a.l2 + 1);
	DIFF("ftrl_beta", ftrl_beta, a.ftrl_beta + 1);
	DIFF("admission", admission, a.admission + 2);
	DIFF("ttl", ttl_s, a.ttl_s + 60);
	DIFF("max_rows", max_rows, a.max_rows + 1000);
	DIFF("filter_ids", filter_ids, a.filter_ids + 1000);
	a.init = PS_INIT_CONST; /* its init_value is the value */
	DIFF("value", init_value, 0.5f);
	a.init = PS_INIT_UNIFORM;
#undef DIFF
	/* the names of init and optimizer, not their numbers */
	b = a;
	b.init = PS_INIT_CONST;
	snprintf(want, sizeof(want), "table 'e': init differs: uniform here, const there");
	ck_assert_msg(ps_table_decl_diff(&a, &b, "here", "there", why, sizeof(why)) == 1 &&
		      strcmp(why, want) == 0, "init: '%s', '%s' expected", why, want);
	b = a;
	b.optimizer = PS_ROPT_ADAM;
	snprintf(want, sizeof(want), "table 'e': optimizer differs: sgd here, adam there");
	ck_assert_msg(ps_table_decl_diff(&a, &b, "here", "there", why, sizeof(why)) == 1 &&
		      strcmp(why, want) == 0, "optimizer: '%s', '%s' expected", why, want);
	b = a;
	snprintf(b.name, sizeof(b.name), "f");
	ck_assert_int_eq(ps_table_decl_diff(&a, &b, "here", "there", why, sizeof(why)), 1);
	ck_assert_str_eq(why, "table name differs: 'e' here, 'f' there");
}
END_TEST

/* ps_table_decl_check, which the client and the shard run on every
 * declared table: each numeric key one step past each of its bounds
 * alone is refused naming the key and the value; a const value past its
 * bounds is the value's fault, a zeros table with a value is said to be
 * one (whatever the value); a scale past its bounds, an init or optimizer
 * past its list, a name of 0 or 64 bytes, ftrl on rows that do not start
 * at 0 and ctr fields each have their words. No shard: the function. */
START_TEST(test_decl_check_every_bound)
{
	struct ps_table_cfg a, b;
	char why[300];

	ps_table_decl_defaults(&a);
	snprintf(a.name, sizeof(a.name), "e");
	a.dim = 4;
	ck_assert_msg(ps_table_decl_check(&a, why, sizeof(why)) == 0, "%s", why);
#define BAD(field, v, text)                                                                \
	do {                                                                               \
		b = a;                                                                     \
		b.field = v;                                                               \
		why[0] = 0;                                                                \
		ck_assert_msg(ps_table_decl_check(&b, why, sizeof(why)) == PS_ECONFIG &&   \
			      strncmp(why, text, strlen(text)) == 0, #field " = " #v ": '%s', '%s' " \
			      "expected", why, text);                                      \
	} while (0)
	BAD(dim, 0, "table 'e': dim is 0, expected");
	BAD(dim, PS_MAX_ROW_DIM + 1, "table 'e': dim is 4097, expected");
	BAD(lr, 0.0f, "table 'e': lr is 0, expected");
	BAD(lr, 2e6f, "table 'e': lr is 2e+06, expected");
	BAD(eps, 0.0f, "table 'e': eps is 0, expected");
	BAD(eps, 2.0f, "table 'e': eps is 2, expected");
	BAD(beta1, -0.5f, "table 'e': beta1 is -0.5, expected");
	BAD(beta1, 1.0f, "table 'e': beta1 is 1, expected");
	BAD(beta2, -0.5f, "table 'e': beta2 is -0.5, expected");
	BAD(beta2, 1.0f, "table 'e': beta2 is 1, expected");
	BAD(initial_accumulator, -1.0f, "table 'e': initial_accumulator is -1, expected");
	BAD(initial_accumulator, 2e6f, "table 'e': initial_accumulator is 2e+06, expected");
	BAD(l1, -1.0f, "table 'e': l1 is -1, expected");
	BAD(l1, 2e6f, "table 'e': l1 is 2e+06, expected");
	BAD(l2, -1.0f, "table 'e': l2 is -1, expected");
	BAD(l2, 2e6f, "table 'e': l2 is 2e+06, expected");
	BAD(ftrl_beta, -1.0f, "table 'e': ftrl_beta is -1, expected");
	BAD(ftrl_beta, 2e6f, "table 'e': ftrl_beta is 2e+06, expected");
	BAD(admission, -1, "table 'e': admission is -1, expected");
	BAD(admission, 256, "table 'e': admission is 256, expected");
	BAD(ttl_s, -1, "table 'e': ttl is -1, expected");
	BAD(ttl_s, (1 << 30) + 1, "table 'e': ttl is 1.07374e+09, expected");
	BAD(max_rows, -1, "table 'e': max_rows is -1, expected");
	BAD(max_rows, (1ll << 40) + 1, "table 'e': max_rows is 1.09951e+12, expected");
	BAD(filter_ids, 1023, "table 'e': filter_ids is 1023, expected");
	BAD(filter_ids, (1ll << 32) + 1, "table 'e': filter_ids is 4.29497e+09, expected");
	BAD(init, (enum ps_init_kind)7, "table 'e': init 7, expected zeros, const, uniform or normal");
	BAD(init, PS_INIT_ARANGE, "table 'e': init 4, expected zeros, const, uniform or normal");
	BAD(optimizer, 9, "table 'e': optimizer 9, expected sgd, adagrad, rowwise_adagrad");
	BAD(optimizer, -1, "table 'e': optimizer -1, expected sgd, adagrad, rowwise_adagrad");
	BAD(fields, 1, "table 'e': fields are for model.embeddings of the ctr preset");
	BAD(name[0], 0, "table name of 0 bytes, expected 1..63");
	memset(b.name, 'n', sizeof(b.name));
	ck_assert_int_eq(ps_table_decl_check(&b, why, sizeof(why)), PS_ECONFIG);
	ck_assert_str_eq(why, "table name of 64 bytes, expected 1..63");
	/* the value or scale as the init reads it */
	a.init = PS_INIT_CONST;
	BAD(init_value, 2e30f, "table 'e': value is 2e+30, expected");
	BAD(init_value, -2e30f, "table 'e': value is -2e+30, expected");
	a.init = PS_INIT_ZEROS;
	a.init_value = 0.0f;
	BAD(init_value, 2e30f, "table 'e': init zeros with a value of 2e+30");
	BAD(init_value, 0.5f, "table 'e': init zeros with a value of 0.5");
	b = a;
	b.optimizer = PS_ROPT_FTRL;
	ck_assert_msg(ps_table_decl_check(&b, why, sizeof(why)) == 0, "ftrl on zeros: %s", why);
	for (int init = PS_INIT_UNIFORM; init <= PS_INIT_NORMAL; init++) {
		a.init = (enum ps_init_kind)init;
		a.init_value = 0.05f;
		BAD(init_value, 2e6f, "table 'e': scale is 2e+06, expected");
		BAD(init_value, -1.0f, "table 'e': scale is -1, expected");
		BAD(optimizer, PS_ROPT_FTRL, "table 'e': optimizer ftrl derives the weights from "
		    "its state and starts them at 0; expected init zeros, got ");
	}
#undef BAD
}
END_TEST

START_TEST(test_decl_tables_train)
{
	struct ps_client *c0, *c1;
	const struct ps_config *cc;
	float out[5];
	uint64_t one = 1000003u;

	start();
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	decl_init();
	/* before the declaration the tables are unknown */
	ck_assert_int_eq(ps_client_pull_rows(c0, "emb_a", 0, &one, 1, out), PS_ENOTENSOR);
	declare_both(c0, c1);
	cc = ps_client_config(c1);
	ck_assert_int_eq(ps_config_ntables(cc), 1 + NT);
	ck_assert_str_eq(ps_config_table_name(cc, 0), "yaml_t");
	ck_assert_str_eq(ps_config_table_name(cc, 2), "emb_b");
	ck_assert_int_eq(ps_config_table_dim(cc, 3), 5);
	ck_assert_int_eq(ps_config_ntables(&cfg), 1); /* the caller's config is untouched */
	ck_assert_int_eq(ps_client_declare_tables(c0, decl, NT), PS_ESTATE);
	/* emb_c starts at uniform(0.01) values: small, not zero */
	ck_assert_int_eq(ps_client_pull_rows(c0, "emb_c", 0, &one, 1, out), 0);
	ck_assert_msg(out[0] != 0.0f && fabsf(out[0]) <= 0.01f, "emb_c init %g", out[0]);
	for (uint64_t k = 0; k < 3; k++)
		clock_step(c0, c1, k);
	check_rows(c0, 3, "rank 0 after 3 clocks");
	check_rows(c1, 3, "rank 1 after 3 clocks");
	/* emb_c moved (rowwise adagrad: about lr per step against the sign) */
	ck_assert_int_eq(ps_client_pull_rows(c1, "emb_c", 3, &one, 1, out), 0);
	ck_assert_msg(fabsf(out[0]) > 0.005f && fabsf(out[0]) < 0.05f, "emb_c %g", out[0]);
	/* the shards count the declared tables' rows like a YAML table's */
	struct ps_shard_stats st;
	uint64_t rows = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c0, k, &st), 0);
		ck_assert_int_eq(st.ntables, 1 + NT);
		for (int t = 0; t < st.ntables; t++)
			if (!strcmp(st.tables[t].name, "emb_a"))
				rows += st.tables[t].rows;
	}
	ck_assert_uint_eq(rows, NIDS);

	/* rank 1 restarted: re-declares, is acked, goes on */
	ps_client_free(c1);
	c1 = connect_retry(1);
	ck_assert_msg(ps_client_declare_tables(c1, decl, NT) == 0, "%s", ps_client_error(c1));
	clock_step(c0, c1, 3);
	check_rows(c1, 4, "restarted rank 1 after clock 3");
	ps_client_free(c0);
	ps_client_free(c1);
	stop();
}
END_TEST

/* The digest of the declared tables (Stats decl_digest, which a re-shard's
 * stop compares among the shards: ps-stat --reshard-stop) follows what
 * each table is, not only how many there are: one table declared, in a
 * fresh cluster each time, as emb_a of dim 4, of dim 5, as emb_z, with
 * adagrad, with admission 2 gives five digests that differ, and both
 * shards agree on each. */
START_TEST(test_decl_digest_follows_tables)
{
	const struct ps_table_decl v[5] = {
		{ .name = "emb_a", .dim = 4 }, { .name = "emb_a", .dim = 5 },
		{ .name = "emb_z", .dim = 4 }, { .name = "emb_a", .dim = 4, .optimizer = "adagrad" },
		{ .name = "emb_a", .dim = 4, .admission = 2 } };
	uint64_t d[5];

	for (int i = 0; i < 5; i++) {
		struct ps_shard_stats st[2];
		struct ps_client *c;

		start();
		c = connect_retry(0);
		ck_assert_msg(ps_client_declare_tables(c, &v[i], 1) == 0, "%d: %s", i,
			      ps_client_error(c));
		for (int k = 0; k < 2; k++)
			ck_assert_msg(ps_client_stats(c, k, &st[k]) == 0, "%s", ps_client_error(c));
		ck_assert_msg(st[0].decl_tables == 1 && st[0].decl_digest &&
			      st[0].decl_digest == st[1].decl_digest, "%d: shard 0 %d tables "
			      "(%016" PRIx64 "), shard 1 %d (%016" PRIx64 ")", i, st[0].decl_tables,
			      st[0].decl_digest, st[1].decl_tables, st[1].decl_digest);
		d[i] = st[0].decl_digest;
		for (int j = 0; j < i; j++)
			ck_assert_msg(d[j] != d[i], "declarations %d and %d: the same digest %016"
				      PRIx64, j, i, d[i]);
		ps_client_free(c);
		stop();
	}
}
END_TEST

START_TEST(test_decl_tables_refused)
{
	struct ps_client *c0, *c1;
	struct ps_table_decl bad[PS_MAX_TABLES];
	const char *e;

	start();
	c0 = connect_retry(0);
	decl_init();
	ck_assert_msg(ps_client_declare_tables(c0, decl, NT) == 0, "%s", ps_client_error(c0));

	/* a differing declaration: the table, the field and both values */
	c1 = connect_retry(1);
	decl[1].lr = 0.25f;
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	e = ps_client_error(c1);
	ck_assert_msg(strstr(e, "table 'emb_b': lr differs: 0.5 on the shard, 0.25 in this "
			     "declaration"), "%s", e);
	ps_client_free(c1);
	decl_init();
	c1 = connect_retry(1);
	decl[0].optimizer = "adam";
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	e = ps_client_error(c1);
	ck_assert_msg(strstr(e, "table 'emb_a': optimizer differs: sgd on the shard, adam in "
			     "this declaration"), "%s", e);
	ps_client_free(c1);
	decl_init();
	c1 = connect_retry(1);
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT - 1), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "3 declared tables, this declaration names 2"),
		      "%s", ps_client_error(c1));
	ps_client_free(c1);

	/* bad declarations, refused by the client before sending */
	c1 = connect_retry(1);
	decl_init();
	decl[0].dim = 0;
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "table 'emb_a': dim is 0"), "%s",
		      ps_client_error(c1));
	decl_init();
	decl[1].optimizer = "rmsprop";
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "optimizer 'rmsprop'"), "%s",
		      ps_client_error(c1));
	/* dim at the bound, 4096, is not what is refused (the unknown
	 * optimizer after it is); one past it is, by the client */
	decl_init();
	decl[0].dim = PS_MAX_ROW_DIM;
	decl[0].optimizer = "rmsprop";
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "optimizer 'rmsprop'"), "%s",
		      ps_client_error(c1));
	decl_init();
	decl[0].dim = PS_MAX_ROW_DIM + 1;
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(!strncmp(ps_client_error(c1), "table 'emb_a': dim is 4097, expected an "
			       "integer in 1..4096", 58), "%s", ps_client_error(c1));
	decl_init();
	decl[2].name = "yaml_t";
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "'yaml_t' is a table of"), "%s",
		      ps_client_error(c1));
	decl_init();
	decl[2].optimizer = "ftrl"; /* ftrl needs init zeros, as in YAML */
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "expected init zeros"), "%s",
		      ps_client_error(c1));
	decl_init();
	decl[0].init_value = 0.5f; /* emb_a's init is zeros: a value would be ignored */
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "table 'emb_a': init_value 0.5 is not used by "
			     "init zeros"), "%s", ps_client_error(c1));
	decl_init();
	decl[0].beta1 = 1.0f; /* model.embeddings: beta1 in [0, 1) */
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c1), "beta1 is 1, expected a number in [0, 1)"), "%s",
		      ps_client_error(c1));
	/* the client's bounds of admission, ttl and max_rows (model.embeddings'
	 * own): exactly at each, the declaration is sent, and the shard refuses
	 * it as differing from rank 0's; one past, the client refuses it before
	 * sending, the whole reason */
	for (int k = 0; k < 3; k++)
		for (int past = 0; past < 2; past++) {
			static const char *const key[] = { "admission", "ttl", "max_rows" };
			const uint64_t at[] = { 255, 1u << 30, UINT64_C(1) << 40 };
			char want[300];
			decl_init();
			if (k == 0)
				decl[0].admission = (uint32_t)(at[k] + (uint64_t)past);
			else if (k == 1)
				decl[0].ttl_s = at[k] + (uint64_t)past;
			else
				decl[0].max_rows = at[k] + (uint64_t)past;
			ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ECONFIG);
			if (past)
				snprintf(want, sizeof(want), "table 'emb_a': admission %u (0..255), ttl "
					 "%llu s (0..%u) or max_rows %llu (0..2^40) out of range",
					 decl[0].admission, (unsigned long long)decl[0].ttl_s, 1u << 30,
					 (unsigned long long)decl[0].max_rows);
			else
				snprintf(want, sizeof(want), "table 'emb_a': %s differs: 0 on the shard, "
					 "%.9g in this declaration", key[k], (double)at[k]);
			ck_assert_msg(past ? strcmp(ps_client_error(c1), want) == 0
				      : strstr(ps_client_error(c1), want) != NULL,
				      "%s %s the limit: '%s', '%s' expected", key[k], past ? "past" : "at",
				      ps_client_error(c1), want);
		}
	char names[PS_MAX_TABLES][16];
	for (int i = 0; i < PS_MAX_TABLES; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		bad[i] = (struct ps_table_decl){ .name = names[i], .dim = 1 };
	}
	ck_assert_int_eq(ps_client_declare_tables(c1, bad, PS_MAX_TABLES), PS_ETOOBIG);
	ck_assert_msg(strstr(ps_client_error(c1), "expected 1..63"), "%s", ps_client_error(c1));
	ck_assert_int_eq(ps_client_declare_tables(c1, bad, 0), PS_ETOOBIG);
	decl_init();
	ck_assert_msg(ps_client_declare_tables(c1, decl, NT) == 0, "%s", ps_client_error(c1));
	ps_client_free(c1);

	/* a monitor may not declare */
	c1 = connect_retry(-1);
	ck_assert_int_eq(ps_client_declare_tables(c1, decl, NT), PS_ESTATE);
	ps_client_free(c1);
	ps_client_free(c0);
	stop();
}
END_TEST

/* Sends def (n tables) to shard 0 as a raw DeclareTables, past the
 * client's checks: the shard's answer. */
static int raw_declare(struct ps_client *c, const struct ps_table_cfg *def, int n)
{
	Ps__DeclareTables m = PS__DECLARE_TABLES__INIT;
	Ps__TableDef d[PS_MAX_TABLES + 1], *p[PS_MAX_TABLES + 1];
	struct req *r = ps__client_req_new(c, REQ_DECLARE_TABLES);

	for (int i = 0; i < n; i++) {
		ps_table_decl_to_msg(&def[i], &d[i]);
		p[i] = &d[i];
	}
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_tables = (size_t)n;
	m.tables = p;
	ck_assert_int_eq(ps__client_pack_part(&r->parts[0], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_int_gt(id, 0);
	return ps_client_wait(c, id);
}

START_TEST(test_decl_tables_hostile)
{
	static struct ps_table_cfg def[PS_MAX_TABLES + 1];
	struct ps_client *c0;

	start();
	c0 = connect_retry(0);
	for (int i = 0; i < PS_MAX_TABLES + 1; i++) {
		ps_table_decl_defaults(&def[i]);
		snprintf(def[i].name, sizeof(def[i].name), "h%d", i);
		def[i].dim = 2;
	}
	/* the shard checks what the client would have: dim 0, a huge dim,
	 * an optimizer out of range, a YAML table's name, twice the same
	 * name, too many tables */
	def[0].dim = 0;
	ck_assert_int_eq(raw_declare(c0, def, 1), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c0), "dim"), "%s", ps_client_error(c0));
	def[0].dim = 1 << 20;
	ck_assert_int_eq(raw_declare(c0, def, 1), PS_ECONFIG);
	def[0].dim = 2;
	def[0].optimizer = 99;
	ck_assert_int_eq(raw_declare(c0, def, 1), PS_ECONFIG);
	def[0].optimizer = PS_ROPT_SGD;
	snprintf(def[0].name, sizeof(def[0].name), "yaml_t");
	ck_assert_int_eq(raw_declare(c0, def, 1), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c0), "table of the config"), "%s",
		      ps_client_error(c0));
	snprintf(def[0].name, sizeof(def[0].name), "h1");
	ck_assert_int_eq(raw_declare(c0, def, 2), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c0), "declared twice"), "%s", ps_client_error(c0));
	snprintf(def[0].name, sizeof(def[0].name), "h0");
	ck_assert_int_eq(raw_declare(c0, def, PS_MAX_TABLES), PS_ETOOBIG);
	ck_assert_int_eq(raw_declare(c0, def, 0), PS_ETOOBIG);
	/* a monitor may not declare */
	struct ps_client *mon;
	char err[256];
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(raw_declare(mon, def, 1), PS_EAUTH);
	ck_assert_msg(strstr(ps_client_error(mon), "only a worker may declare tables, not a "
			     "monitor"), "%s", ps_client_error(mon));
	ps_client_free(mon);
	/* nothing was created: a good declaration is still rank 0's first */
	decl_init();
	ck_assert_msg(ps_client_declare_tables(c0, decl, NT) == 0, "%s", ps_client_error(c0));
	ps_client_free(c0);
	stop();
}
END_TEST

/* Rank 1 connects, declares the tables again and finds the rows of
 * `clocks` clocks in them. */
static void rank1_rows(uint64_t clocks, const char *what)
{
	struct ps_client *c = connect_retry(1);

	ck_assert_msg(ps_client_declare_tables(c, decl, NT) == 0, "rank 1: %s", ps_client_error(c));
	check_rows(c, clocks, what);
	ps_client_free(c);
}

START_TEST(test_decl_tables_shard_restart)
{
	struct ps_client *c0, *c1;
	struct ps_shard_stats st;
	char ck[128];
	struct stat sb;

	start();
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	decl_init();
	declare_both(c0, c1);
	for (uint64_t k = 0; k < 2; k++)
		clock_step(c0, c1, k);
	check_rows(c0, 2, "after 2 clocks");
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
	/* rank 1 first: the shards must have the tables without rank 0 */
	c1 = connect_retry(1);
	ck_assert_msg(ps_client_declare_tables(c1, decl, NT) == 0, "rank 1: %s",
		      ps_client_error(c1));
	check_rows(c1, 2, "rank 1 after shard 1's restart");
	/* and the restarted shard still refuses other tables */
	c0 = connect_retry(0);
	decl[2].dim = 6;
	ck_assert_int_eq(ps_client_declare_tables(c0, decl, NT), PS_ECONFIG);
	ck_assert_msg(strstr(ps_client_error(c0), "table 'emb_c': dim differs: 5 on the shard, 6"),
		      "%s", ps_client_error(c0));
	ps_client_free(c0);
	c0 = connect_retry(0);
	decl_init();
	ck_assert_msg(ps_client_declare_tables(c0, decl, NT) == 0, "%s", ps_client_error(c0));
	clock_step(c0, c1, 2);
	check_rows(c0, 3, "rank 0 after clock 2");
	ps_client_free(c0);
	ps_client_free(c1);

	/* the whole cluster stopped (checkpoints at SIGTERM) and started again */
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	rank1_rows(3, "rank 1 after the cluster's restart");

	/* a table of the config now with a declared table's name: the shard
	 * refuses its checkpoint, naming both; the config put back, it starts */
	char log[160];
	size_t n;
	char *yaml = (char *)tu_slurp(path, &n);
	ck_assert_ptr_nonnull(yaml);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	char *e = strstr(yaml, "lr: 1}\n");
	ck_assert_ptr_nonnull(e);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%.*s    - {name: emb_b, dim: 3}\n%s", (int)(e + 7 - yaml), yaml, e + 7);
	fclose(f);
	snprintf(log, sizeof(log), "%s/emb_b.log", dir);
	pid_t p = tu_start_server_log(path, 0, log);
	ck_assert_int_ne(tu_wait_exit_s(p, 10), 0);
	char want[300];
	snprintf(want, sizeof(want), "%s/shard-0.ckpt: declared table 'emb_b' is now a table of "
		 "the config (model.embeddings)", dir);
	ck_assert_msg(tu_log_says(log, want), "'%s' not in %s", want, log);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);
	free(yaml);
	srv[0] = tu_start_server(path, 0);
	rank1_rows(3, "rank 1 with the config put back");
	stop();
}
END_TEST

/* Tables declared after a full checkpoint reach an incremental one (a
 * version 3 file after a version 1 one): both shards killed and restarted
 * have them and their rows. */
START_TEST(test_decl_tables_incremental)
{
	struct ps_client *c0, *c1;
	struct ps_shard_stats st;
	char ck[128];
	struct stat sb;

	start_with("  incremental: 3\n");
	c0 = connect_retry(0);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_checkpoint(c0, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: %s", k, st.checkpoint_error);
	}
	c1 = connect_retry(1);
	decl_init();
	declare_both(c0, c1);
	for (uint64_t k = 0; k < 2; k++)
		clock_step(c0, c1, k);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_checkpoint(c0, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: %s", k, st.checkpoint_error);
		snprintf(ck, sizeof(ck), "%s/shard-%d.ckpt.delta-1", dir, k);
		ck_assert_msg(stat(ck, &sb) == 0, "%s: no incremental checkpoint", ck);
	}
	ps_client_free(c0);
	ps_client_free(c1);
	for (int k = 0; k < 2; k++) {
		kill(srv[k], SIGKILL);
		ck_assert_int_eq(tu_wait_child(srv[k]), 128 + SIGKILL);
		srv[k] = tu_start_server(path, k);
	}
	c1 = connect_retry(1);
	ck_assert_msg(ps_client_declare_tables(c1, decl, NT) == 0, "rank 1: %s",
		      ps_client_error(c1));
	check_rows(c1, 2, "rank 1 after the restart from the incremental checkpoint");
	ps_client_free(c1);
	stop();
}
END_TEST

struct dense_declarer {
	struct ps_client *c;
	struct ps_param *p;
	int rc;
};

static void *dense_thread(void *arg)
{
	static const struct ps_optim_group g = { .kind = "sgd", .lr = 0.5f };
	static const int group_of[1] = { 0 };
	struct dense_declarer *d = arg;

	d->rc = ps_client_declare_groups(d->c, d->p, 1, &g, 1, group_of);
	return NULL;
}

/* Declared tensors with optimizer groups and declared tables in one
 * checkpoint (version 4): a shard killed and restarted has both back. */
START_TEST(test_decl_tables_with_groups_restart)
{
	static const int64_t dw[] = { 6 };
	float w0[6], w1[6];
	struct ps_param p0 = { "w", 1, dw, w0 }, p1 = { "w", 1, dw, w1 };
	struct ps_client *c0, *c1;
	struct ps_shard_stats st;
	pthread_t th;

	start();
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	for (int i = 0; i < 6; i++) {
		w0[i] = (float)i;
		w1[i] = 100.0f;
	}
	struct dense_declarer d1 = { c1, &p1, -1 };
	ck_assert_int_eq(pthread_create(&th, NULL, dense_thread, &d1), 0);
	struct dense_declarer d0 = { c0, &p0, -1 };
	dense_thread(&d0);
	pthread_join(th, NULL);
	ck_assert_msg(d0.rc == 0 && d1.rc == 0, "%s / %s", ps_client_error(c0),
		      ps_client_error(c1));
	ck_assert(w1[5] == 5.0f);
	decl_init();
	declare_both(c0, c1);
	for (uint64_t k = 0; k < 2; k++)
		clock_step(c0, c1, k);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_checkpoint(c0, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: %s", k, st.checkpoint_error);
	}
	ps_client_free(c0);
	ps_client_free(c1);
	for (int k = 0; k < 2; k++) {
		kill(srv[k], SIGKILL);
		ck_assert_int_eq(tu_wait_child(srv[k]), 128 + SIGKILL);
		srv[k] = tu_start_server(path, k);
	}
	/* rank 1 alone: tensors, groups and tables all came back */
	c1 = connect_retry(1);
	for (int i = 0; i < 6; i++)
		w1[i] = 100.0f;
	d1 = (struct dense_declarer){ c1, &p1, -1 };
	dense_thread(&d1);
	ck_assert_msg(d1.rc == 0, "rank 1 tensors: %s", ps_client_error(c1));
	for (int i = 0; i < 6; i++)
		ck_assert_msg(w1[i] == (float)i, "w[%d] = %g", i, w1[i]);
	ck_assert_msg(ps_client_declare_tables(c1, decl, NT) == 0, "rank 1 tables: %s",
		      ps_client_error(c1));
	check_rows(c1, 2, "rank 1 after the restart");
	ps_client_free(c1);
	stop();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("decl_tables");
	TCase *tc = tcase_create("decl_tables");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_decl_diff_every_key);
	TU_ADD(tc, test_decl_check_every_bound);
	TU_ADD(tc, test_decl_tables_train);
	TU_ADD(tc, test_decl_digest_follows_tables);
	TU_ADD(tc, test_decl_tables_refused);
	TU_ADD(tc, test_decl_tables_hostile);
	TU_ADD(tc, test_decl_tables_shard_restart);
	TU_ADD(tc, test_decl_tables_incremental);
	TU_ADD(tc, test_decl_tables_with_groups_restart);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
